// The allowed-token mask of structured outputs on a row of logits, and the
// sampler behind it: no disallowed token is ever chosen, whatever the sampling
// parameters, and the allowed tokens keep their relative probabilities.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <vector>

#include "sampling/sampler.h"
#include "sampling/token_mask.h"

namespace inferd {
namespace {

// ---------------------------------------------------------------------------
// The mask on logits

TEST(TokenMask, DisallowedTokensGetMinusInfinityAndAllowedOnesKeepTheirLogits) {
  std::mt19937 rng(7);
  for (int32_t vocab : {1, 31, 32, 33, 100, 49152}) {
    for (int64_t n_logits : {int64_t{vocab}, int64_t{vocab} + 17}) {  // a model may have padded logits
      std::vector<uint32_t> mask((vocab + 31) / 32);
      for (uint32_t& w : mask) w = static_cast<uint32_t>(rng());
      mask[0] |= 1u;  // at least one allowed
      if (vocab > 64) mask[1] = 0xFFFFFFFFu, mask[2] = 0;  // the all-set and all-clear fast paths
      std::vector<float> logits(n_logits), before;
      std::normal_distribution<float> normal(0.0f, 3.0f);
      for (float& l : logits) l = normal(rng);
      before = logits;
      const int64_t n_allowed = apply_token_mask(mask, vocab, logits.data(), n_logits);
      int64_t expect_allowed = 0;
      for (int64_t i = 0; i < n_logits; ++i) {
        const bool ok = i < vocab && (mask[i / 32] >> (i % 32) & 1u);
        expect_allowed += ok;
        if (ok) EXPECT_EQ(logits[i], before[i]) << "vocab " << vocab << " token " << i;
        else EXPECT_EQ(logits[i], -std::numeric_limits<float>::infinity()) << "vocab " << vocab << " token " << i;
      }
      EXPECT_EQ(n_allowed, expect_allowed);
    }
  }
}

TEST(TokenMask, MaskedTokensAreNeverSampledWhateverTheParameters) {
  constexpr int32_t kVocab = 300;
  std::mt19937 rng(3);
  std::vector<uint32_t> mask((kVocab + 31) / 32, 0);
  std::vector<int32_t> allowed_ids;
  for (int32_t id = 0; id < kVocab; id += 7) {
    mask[id / 32] |= 1u << (id % 32);
    allowed_ids.push_back(id);
  }
  std::vector<SamplingParams> configs;
  auto add = [&](auto edit) {
    SamplingParams p;
    p.seed = 1234 + configs.size();
    edit(p);
    configs.push_back(p);
  };
  add([](SamplingParams& p) { p.temperature = 0.0f; });
  add([](SamplingParams& p) { p.temperature = 1.0f; });
  add([](SamplingParams& p) { p.temperature = 2.0f; });
  add([](SamplingParams& p) { p.temperature = 0.7f; p.top_k = 5; });
  add([](SamplingParams& p) { p.temperature = 1.0f; p.top_k = 250; });  // more than are allowed
  add([](SamplingParams& p) { p.temperature = 1.5f; p.top_p = 0.9f; });
  add([](SamplingParams& p) { p.temperature = 1.0f; p.min_p = 0.05f; });
  add([](SamplingParams& p) { p.temperature = 1.0f; p.repetition_penalty = 1.8f; });
  add([](SamplingParams& p) { p.temperature = 1.0f; p.frequency_penalty = -2.0f; p.presence_penalty = -2.0f; });
  add([](SamplingParams& p) { p.temperature = 0.5f; p.top_k = 3; p.top_p = 0.5f; p.min_p = 0.2f; p.repetition_penalty = 0.5f; });
  for (size_t c = 0; c < configs.size(); ++c) {
    Sampler sampler(configs[c]);
    std::vector<int32_t> output;
    for (int step = 0; step < 300; ++step) {
      // The disallowed tokens are by far the most likely ones, and the
      // penalties (negative ones included) push on tokens already output.
      std::vector<float> logits(kVocab);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      for (int32_t i = 0; i < kVocab; ++i) logits[i] = (i % 7 == 0 ? 0.0f : 20.0f) + normal(rng);
      apply_token_mask(mask, kVocab, logits.data(), kVocab);
      const int32_t t = sampler.sample(logits.data(), kVocab, {1, 2, 3}, output);
      ASSERT_TRUE(token_allowed(mask, t)) << "config " << c << " step " << step << " sampled " << t;
      output.push_back(t);
    }
  }
}

TEST(TokenMask, SamplingKeepsTheRelativeProbabilitiesOfAllowedTokens) {
  // Softmax over the allowed tokens only: logits 0, 1, 2 on allowed ids 1, 4, 6.
  const std::vector<float> base = {5.0f, 0.0f, 9.0f, 9.0f, 1.0f, 9.0f, 2.0f, 9.0f};
  const std::vector<uint32_t> mask = {(1u << 1) | (1u << 4) | (1u << 6)};
  const double z = 1 + std::exp(1.0) + std::exp(2.0);
  const std::map<int32_t, double> expected = {{1, 1 / z}, {4, std::exp(1.0) / z}, {6, std::exp(2.0) / z}};
  for (bool truncating : {false, true}) {  // the sampler's two paths (id order; sorted candidates)
    SamplingParams p;
    p.temperature = 1.0f;
    p.seed = 99;
    if (truncating) p.top_k = 8;  // keeps everything, but takes the sorted path
    if (truncating) p.min_p = 1e-6f;
    Sampler sampler(p);
    std::map<int32_t, int> counts;
    constexpr int kDraws = 40000;
    for (int i = 0; i < kDraws; ++i) {
      std::vector<float> logits = base;
      apply_token_mask(mask, 8, logits.data(), 8);
      ++counts[sampler.sample(logits.data(), 8, {}, {})];
    }
    EXPECT_EQ(counts.size(), 3u);
    for (const auto& [id, prob] : expected) {
      const double freq = static_cast<double>(counts[id]) / kDraws;
      // 4 standard deviations of a binomial proportion.
      EXPECT_NEAR(freq, prob, 4 * std::sqrt(prob * (1 - prob) / kDraws)) << "token " << id << " truncating " << truncating;
    }
  }
}

}  // namespace
}  // namespace inferd
