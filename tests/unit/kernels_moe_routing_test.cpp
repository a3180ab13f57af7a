// The mixture-of-experts kernels: routing (kernels/cpu/moe_routing.h) against
// the definitions in double precision, and F32 weights in GGML's AVX-512
// order (kernels/cpu/float_matmul.h): its AVX-512 code against its portable
// code, bit for bit. The bits against llama.cpp itself are the tiny-qwen3moe
// reference test's (engine_llamacpp_reference_test).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cpu/float_matmul.h"
#include "kernels/cpu/moe_routing.h"

namespace inferd::kernels {
namespace {

std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// The k largest of `score`, largest first, lower index first on ties.
std::vector<int32_t> top_k(const std::vector<double>& score, int64_t k) {
  std::vector<int32_t> idx(score.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return score[a] > score[b]; });
  idx.resize(k);
  return idx;
}

TEST(KernelsMoeRouting, SoftmaxTopKAndRenormalizedWeightsFollowTheirDefinition) {
  for (const GgmlFlavour flavour : {GgmlFlavour::kAvx512, GgmlFlavour::kAvx2}) {
    for (const int64_t n : {4, 16, 20, 32, 60, 128}) {
      for (const bool normalize : {false, true}) {
        const int64_t k = std::min<int64_t>(n, 8);
        std::vector<float> logits = random_floats(n, static_cast<uint32_t>(n * 7 + normalize), 2.0f);
        std::vector<double> probs(n);
        const double max = *std::max_element(logits.begin(), logits.end());
        double sum = 0;
        for (int64_t i = 0; i < n; ++i) sum += probs[i] = std::exp(logits[i] - max);
        for (double& p : probs) p /= sum;
        const std::vector<int32_t> want = top_k(probs, k);
        double chosen_sum = 0;
        for (int32_t e : want) chosen_sum += probs[e];

        std::vector<float> scratch(n), weights(k);
        std::vector<int32_t> chosen(k);
        RouterParams p{RouterGating::kSoftmax, n, k, normalize, 0.0f, nullptr};
        route_token(p, logits.data(), scratch.data(), chosen.data(), weights.data(), flavour);
        for (int64_t j = 0; j < k; ++j) {
          EXPECT_EQ(chosen[j], want[j]) << "n " << n << " choice " << j;
          const double w = normalize ? probs[want[j]] / chosen_sum : probs[want[j]];
          EXPECT_NEAR(weights[j], w, 1e-6 * std::max(1.0, w)) << "n " << n << " choice " << j;
        }
      }
    }
  }
}

TEST(KernelsMoeRouting, TiesGoToTheLowerExpertAndBiasChoosesWithoutWeighing) {
  // Equal logits: the first k experts, in order.
  std::vector<float> logits(16, 0.5f), scratch(16), weights(4);
  std::vector<int32_t> chosen(4);
  RouterParams p{RouterGating::kSoftmax, 16, 4, true, 0.0f, nullptr};
  route_token(p, logits.data(), scratch.data(), chosen.data(), weights.data(), GgmlFlavour::kAvx512);
  EXPECT_EQ(chosen, (std::vector<int32_t>{0, 1, 2, 3}));
  for (float w : weights) EXPECT_FLOAT_EQ(w, 0.25f);

  // Sigmoid gating with a selection bias (DeepSeek V3): the bias picks the
  // experts, the unbiased probabilities weigh them; then the scale.
  std::vector<float> l2 = {2.0f, 1.0f, 0.0f, -1.0f};
  const std::vector<float> bias = {0.0f, 0.0f, 5.0f, 0.0f};
  std::vector<float> s2(4), w2(2);
  std::vector<int32_t> c2(2);
  RouterParams q{RouterGating::kSigmoid, 4, 2, false, 2.5f, bias.data()};
  route_token(q, l2.data(), s2.data(), c2.data(), w2.data(), GgmlFlavour::kAvx512);
  EXPECT_EQ(c2, (std::vector<int32_t>{2, 0}));
  EXPECT_FLOAT_EQ(w2[0], 2.5f * (1.0f / (1.0f + std::exp(0.0f))));
  EXPECT_FLOAT_EQ(w2[1], 2.5f * (1.0f / (1.0f + std::exp(-2.0f))));

  // Softmax over the chosen logits (gpt-oss): weights sum to 1.
  std::vector<float> l3 = random_floats(32, 9, 3.0f), s3(32), w3(4);
  std::vector<int32_t> c3(4);
  std::vector<double> as_double(l3.begin(), l3.end());
  const std::vector<int32_t> want = top_k(as_double, 4);
  RouterParams r{RouterGating::kSoftmaxOfChosen, 32, 4, false, 0.0f, nullptr};
  route_token(r, l3.data(), s3.data(), c3.data(), w3.data(), GgmlFlavour::kAvx512);
  EXPECT_EQ(c3, want);
  EXPECT_NEAR(w3[0] + w3[1] + w3[2] + w3[3], 1.0f, 1e-6f);
  EXPECT_GT(w3[0], w3[3]);
}

TEST(KernelsMoeRouting, CombineRoundsEachProductThenAddsInChoiceOrder) {
  const std::vector<float> a = random_floats(37, 1), b = random_floats(37, 2), c = random_floats(37, 3);
  const float w[3] = {0.5f, 0.3f, 0.2f};
  const float* rows[3] = {a.data(), b.data(), c.data()};
  std::vector<float> out(37);
  combine_experts(rows, w, 3, 37, out.data());
  for (int i = 0; i < 37; ++i) {
    volatile float p0 = a[i] * w[0], p1 = b[i] * w[1], p2 = c[i] * w[2];
    volatile float s = p0 + p1;
    EXPECT_EQ(out[i], s + p2) << i;
  }
}

TEST(KernelsFloatMatmul, Avx512OrderIsTheSameOnEveryLevelAndCloseToTheExactProduct) {
  const bool has_avx512 = __builtin_cpu_supports("avx512f");
  for (const int64_t cols : {32, 48, 64, 100, 2048, 2880}) {
    const int64_t rows = 12, n_tokens = 3;
    const std::vector<float> w = random_floats(rows * cols, static_cast<uint32_t>(cols));
    const std::vector<float> x = random_floats(n_tokens * cols, static_cast<uint32_t>(cols + 1));
    for (const TokenPlace place : {TokenPlace{1, 0}, TokenPlace{3, 1}}) {
      const std::vector<TokenPlace> places(n_tokens, place);
      std::vector<float> portable(n_tokens * rows), fast(n_tokens * rows);
      f32_rows_ggml_avx512_order_portable(w.data(), rows, cols, x.data(), n_tokens, places.data(), portable.data(), 0,
                                          rows);
      if (has_avx512) {
        f32_rows_ggml_avx512_order_avx512(w.data(), rows, cols, x.data(), n_tokens, places.data(), fast.data(), 0, rows);
        for (int64_t i = 0; i < n_tokens * rows; ++i) EXPECT_EQ(fast[i], portable[i]) << "cols " << cols << " at " << i;
      }
      for (int64_t t = 0; t < n_tokens; ++t)
        for (int64_t r = 0; r < rows; ++r) {
          double exact = 0;
          for (int64_t i = 0; i < cols; ++i) exact += double{w[r * cols + i]} * x[t * cols + i];
          EXPECT_NEAR(portable[t * rows + r], exact, 1e-4 * std::sqrt(double(cols))) << "cols " << cols;
        }
    }
  }
}

}  // namespace
}  // namespace inferd::kernels
