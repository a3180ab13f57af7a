// How fast the decode kernels stream weights from memory, beside how fast the
// machine reads: one-token matmuls over a set of matrices far larger than the
// caches (on huge pages, as the model's weights are), every thread taking its
// share of each matrix's rows as a decode step does, against a plain read of
// the same bytes in the same run.
//
// Why: a decode step is bound by memory, and the share of the floor the
// engine reaches is the kernels' streaming rate over the machine's read rate
// plus what the step does between matmuls. This separates the two: the
// kernels' rate here is the best a step made of them can do.
//
//   decode_stream_bench [threads] [MiB per case] [passes] [name filter]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "core/aligned_bytes.h"
#include "core/thread_pool.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/kquant_pack.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/packed.h"
#include "kernels/cpu/quants.h"
#include "read_stream.h"

using namespace inferd;
using namespace inferd::kernels;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// One matrix's bytes quantized once from normal values, copied to fill the
// set (the values do not change the time).
std::vector<uint8_t> random_matrix(DType type, int64_t rows, int64_t cols, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> row(static_cast<size_t>(cols));
  std::vector<uint8_t> w(row_bytes(type, cols) * static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    for (float& f : row) f = dist(rng);
    ref::quantize_row(type, row.data(), w.data() + r * row_bytes(type, cols), cols);
  }
  return w;
}

// The best pass of every thread summing its share of `bytes` the way
// memory_bandwidth does (widest loads, hardware or software prefetch), GB/s.
double read_rate(ThreadPool& pool, const uint8_t* p, size_t bytes, int passes) {
  std::vector<uint64_t> sink(static_cast<size_t>(pool.size()) * 8);
  double best = 0;
  for (int pass = 0; pass < 2 * passes; ++pass) {
    const bench::ReadFn read = bench::read_stream_fn(pass % 2 == 1);
    const double t0 = now_s();
    pool.run([&](int ti, int nt) {
      const auto [b, e] = ThreadPool::split(static_cast<int64_t>(bytes), ti, nt, 256);
      sink[static_cast<size_t>(ti) * 8] = read(p + b, static_cast<size_t>(e - b) / 256 * 256);
    });
    best = std::max(best, bytes / (now_s() - t0) / 1e9);
  }
  return best;
}

struct Case {
  const char* name;
  DType type;
  int64_t rows, cols;
  bool repacked;  // Q4_K in the repacked gemv order (as the model runs it)
};

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  const size_t mib = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1024;
  const int passes = argc > 3 ? std::atoi(argv[3]) : 5;
  const char* filter = argc > 4 ? argv[4] : "";
  if (bench::read_stream_fn(false) == nullptr) {
    std::fprintf(stderr, "decode_stream_bench: needs AVX2 or AVX-512\n");
    return 1;
  }
  ThreadPool pool(threads);
  const KernelTable& table = kernel_table();
  std::printf("threads=%d level=%s, %zu MiB per case, best of %d passes\n", threads, table.level, mib, passes);

  const Case cases[] = {
      {"Q4_K repacked 768x2048 (Qwen3-MoE expert gate/up)", DType::Q4_K, 768, 2048, true},
      {"Q4_K repacked 4096x2048 (Qwen3-MoE attn_q)", DType::Q4_K, 4096, 2048, true},
      {"Q6_K rows 2048x768 (Qwen3-MoE expert down)", DType::Q6_K, 2048, 768, false},
      {"Q6_K rows 8192x2048 (output head slice)", DType::Q6_K, 8192, 2048, false},
  };
  std::mt19937 rng(1);
  for (const Case& c : cases) {
    if (std::strstr(c.name, filter) == nullptr) continue;
    const std::vector<uint8_t> w = random_matrix(c.type, c.rows, c.cols, rng);
    // The set: copies of one matrix (repacked ones in a huge-page arena, as
    // the model's), enough to fill `mib`.
    const size_t matrix_bytes = c.repacked ? PackedArena::space_for(RepackedQ4K::packed_bytes(c.rows, c.cols)) : w.size();
    const size_t n = std::max<size_t>(1, (mib << 20) / matrix_bytes);
    PackedArena arena(c.repacked ? n * matrix_bytes : 64);
    std::vector<RepackedQ4K> repacked;
    AlignedBytes rows_copy(c.repacked ? 1 : n * matrix_bytes, /*huge_pages=*/true, /*zeroed=*/false);
    for (size_t i = 0; i < n; ++i) {
      if (c.repacked) {
        repacked.push_back(RepackedQ4K::pack(w.data(), c.rows, c.cols, &arena));
      } else {
        std::memcpy(rows_copy.data() + i * matrix_bytes, w.data(), matrix_bytes);
      }
    }
    // One token's activations in the kernels' input format.
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(c.cols));
    for (float& f : x) f = dist(rng);
    const TokenPlace place{1, 0};
    std::vector<uint8_t> act(matmul_act_row_bytes(c.type, c.cols));
    matmul_quantize_rows_ggml_with(table, c.type, c.rows, x.data(), c.cols, 0, 1, &place, act.data());
    std::vector<float> y(static_cast<size_t>(c.rows) * threads);

    double best = 0;
    for (int pass = 0; pass < passes; ++pass) {
      const double t0 = now_s();
      pool.run([&](int ti, int nt) {
        // Rows split on 16-row groups, as the engine splits a projection.
        const int64_t groups = c.rows / 16;
        const auto [g0, g1] = ThreadPool::split(groups, ti, nt);
        float* out = y.data() + static_cast<size_t>(ti) * c.rows;
        for (size_t i = 0; i < n; ++i) {
          if (c.repacked) {
            repacked_q4k_rows_with(table, repacked[i], act.data(), 1, &place, out, c.rows, g0 * 16, g1 * 16);
          } else {
            matmul_rows_ggml_with(table, c.type, rows_copy.data() + i * matrix_bytes, c.rows, c.cols, act.data(), 1,
                                  &place, out, g0 * 16, g1 * 16);
          }
        }
      });
      best = std::max(best, n * matrix_bytes / (now_s() - t0) / 1e9);
    }
    const uint8_t* base = c.repacked ? repacked[0].group(0) : rows_copy.data();
    const double read = read_rate(pool, base, n * matrix_bytes, passes);
    std::printf("%-52s %5zu matrices %7.1f MiB  kernel %5.1f GB/s  read %5.1f GB/s  kernel/read %.2f\n", c.name, n,
                n * matrix_bytes / 1048576.0, best, read, best / read);
  }
  return 0;
}
