// matmul: agrees with a naive dequantize + f32 dot loop, and is bit-identical
// whatever the number of tokens in the batch or the number of threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/quants_blocks.h"
#include "kernels_test_util.h"

// Counts every heap allocation in this test program, so a test can check
// that matmul's hot path allocates nothing.
static std::atomic<long> g_allocations{0};

void* operator new(std::size_t size) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
// GCC cannot see that our operator new is malloc underneath.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace inferd::kernels {
namespace {

using testing::bits_of;
using testing::dequantize_ref;
using testing::level_name;
using testing::quantize_ref;
using testing::random_floats;
using testing::runnable_levels;
using testing::weight_types;
using testing::Problem;
using testing::make_problem;


std::vector<float> run(const KernelTable& table, const Problem& p, int64_t tok0, int64_t n_tokens,
                       ThreadPool& pool, Workspace& ws) {
  std::vector<float> y(static_cast<size_t>(n_tokens * p.rows), NAN);
  matmul_with(table, p.type, p.w.data(), p.rows, p.cols, p.x.data() + tok0 * p.cols, n_tokens, y.data(),
              pool, ws);
  return y;
}

// Odd block counts exercise the kernels' lone-last-block path; rows * cols is above
// matmul's threshold for using the pool even with one token.
int64_t cols_for(DType t) { return info(t).block_size == 256 ? 768 : 352; }

TEST(KernelsMatmul, MatchesNaiveDequantizedLoop) {
  std::mt19937 rng(1);
  ThreadPool pool(2);
  Workspace ws;
  for (SimdLevel level : runnable_levels()) {
    const KernelTable table = build_kernel_table(level);
    for (DType t : weight_types()) {
      const int64_t rows = 37, cols = cols_for(t), n_tokens = 6;
      const Problem p = make_problem(rng, t, rows, cols, n_tokens);
      const std::vector<float> y = run(table, p, 0, n_tokens, pool, ws);
      const DType at = vec_dot_type(t);
      const size_t wrb = row_bytes(t, cols);
      for (int64_t tok = 0; tok < n_tokens; ++tok) {
        const std::vector<float> xt(p.x.begin() + tok * cols, p.x.begin() + (tok + 1) * cols);
        const std::vector<uint8_t> xq = quantize_ref(at, xt);
        const std::vector<float> xhat = dequantize_ref(at, xq.data(), cols);  // what the kernel sees
        for (int64_t r = 0; r < rows; ++r) {
          const std::vector<float> w = dequantize_ref(t, p.w.data() + r * wrb, cols);
          double naive = 0, naive_hat = 0, mag = 0, act_err = 0;
          for (int64_t i = 0; i < cols; ++i) {
            naive += static_cast<double>(w[i]) * xt[i];
            naive_hat += static_cast<double>(w[i]) * xhat[i];
            mag += std::fabs(static_cast<double>(w[i]) * xt[i]);
            act_err += std::fabs(static_cast<double>(w[i])) * std::fabs(xt[i] - xhat[i]);
          }
          // Q4_1/Q5_1 fold their offset through Q8_1's s = d*sum(q), stored as f16.
          double s_err = 0;
          if (at == DType::Q8_1) {
            const BlockQ8_1* b = reinterpret_cast<const BlockQ8_1*>(xq.data());
            for (int64_t k = 0; k < cols / 32; ++k) {
              int sum = 0;
              for (int j = 0; j < 32; ++j) sum += b[k].qs[j];
              uint16_t m_bits;  // the weight block's offset m (2nd f16 of Q4_1/Q5_1 blocks)
              std::memcpy(&m_bits, p.w.data() + r * wrb + k * info(t).block_bytes + 2, 2);
              s_err += std::fabs(f16_to_f32(m_bits)) *
                       std::fabs(f16_to_f32(b[k].s) - f16_to_f32(b[k].d) * static_cast<float>(sum));
            }
          }
          const float got = y[tok * rows + r];
          const float vd = ref::vec_dot(t, cols, p.w.data() + r * wrb, xq.data());
          const std::string where = std::string(dtype_name(t)) + " at " + level_name(level) + " row " +
                                    std::to_string(r) + " token " + std::to_string(tok);
          // Exactly the reference kernel's math, up to float summation order.
          EXPECT_NEAR(got, vd, 1e-5 * mag + 1e-7) << where;
          // The naive loop on the activations the kernel actually saw.
          EXPECT_NEAR(got, naive_hat, 1e-5 * mag + 1.01 * s_err + 1e-7) << where;
          // The naive loop on the original f32 activations: off by at most the activation rounding.
          EXPECT_NEAR(got, naive, 1.01 * act_err + 1.01 * s_err + 1e-5 * mag + 1e-7) << where;
        }
      }
    }
  }
}

TEST(KernelsMatmul, BitIdenticalAcrossBatchSizesAndThreadCounts) {
  std::mt19937 rng(2);
  ThreadPool pool1(1), pool2(2), pool3(3);
  ThreadPool* pools[] = {&pool1, &pool2, &pool3};
  for (SimdLevel level : runnable_levels()) {
    const KernelTable table = build_kernel_table(level);
    for (DType t : weight_types()) {
      const int64_t rows = 53, cols = cols_for(t), total = 40;
      const Problem p = make_problem(rng, t, rows, cols, total);
      Workspace ws;
      // Baseline: every token alone, one thread.
      std::vector<float> base(static_cast<size_t>(total * rows));
      for (int64_t tok = 0; tok < total; ++tok) {
        const std::vector<float> y = run(table, p, tok, 1, pool1, ws);
        std::copy(y.begin(), y.end(), base.begin() + tok * rows);
      }
      for (int64_t n : {1, 3, 8, 33}) {
        for (ThreadPool* pool : pools) {
          const int64_t tok0 = (n * 7) % (total - n + 1);  // batches start at various tokens
          const std::vector<float> y = run(table, p, tok0, n, *pool, ws);
          for (int64_t tok = 0; tok < n; ++tok) {
            for (int64_t r = 0; r < rows; ++r) {
              ASSERT_EQ(bits_of(y[tok * rows + r]), bits_of(base[(tok0 + tok) * rows + r]))
                  << dtype_name(t) << " at " << level_name(level) << " n_tokens=" << n
                  << " threads=" << pool->size() << " token " << tok << " row " << r;
            }
          }
        }
      }
    }
  }
}

TEST(KernelsMatmul, WorkspaceGrowsOnceAndIsReused) {
  std::mt19937 rng(3);
  ThreadPool pool(2);
  Workspace ws;
  const Problem p = make_problem(rng, DType::Q4_K, 16, 512, 8);
  std::vector<float> y(16 * 8);
  matmul(p.type, p.w.data(), p.rows, p.cols, p.x.data(), 8, y.data(), pool, ws);
  const uint8_t* data = ws.quantized_activations.data();
  const size_t size = ws.quantized_activations.size();
  EXPECT_GE(size, row_bytes(DType::Q8_K, 512) * 8);
  for (int64_t n : {1, 4, 8}) {
    matmul(p.type, p.w.data(), p.rows, p.cols, p.x.data(), n, y.data(), pool, ws);
    EXPECT_EQ(ws.quantized_activations.data(), data);
    EXPECT_EQ(ws.quantized_activations.size(), size);
  }
}

TEST(KernelsMatmul, HotPathDoesNotAllocate) {
  std::mt19937 rng(6);
  ThreadPool pool(2);
  Workspace ws;
  for (DType t : {DType::Q4_1, DType::Q4_K, DType::F32}) {
    const int64_t cols = info(t).block_size == 256 ? 512 : 576;
    const Problem p = make_problem(rng, t, 200, cols, 8);
    std::vector<float> y(200 * 8);
    matmul(t, p.w.data(), 200, cols, p.x.data(), 8, y.data(), pool, ws);  // grows ws once
    const long before = g_allocations.load();
    for (int64_t n : {1, 8, 3, 1}) matmul(t, p.w.data(), 200, cols, p.x.data(), n, y.data(), pool, ws);
    EXPECT_EQ(g_allocations.load(), before) << dtype_name(t);
  }
}

TEST(KernelsMatmul, LargerShapesWithManyRowsPerThread) {
  // Shapes like the real models' projections, through the dispatched matmul().
  std::mt19937 rng(4);
  ThreadPool pool(2);
  Workspace ws;
  for (DType t : {DType::Q4_1, DType::Q8_0, DType::Q5_0, DType::Q4_K, DType::Q6_K}) {
    const int64_t cols = info(t).block_size == 256 ? 1024 : 576, rows = 300, n_tokens = 5;
    const Problem p = make_problem(rng, t, rows, cols, n_tokens);
    std::vector<float> y(static_cast<size_t>(rows * n_tokens));
    matmul(t, p.w.data(), rows, cols, p.x.data(), n_tokens, y.data(), pool, ws);
    const DType at = vec_dot_type(t);
    const size_t wrb = row_bytes(t, cols);
    for (int64_t tok = 0; tok < n_tokens; ++tok) {
      const std::vector<float> xt(p.x.begin() + tok * cols, p.x.begin() + (tok + 1) * cols);
      const std::vector<uint8_t> xq = quantize_ref(at, xt);
      for (int64_t r = 0; r < rows; ++r) {
        const std::vector<float> w = dequantize_ref(t, p.w.data() + r * wrb, cols);
        double mag = 0;
        for (int64_t i = 0; i < cols; ++i) mag += std::fabs(static_cast<double>(w[i]) * xt[i]);
        EXPECT_NEAR(y[tok * rows + r], ref::vec_dot(t, cols, p.w.data() + r * wrb, xq.data()), 1e-5 * mag)
            << dtype_name(t) << " row " << r << " token " << tok;
      }
    }
  }
}

}  // namespace
}  // namespace inferd::kernels
