// Paged attention: the AVX-512 kernel gives the scalar kernel's bits for both
// summation orders, and both agree with a plain softmax in double over a
// contiguous copy of the keys and values (rounding the query and the weights
// to f16 as the kernels do), for contexts that span several blocks and
// several 16- and 64-position lane groups; query heads that share a key/value
// head give the same bits computed together. Bit-exactness against llama.cpp
// itself is checked end to end by engine_llamacpp_reference_test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/quants.h"
#include "kernels_test_util.h"

namespace inferd::kernels {
namespace {

using testing::bits_of;

struct Cache {
  int64_t D = 64, heads = 3, block_size = 16;
  std::vector<uint16_t> k, v;
  std::vector<int32_t> block_table;
  PagedKV view() const { return PagedKV{k.data(), v.data(), D * heads, block_size, block_table.data()}; }
};

// n_pos positions in shuffled blocks, values in f16.
Cache make_cache(std::mt19937& rng, int64_t n_pos, int64_t D = 64) {
  Cache c;
  c.D = D;
  const int64_t n_blocks = (n_pos + c.block_size - 1) / c.block_size;
  for (int64_t b = 0; b < n_blocks; ++b) c.block_table.push_back(static_cast<int32_t>(b));
  std::shuffle(c.block_table.begin(), c.block_table.end(), rng);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const size_t n = static_cast<size_t>(n_blocks * c.block_size * c.D * c.heads);
  for (size_t i = 0; i < n; ++i) c.k.push_back(f32_to_f16(dist(rng))), c.v.push_back(f32_to_f16(dist(rng)));
  return c;
}

float round_f16(double x) { return f16_to_f32(f32_to_f16(static_cast<float>(x))); }

// Softmax(scale q.k) v over [begin, end) in double, from the same f16 values,
// with the query and the normalized weights rounded to f16.
std::vector<double> naive(const Cache& c, const float* q_in, int64_t head, int64_t begin, int64_t end, float scale) {
  std::vector<float> q(q_in, q_in + c.D);
  for (float& x : q) x = round_f16(x);
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
      out[i] += round_f16(s[p - begin] / sum) * f16_to_f32(c.v[slot * c.D * c.heads + head * c.D + i]);
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
      for (AttentionPass pass : {AttentionPass::kDecode, AttentionPass::kPrefill}) {
        std::vector<float> scalar(static_cast<size_t>(c.D)), simd(static_cast<size_t>(c.D));
        detail::attend_one_head_scalar(q.data(), c.view(), c.D, c.D, begin, n_pos, scale, pass, scalar.data());
        attend_one_head(q.data(), c.view(), c.D, c.D, begin, n_pos, scale, pass, simd.data());
        std::vector<float> fma = scalar;
        if (best_simd_level() >= SimdLevel::kAvx2) {
          detail::attend_one_head_fma(q.data(), c.view(), c.D, c.D, begin, n_pos, scale, pass, fma.data());
        }
        if (best_simd_level() == SimdLevel::kAvx512) {
          detail::attend_one_head_avx512(q.data(), c.view(), c.D, c.D, begin, n_pos, scale, pass, simd.data());
        }
        const char* name = pass == AttentionPass::kDecode ? "decode" : "prefill";
        for (int64_t i = 0; i < c.D; ++i) {
          EXPECT_NEAR(scalar[i], want[i], 2e-5) << name << " " << n_pos << " " << begin << " " << i;
          EXPECT_EQ(bits_of(simd[i]), bits_of(scalar[i])) << name << " " << n_pos << " " << begin << " " << i;
          EXPECT_EQ(bits_of(fma[i]), bits_of(scalar[i])) << name << " " << n_pos << " " << begin << " " << i;
        }
      }
    }
  }
}

// Query heads that share a key/value head, computed together (attend_heads,
// and the AVX-512 group kernel directly), give each head's one-at-a-time bits.
TEST(KernelsAttention, GroupedHeadsGiveEachHeadsBits) {
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int64_t D : {64, 128, 256, 80}) {
    for (int64_t n_pos : {1, 17, 64, 65, 300, 500}) {
      const Cache c = make_cache(rng, n_pos, D);
      for (int64_t n_heads : {1, 2, 3, 4, 5}) {
        std::vector<float> q(static_cast<size_t>(n_heads * D));
        for (float& x : q) x = 2.0f * dist(rng);
        const float scale = 1.0f / std::sqrt(static_cast<float>(D));
        for (int64_t begin : {int64_t{0}, n_pos / 3}) {
          for (AttentionPass pass : {AttentionPass::kDecode, AttentionPass::kPrefill}) {
            std::vector<float> grouped(q.size()), direct(q.size()), one(static_cast<size_t>(D));
            attend_heads(q.data(), n_heads, c.view(), 2 * D, D, begin, n_pos, scale, pass, grouped.data());
            direct = grouped;
            if (best_simd_level() == SimdLevel::kAvx512) {
              detail::attend_heads_avx512(q.data(), n_heads, c.view(), 2 * D, D, begin, n_pos, scale, pass,
                                          direct.data());
            }
            for (int64_t h = 0; h < n_heads; ++h) {
              detail::attend_one_head_scalar(q.data() + h * D, c.view(), 2 * D, D, begin, n_pos, scale, pass,
                                             one.data());
              for (int64_t i = 0; i < D; ++i) {
                const auto where = ::testing::Message() << (pass == AttentionPass::kDecode ? "decode" : "prefill")
                                                        << " D " << D << " n_pos " << n_pos << " heads " << n_heads
                                                        << " begin " << begin << " head " << h << " i " << i;
                ASSERT_EQ(bits_of(grouped[h * D + i]), bits_of(one[i])) << where;
                ASSERT_EQ(bits_of(direct[h * D + i]), bits_of(one[i])) << where;
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace inferd::kernels
