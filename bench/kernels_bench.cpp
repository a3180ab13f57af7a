// Micro-benchmark of the CPU matmul kernels: decode-shaped GEMV (one token,
// reported as GB/s of weights streamed) and prefill-shaped GEMM (many tokens,
// reported as GFLOP/s), at every SIMD level this CPU runs.
//
// The "packed" cases time the row-interleaved kernels the model runs for
// Q4_0/Q4_1/Q5_0/Q8_0/MXFP4 (weights packed once, activations quantized once, one
// thread over every group), as GFLOP/s; the "repacked" ones repacked Q4_K the
// same way, in its gemm order (a prompt chunk) or its gemv order (a batch of
// decoding sequences, "decode" in the name).
//
// The "argmax" cases time greedy sampling's argmax over a row of logits
// (range_max, argmax.h) at every level, beside the two passes it replaced (the
// maximum in 16 lanes, then a scan for its first index).
//
//   kernels_bench [threads] [seconds_per_case] [name filter]
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/argmax.h"
#include "kernels/cpu/fast_gemm.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/kquant_pack.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/packed.h"
#include "kernels/cpu/quants.h"

using namespace inferd;
using namespace inferd::kernels;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// With one thread, CPU time of the process: steadier than wall time on a
// shared machine (INFERD_BENCH_WALL=1 to use wall time anyway).
bool g_cpu_clock = false;
double clock_s() {
  if (!g_cpu_clock) return now_s();
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

// Read bandwidth of one big buffer with every thread summing its slice.
double read_bandwidth_gbs(ThreadPool& pool) {
  const size_t n = size_t{256} << 20 >> 3;  // 256 MiB of uint64
  std::vector<uint64_t> buf(n, 1);
  std::vector<uint64_t> sums(static_cast<size_t>(pool.size()) * 8);
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const double t0 = now_s();
    pool.run([&](int ti, int nt) {
      const auto [b, e] = ThreadPool::split(static_cast<int64_t>(n), ti, nt);
      uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      for (int64_t i = b; i + 4 <= e; i += 4) s0 += buf[i], s1 += buf[i + 1], s2 += buf[i + 2], s3 += buf[i + 3];
      sums[static_cast<size_t>(ti) * 8] = s0 + s1 + s2 + s3;
    });
    best = std::max(best, n * 8.0 / (now_s() - t0) / 1e9);
  }
  return best;
}

struct Case {
  const char* name;
  DType type;
  int64_t rows, cols, n_tokens;
};

}  // namespace

// The argmax range_max replaced: the maximum in 16 independent lanes, then the
// first index holding it, one element at a time.
int64_t two_pass_argmax(const float* x, int64_t n) {
  float lane[16];
  std::fill(lane, lane + 16, -INFINITY);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; ++l) lane[l] = x[i + l] > lane[l] ? x[i + l] : lane[l];
  float mx = -INFINITY;
  for (float v : lane) mx = v > mx ? v : mx;
  for (; i < n; ++i) mx = x[i] > mx ? x[i] : mx;
  for (int64_t j = 0; j < n; ++j)
    if (x[j] == mx) return j;
  return 0;
}

// Greedy argmax over rows of n logits (normal values: the maximum lands
// anywhere), microseconds per row.
void bench_argmax(int64_t n, double seconds, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<float> row(static_cast<size_t>(n));
  for (float& v : row) v = dist(rng);
  std::printf("argmax logits %-7lld", static_cast<long long>(n));
  auto time_it = [&](const char* name, auto&& fn) {
    int64_t iters = 0, sink = 0;
    const double t0 = clock_s();
    double t = t0;
    while (t - t0 < seconds || iters < 3) {
      row[static_cast<size_t>(iters * 7919 % n)] += 0.0f;  // the row changes, as each step's does
      sink += fn();
      ++iters;
      t = clock_s();
    }
    std::printf("  %s %6.2f us", name, (t - t0) / iters * 1e6 + 0.0 * static_cast<double>(sink));
  };
  time_it("two-pass", [&] { return two_pass_argmax(row.data(), n); });
  for (int l = 0; l <= static_cast<int>(best_simd_level()); ++l) {
    const KernelTable table = build_kernel_table(static_cast<SimdLevel>(l));
    time_it(table.level, [&] { return table.ops.range_max(row.data(), n).index; });
  }
  std::printf("\n");
}

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 1;
  const double seconds = argc > 2 ? std::atof(argv[2]) : 0.5;
  ThreadPool pool(threads);
  g_cpu_clock = threads == 1 && std::getenv("INFERD_BENCH_WALL") == nullptr;
  std::printf("threads=%d dispatched level=%s read bandwidth=%.1f GB/s clock=%s\n", threads, simd_level(),
              read_bandwidth_gbs(pool), g_cpu_clock ? "process cpu time" : "wall");

  const Case cases[] = {
      {"smollm2 ffn_up    Q4_1", DType::Q4_1, 1536, 576, 1},
      {"smollm2 output    Q8_0", DType::Q8_0, 49152, 576, 1},
      {"gemma3  output    Q8_0", DType::Q8_0, 262144, 640, 1},
      {"gemma3  ffn_gate  Q5_0", DType::Q5_0, 2048, 640, 1},
      {"gemma3  attn_out  Q4_K", DType::Q4_K, 640, 1024, 1},
      {"gemma3  ffn_down  Q6_K", DType::Q6_K, 640, 2048, 1},
      {"big     GEMV      Q4_1", DType::Q4_1, 32768, 2048, 1},
      {"big     GEMV      Q4_K", DType::Q4_K, 32768, 2048, 1},
      {"big     GEMV      F16 ", DType::F16, 8192, 2048, 1},
      {"big     GEMV      Q6_K", DType::Q6_K, 32768, 2048, 1},
      {"repacked big GEMV Q4_K decode", DType::Q4_K, 32768, 2048, 1},
      // Matrices that stay in one core's 2 MiB L2: the kernels' own speed, without memory's.
      {"repacked L2 GEMV Q4_K decode", DType::Q4_K, 1024, 2048, 1},
      {"L2 GEMV Q6_K", DType::Q6_K, 1024, 2048, 1},
      {"ggml L2 rows Q6_K decode", DType::Q6_K, 256, 2048, 1},
      {"repacked L2small GEMV Q4_K decode", DType::Q4_K, 256, 2048, 1},
      {"L2 GEMV Q4_K", DType::Q4_K, 1024, 2048, 1},
      {"packed L2 Q8_0 (GB/s = GFLOP/s x 0.53)", DType::Q8_0, 512, 2048, 1},
      {"packed L2 MXFP4 (GB/s = GFLOP/s x 0.27)", DType::MXFP4, 1024, 2048, 1},
      {"prefill ffn_up    Q4_1", DType::Q4_1, 1536, 576, 64},
      {"prefill ffn_gate  Q5_0", DType::Q5_0, 2048, 640, 64},
      {"prefill attn_out  Q4_K", DType::Q4_K, 640, 1024, 64},
      {"prefill ffn_down  Q6_K", DType::Q6_K, 640, 2048, 64},
      {"prefill output    Q8_0", DType::Q8_0, 8192, 576, 64},
      {"repacked qwen15 ffn_up Q4_K", DType::Q4_K, 8960, 1536, 64},
      {"repacked qwen15 ffn_up Q4_K decode", DType::Q4_K, 8960, 1536, 16},
      {"repacked qwen15 ffn_up Q4_K decode", DType::Q4_K, 8960, 1536, 8},
      {"repacked qwen15 ffn_up Q4_K decode", DType::Q4_K, 8960, 1536, 6},
      {"repacked qwen15 ffn_up Q4_K decode", DType::Q4_K, 8960, 1536, 5},
      {"packed qwen ffn_up Q5_0", DType::Q5_0, 4864, 896, 64},
      {"packed qwen ffn_up Q5_0", DType::Q5_0, 4864, 896, 16},
      {"packed qwen ffn_up Q5_0", DType::Q5_0, 4864, 896, 1},
      {"packed qwen attn_v Q8_0", DType::Q8_0, 896, 896, 64},
      {"packed qwen attn_v Q8_0", DType::Q8_0, 896, 896, 1},
      {"packed smol ffn_up Q4_1", DType::Q4_1, 1536, 576, 64},
      {"ggml qwen15 output Q6_K decode", DType::Q6_K, 16384, 1536, 16},
      // gpt-oss's experts are MXFP4 of 2880 columns; against Q4_0 of the same shape (17 vs 18 bytes
      // per 32 weights), in llama.cpp's repacked order (rows % 8 == 0) and its vec_dot order.
      {"packed big MXFP4", DType::MXFP4, 16384, 2880, 1},
      {"packed big Q4_0 ", DType::Q4_0, 16384, 2880, 1},
      {"packed big MXFP4 rows%8", DType::MXFP4, 16380, 2880, 1},
      {"packed big Q4_0  rows%8", DType::Q4_0, 16380, 2880, 1},
      {"packed gptoss expert MXFP4", DType::MXFP4, 2880, 2880, 4},
      {"packed gptoss expert Q4_0 ", DType::Q4_0, 2880, 2880, 4},
      {"packed gptoss expert MXFP4", DType::MXFP4, 2880, 2880, 64},
      {"packed gptoss expert Q4_0 ", DType::Q4_0, 2880, 2880, 64},
      // The fast numerics tier (fast_gemm.h): a prompt's products, activations quantized once (their
      // quantization timed apart, as "quant"), GOPS = GFLOP/s of the integer products.
      {"fast smol ffn_up   Q4_1", DType::Q4_1, 1536, 576, 512},
      {"fast smol ffn_down Q4_1", DType::Q4_1, 576, 1536, 512},
      {"fast qwen ffn_up   Q5_0", DType::Q5_0, 4864, 896, 512},
      {"fast qwen ffn_down Q4_K", DType::Q4_K, 896, 4864, 512},
      {"fast qwen ffn_down Q6_K", DType::Q6_K, 896, 4864, 512},
      {"fast qwen attn_v   Q8_0", DType::Q8_0, 128, 896, 512},
      {"fast smol ffn_up   Q4_1", DType::Q4_1, 1536, 576, 1},
      // Its decode: one token against matrices far past the caches, GB/s of the fast layout's bytes
      // (beside "repacked big GEMV Q4_K decode" and "big GEMV Q6_K", the exact tier's).
      {"fast big GEMV Q4_K", DType::Q4_K, 32768, 2048, 1},
      {"fast big GEMV Q6_K", DType::Q6_K, 32768, 2048, 1},
      {"fast L2 GEMV Q4_K", DType::Q4_K, 256, 2048, 1},
      {"fast L2 GEMV Q6_K", DType::Q6_K, 256, 2048, 1},
  };
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const char* filter = argc > 3 ? argv[3] : "";
  for (const Case& c : cases) {
    if (std::strstr(c.name, filter) == nullptr) continue;
    std::vector<float> wf(static_cast<size_t>(c.cols));
    std::vector<uint8_t> w(row_bytes(c.type, c.cols) * static_cast<size_t>(c.rows));
    for (int64_t r = 0; r < c.rows; ++r) {
      for (float& f : wf) f = dist(rng);
      ref::quantize_row(c.type, wf.data(), w.data() + r * row_bytes(c.type, c.cols), c.cols);
    }
    std::vector<float> x(static_cast<size_t>(c.cols * c.n_tokens));
    for (float& f : x) f = dist(rng);
    std::vector<float> y(static_cast<size_t>(c.rows * c.n_tokens));
    std::printf("%s %6lldx%-5lld tokens=%-3lld", c.name, static_cast<long long>(c.rows),
                static_cast<long long>(c.cols), static_cast<long long>(c.n_tokens));
    const bool packed = std::strncmp(c.name, "packed", 6) == 0;
    const bool fast = std::strncmp(c.name, "fast", 4) == 0;
    FastMatrix fw;
    FastActivations fa;
    if (fast) {
      fw = FastMatrix::pack(c.type, w.data(), c.rows, c.cols);
    }
    const bool repacked = std::strncmp(c.name, "repacked", 8) == 0;
    const bool ggml_rows = std::strncmp(c.name, "ggml", 4) == 0;  // GGML rows in GGML's orders (matmul.h)
    RepackedQ4K rw;
    std::vector<TokenPlace> places = one_chunk(c.n_tokens);
    std::vector<uint8_t> ract;
    if (repacked || ggml_rows) {
      if (repacked) rw = RepackedQ4K::pack(w.data(), c.rows, c.cols);
      if (std::strstr(c.name, "decode")) places.assign(static_cast<size_t>(c.n_tokens), TokenPlace{1, 0});
      ract.resize(matmul_act_row_bytes(c.type, c.cols) * static_cast<size_t>(c.n_tokens));
    }
    PackedMatrix pw;
    PackedActivations pa;
    if (packed) {
      pw = PackedMatrix::pack(c.type, w.data(), c.rows, c.cols);
      pa.resize(c.n_tokens, c.cols);
      quantize_packed_rows(x.data(), 0, c.n_tokens, pa);
    }
    for (int l = 0; l <= static_cast<int>(best_simd_level()); ++l) {
      if (fast && l == 0 && c.n_tokens > 1) continue;  // the scalar reference: minutes a prompt
      const KernelTable table = build_kernel_table(static_cast<SimdLevel>(l));
      Workspace ws;
      int iters = 0;
      double quant_per = 0;
      if (fast) {
        // The weights packed for the activation form this level takes (fast_acts_for), the
        // activations quantized alone (this host's quantizer), then the product alone.
        const FastActs form = fast_acts_for(table, c.type);
        if (fw.acts() != form) fw = FastMatrix::pack(c.type, w.data(), c.rows, c.cols, nullptr, {}, form);
        fa.resize(c.n_tokens, c.cols, form);
        const int64_t nb = c.cols / fa.block();
        int qiters = 0;
        const double q0 = clock_s();
        double qt = q0;
        while (qt - q0 < seconds / 4 || qiters < 3) {
          for (int64_t tok = 0; tok < c.n_tokens; ++tok) fa.quantize_blocks(x.data() + tok * c.cols, tok, 0, nb);
          ++qiters;
          qt = clock_s();
        }
        quant_per = (qt - q0) / qiters;
      }
      const double t0 = clock_s();
      double t = t0;
      while (t - t0 < seconds || iters < 3) {
        if (fast) {
          fast_matmul_groups_with(table, fw, fa, 0, c.n_tokens, 0, fw.groups(), y.data(), c.rows);
        } else if (packed) {
          packed_matmul_groups_with(table, pw, pa, 0, pw.groups(), y.data(), c.rows);
        } else if (repacked || ggml_rows) {
          if (iters == 0) {
            matmul_quantize_rows_ggml_with(table, c.type, c.rows, x.data(), c.cols, 0, c.n_tokens, places.data(),
                                           ract.data());
          }
          if (repacked) {
            repacked_q4k_rows_with(table, rw, ract.data(), c.n_tokens, places.data(), y.data(), c.rows, 0, c.rows);
          } else {
            matmul_rows_ggml_with(table, c.type, w.data(), c.rows, c.cols, ract.data(), c.n_tokens, places.data(),
                                  y.data(), 0, c.rows);
          }
        } else {
          matmul_with(table, c.type, w.data(), c.rows, c.cols, x.data(), c.n_tokens, y.data(), pool, ws);
        }
        ++iters;
        t = clock_s();
      }
      const double per = (t - t0) / iters;
      if (fast && c.n_tokens == 1) {
        std::printf("  %s %7.1f us %6.1f GB/s", table.level, per * 1e6,
                    FastMatrix::packed_bytes(c.type, c.rows, c.cols) / per / 1e9);
      } else if (fast) {
        std::printf("  %s %7.1f us %6.1f GOPS (quant %5.1f us)", table.level, per * 1e6,
                    2.0 * c.rows * c.cols * c.n_tokens / per / 1e9, quant_per * 1e6);
      } else if (c.n_tokens == 1 && !packed) {
        std::printf("  %s %7.1f us %6.1f GB/s", table.level, per * 1e6, w.size() / per / 1e9);
      } else {
        std::printf("  %s %7.1f us %6.1f GFLOP/s", table.level, per * 1e6,
                    2.0 * c.rows * c.cols * c.n_tokens / per / 1e9);
      }
    }
    std::printf("\n");
  }
  for (int64_t n : {int64_t{49152}, int64_t{151936}, int64_t{262144}})  // SmolLM2's, Qwen2's, Gemma 3's vocabularies
    if (std::strstr("argmax", filter) != nullptr || *filter == '\0') bench_argmax(n, seconds, rng);
  return 0;
}
