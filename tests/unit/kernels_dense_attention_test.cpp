// Attention over float keys and values (kernels/cpu/dense_attention.h, the
// encoders' pass) against softmax attention in double, and the same bits at
// every level, for head sizes, sequence lengths around the 16-key vectors,
// and causal and full masks.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu/dense_attention.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels_test_util.h"

namespace inferd::kernels {
namespace {

using testing::bits_of;

struct Case {
  int64_t n, D;
  bool causal;
};

TEST(DenseAttention, MatchesSoftmaxAttentionAndTheReferenceBitsAtEveryLevel) {
  std::mt19937 rng(3);
  for (const Case c : {Case{1, 32, false}, Case{15, 32, false}, Case{16, 64, true}, Case{17, 32, true},
                       Case{48, 32, false}, Case{70, 24, false}, Case{33, 128, true}}) {
    // Q, K, V interleaved in rows as the encoder keeps them: strides wider than D.
    const int64_t stride = 3 * c.D + 5;
    const std::vector<float> qkv = testing::random_floats(rng, c.n * stride, 1.5f);
    DenseAttentionArgs a;
    a.q = qkv.data(), a.k = qkv.data() + c.D, a.v = qkv.data() + 2 * c.D;
    a.q_stride = a.kv_stride = stride, a.out_stride = c.D;
    a.n = c.n, a.D = c.D, a.scale = 1.0f / std::sqrt(static_cast<float>(c.D)), a.causal = c.causal;
    std::vector<float> ref(c.n * c.D, NAN);
    a.out = ref.data();
    detail::dense_attention_scalar(a);
    for (int64_t i = 0; i < c.n; ++i) {
      const int64_t m = c.causal ? i + 1 : c.n;
      std::vector<double> s(m);
      double mx = -INFINITY, sum = 0;
      for (int64_t j = 0; j < m; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < c.D; ++d) dot += double(a.q[i * stride + d]) * a.k[j * stride + d];
        s[j] = dot * a.scale, mx = std::max(mx, s[j]);
      }
      for (double& x : s) sum += (x = std::exp(x - mx));
      for (int64_t d = 0; d < c.D; ++d) {
        double want = 0;
        for (int64_t j = 0; j < m; ++j) want += s[j] / sum * a.v[j * stride + d];
        EXPECT_NEAR(ref[i * c.D + d], want, 2e-5) << c.n << " tokens, D " << c.D << ", query " << i << " col " << d;
      }
    }
    for (SimdLevel level : {SimdLevel::kAvx2, SimdLevel::kAvx512}) {
      if (level > best_simd_level()) continue;
      std::vector<float> got(c.n * c.D, NAN);
      a.out = got.data();
      build_kernel_table(level).ops.dense_attention(a);
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_EQ(bits_of(got[i]), bits_of(ref[i])) << testing::level_name(level) << " " << c.n << " tokens, D "
                                                    << c.D << ", element " << i;
    }
  }
}

}  // namespace
}  // namespace inferd::kernels
