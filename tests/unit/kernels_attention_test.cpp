// Paged attention: the SIMD kernel agrees with the scalar reference and with a
// plain softmax over a contiguous copy of the keys and values, for contexts
// that span several blocks and several online-softmax tiles.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/quants.h"

namespace inferd::kernels {
namespace {

struct Cache {
  int64_t D = 64, heads = 3, block_size = 16;
  std::vector<uint16_t> k, v;
  std::vector<int32_t> block_table;
  PagedKV view() const { return PagedKV{k.data(), v.data(), D * heads, block_size, block_table.data()}; }
};

// n_pos positions in shuffled blocks, values in f16.
Cache make_cache(std::mt19937& rng, int64_t n_pos) {
  Cache c;
  const int64_t n_blocks = (n_pos + c.block_size - 1) / c.block_size;
  for (int64_t b = 0; b < n_blocks; ++b) c.block_table.push_back(static_cast<int32_t>(b));
  std::shuffle(c.block_table.begin(), c.block_table.end(), rng);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const size_t n = static_cast<size_t>(n_blocks * c.block_size * c.D * c.heads);
  for (size_t i = 0; i < n; ++i) c.k.push_back(f32_to_f16(dist(rng))), c.v.push_back(f32_to_f16(dist(rng)));
  return c;
}

// Softmax(scale q.k) v over [begin, end) in double, from the same f16 values.
std::vector<double> naive(const Cache& c, const float* q, int64_t head, int64_t begin, int64_t end, float scale) {
  std::vector<double> s;
  for (int64_t p = begin; p < end; ++p) {
    const int64_t slot = int64_t{c.block_table[p / c.block_size]} * c.block_size + p % c.block_size;
    double d = 0;
    for (int64_t i = 0; i < c.D; ++i) d += q[i] * f16_to_f32(c.k[slot * c.D * c.heads + head * c.D + i]);
    s.push_back(d * scale);
  }
  const double mx = *std::max_element(s.begin(), s.end());
  double sum = 0;
  for (double& x : s) sum += (x = std::exp(x - mx));
  std::vector<double> out(static_cast<size_t>(c.D), 0.0);
  for (int64_t p = begin; p < end; ++p) {
    const int64_t slot = int64_t{c.block_table[p / c.block_size]} * c.block_size + p % c.block_size;
    for (int64_t i = 0; i < c.D; ++i)
      out[i] += s[p - begin] / sum * f16_to_f32(c.v[slot * c.D * c.heads + head * c.D + i]);
  }
  return out;
}

TEST(KernelsAttention, MatchesPlainSoftmaxAtEveryLevel) {
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int64_t n_pos : {1, 5, 16, 63, 64, 65, 200, 700}) {
    const Cache c = make_cache(rng, n_pos);
    std::vector<float> q(static_cast<size_t>(c.D));
    for (float& x : q) x = 2.0f * dist(rng);  // sharp enough that the max matters
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.D));
    for (int64_t begin : {int64_t{0}, n_pos / 3}) {
      const std::vector<double> want = naive(c, q.data(), 1, begin, n_pos, scale);
      std::vector<float> scalar(static_cast<size_t>(c.D)), simd(static_cast<size_t>(c.D));
      detail::attend_one_head_scalar(q.data(), c.view(), c.D, c.D, begin, n_pos, scale, scalar.data());
      attend_one_head(q.data(), c.view(), c.D, c.D, begin, n_pos, scale, simd.data());
      if (best_simd_level() == SimdLevel::kAvx512) {
        detail::attend_one_head_avx512(q.data(), c.view(), c.D, c.D, begin, n_pos, scale, simd.data());
      }
      for (int64_t i = 0; i < c.D; ++i) {
        EXPECT_NEAR(scalar[i], want[i], 1e-5) << n_pos << " " << begin << " " << i;
        EXPECT_NEAR(simd[i], want[i], 1e-5) << n_pos << " " << begin << " " << i;
      }
    }
  }
}

}  // namespace
}  // namespace inferd::kernels
