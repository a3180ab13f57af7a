// One GGML-order projection timed on its own, on the kernels Linear runs for
// it (packed groups for Q4_0/Q4_1/Q5_0/Q8_0, repacked Q4_K where llama.cpp repacks
// it, else matmul_rows_ggml on the GGML rows; INFERD_BENCH_GGML_ROWS=1: the
// GGML rows for every type): a decode-shaped step streams its weights
// from memory (copies of the matrix cycled, so no call finds them in cache)
// and is reported as GB/s of weights; a prefill-shaped step as GFLOP/s.
//
//   ggml_matmul_bench TYPE ROWS COLS TOKENS [threads 2] [seconds 2] [MiB of copies, 0: hot]
//   ggml_matmul_bench Q4_K 8960 1536 1 2 2 512      # Qwen 1.5B ffn_gate, decode, from DRAM
//   ggml_matmul_bench Q4_K 8960 1536 512 2 2 0      # the same, a 512-token prompt
//
// Threads split the rows as the forward pass does (matmul_row_split); the
// tokens are one sequence's chunk (one_chunk), so the order is the one
// llama.cpp's CPU backend takes for that chunk size.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/aligned_bytes.h"
#include "core/thread_pool.h"
#include "kernels/cpu/kernel_table.h"
#if __has_include("kernels/cpu/kquant_pack.h")  // so the bench builds at commits before it too
#include "kernels/cpu/kquant_pack.h"
#define INFERD_BENCH_REPACKED_Q4K 1
#endif
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/packed.h"
#include "kernels/cpu/quants.h"

using namespace inferd;
using namespace inferd::kernels;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool parse_type(const std::string& s, DType* t) {
  for (DType c : {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q2_K, DType::Q3_K,
                  DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::F16, DType::BF16, DType::F32}) {
    if (s == dtype_name(c)) {
      *t = c;
      return true;
    }
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s TYPE ROWS COLS TOKENS [threads] [seconds] [MiB of copies, 0: hot]\n", argv[0]);
    return 2;
  }
  DType type;
  if (!parse_type(argv[1], &type)) {
    std::fprintf(stderr, "unknown type %s\n", argv[1]);
    return 2;
  }
  const int64_t rows = std::atoll(argv[2]), cols = std::atoll(argv[3]), n = std::atoll(argv[4]);
  const int threads = argc > 5 ? std::atoi(argv[5]) : 2;
  const double seconds = argc > 6 ? std::atof(argv[6]) : 2.0;
  const double mib = argc > 7 ? std::atof(argv[7]) : 0.0;

  const size_t wrow = row_bytes(type, cols), wbytes = wrow * static_cast<size_t>(rows);
  const size_t copies = std::max<size_t>(1, static_cast<size_t>(mib * 1048576.0 / static_cast<double>(wbytes)));
  // Huge pages as the packed arena has them; INFERD_BENCH_4K=1 for 4 KiB pages (a mapped file's).
  AlignedBytes w(wbytes * copies, /*huge_pages=*/std::getenv("INFERD_BENCH_4K") == nullptr);
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> wf(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (float& f : wf) f = dist(rng);
    ref::quantize_row(type, wf.data(), w.data() + r * wrow, cols);
  }
  for (size_t c = 1; c < copies; ++c) std::memcpy(w.data() + c * wbytes, w.data(), wbytes);

  std::vector<float> x(static_cast<size_t>(cols * n));
  for (float& f : x) f = dist(rng);
  const std::vector<TokenPlace> places = one_chunk(n);
  std::vector<uint8_t> act(matmul_act_row_bytes(type, cols) * static_cast<size_t>(n));
  std::vector<float> y(static_cast<size_t>(rows * n));
  ThreadPool pool(threads);

  const double q0 = now_s();
  matmul_quantize_rows_ggml(type, rows, x.data(), cols, 0, n, places.data(), act.data());
  const double quantize_s = now_s() - q0;

  // Weights llama.cpp repacks are repacked here too, as Linear does
  // (INFERD_BENCH_GGML_ROWS=1: on their GGML rows instead).
#ifdef INFERD_BENCH_REPACKED_Q4K
  // In a huge-page arena, as the model keeps them.
  std::vector<RepackedQ4K> repacked;
  std::unique_ptr<PackedArena> arena;
  if (RepackedQ4K::applies(type, rows) && std::getenv("INFERD_BENCH_GGML_ROWS") == nullptr) {
    arena = std::make_unique<PackedArena>(PackedArena::space_for(RepackedQ4K::packed_bytes(rows, cols)) * copies);
    for (size_t c = 0; c < copies; ++c) {
      repacked.push_back(RepackedQ4K::pack(w.data() + c * wbytes, rows, cols, arena.get()));
    }
  }
#else
  const std::vector<int> repacked;
#endif
  // Packed (row-interleaved) weights, as Linear keeps Q4_0/Q4_1/Q5_0/Q8_0, with
  // their own activation rows.
  std::vector<PackedMatrix> packed;
  std::unique_ptr<PackedArena> packed_arena;
  PackedActivations packed_act;
  double packed_quantize_s = 0.0;
  if (can_pack(type) && std::getenv("INFERD_BENCH_GGML_ROWS") == nullptr) {
    packed_arena = std::make_unique<PackedArena>(PackedArena::space_for(PackedMatrix::packed_bytes(type, rows, cols)) * copies);
    for (size_t c = 0; c < copies; ++c) packed.push_back(PackedMatrix::pack(type, w.data() + c * wbytes, rows, cols, packed_arena.get()));
    packed_act.resize(n, cols);
    const double p0 = now_s();
    quantize_packed_rows(x.data(), 0, n, packed_act);
    packed_quantize_s = now_s() - p0;
  }
  size_t c = 0;
  auto call = [&] {
    const size_t ci = c++ % copies;
    const uint8_t* wc = w.data() + ci * wbytes;
    pool.run([&](int ti, int nt) {
      if (!packed.empty()) {
        const auto [g0, g1] = ThreadPool::split(packed[ci].groups(), ti, nt);
        packed_matmul_groups(packed[ci], packed_act, g0, g1, y.data(), rows);
        return;
      }
      const auto [r0, r1] = matmul_row_split(rows, ti, nt);
#ifdef INFERD_BENCH_REPACKED_Q4K
      if (!repacked.empty()) {
        repacked_q4k_rows(repacked[ci], act.data(), n, places.data(), y.data(), rows, r0, r1);
        return;
      }
#endif
      matmul_rows_ggml(type, wc, rows, cols, act.data(), n, places.data(), y.data(), r0, r1);
    });
  };
  for (size_t i = 0; i < std::min<size_t>(copies, 4); ++i) call();  // warm-up
  std::vector<double> per;
  const double t_end = now_s() + seconds;
  while (now_s() < t_end || per.size() < 5) {
    const double t0 = now_s();
    call();
    per.push_back(now_s() - t0);
  }
  std::sort(per.begin(), per.end());
  const double med = per[per.size() / 2], best = per.front();
  std::printf("%s%s %lldx%lld N=%lld threads=%d level=%s %s: median %.1f us (best %.1f), %.2f GB/s (best %.2f), "
              "%.1f GFLOP/s; quantize %.1f us; checksum %g\n",
              argv[1], !packed.empty() ? " (packed)" : repacked.empty() ? "" : " (repacked)", static_cast<long long>(rows), static_cast<long long>(cols), static_cast<long long>(n), threads,
              simd_level(), copies > 1 ? "streaming" : "hot", med * 1e6, best * 1e6, wbytes / med / 1e9,
              wbytes / best / 1e9, 2.0 * rows * cols * n / med / 1e9,
              (packed.empty() ? quantize_s : packed_quantize_s) * 1e6, static_cast<double>(y[0] + y[y.size() / 2] + y.back()));
  return 0;
}
