// The sampler alone, on hand-made logits.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "sampling/sampler.h"

namespace inferd {
namespace {


int32_t sample_once(SamplingParams p, std::vector<float> logits,
                    const std::vector<int32_t>& prompt = {}, const std::vector<int32_t>& out = {}) {
  Sampler s(p);
  return s.sample(logits.data(), static_cast<int64_t>(logits.size()), prompt, out);
}

TEST(Sampler, GreedyPicksTheLargestLogitAndTheLowestIdOnTies) {
  SamplingParams p;
  p.temperature = 0.0f;
  EXPECT_EQ(sample_once(p, {0.1f, 2.0f, -1.0f, 1.9f}), 1);
  EXPECT_EQ(sample_once(p, {3.0f, 1.0f, 3.0f}), 0);
  SamplingParams k1;
  k1.top_k = 1;  // top-k of one is greedy whatever the temperature
  EXPECT_EQ(sample_once(k1, {0.1f, 2.0f, -1.0f, 1.9f}), 1);
}

// argmax runs in 16 lanes and then a tail: the winner, ties and NaNs are
// checked in every lane, in the tail, and across both.
TEST(Sampler, ArgmaxFindsTheFirstLargestInEveryLaneAndTheTail) {
  for (int64_t n : {1, 15, 16, 17, 49, 64}) {
    for (int64_t at = 0; at < n; ++at) {
      std::vector<float> logits(static_cast<size_t>(n), -3.0f);
      logits[at] = 5.0f;
      EXPECT_EQ(argmax(logits.data(), n), at) << n << " " << at;
      if (at + 17 < n) logits[at + 17] = 5.0f;  // a tie in another lane: the lower id wins
      if (at > 0) logits[at - 1] = std::nanf("");
      EXPECT_EQ(argmax(logits.data(), n), at) << n << " " << at;
    }
  }
  const std::vector<float> all_low(40, -std::numeric_limits<float>::infinity());
  EXPECT_EQ(argmax(all_low.data(), 40), 0);
}

TEST(Sampler, SameSeedSameTokensDifferentSeedDifferentTokens) {
  const std::vector<float> logits(100, 0.0f);  // uniform: every token equally likely
  auto draw = [&](uint64_t seed) {
    SamplingParams p;
    p.seed = seed;
    Sampler s(p);
    std::vector<int32_t> out;
    for (int i = 0; i < 20; ++i) {
      std::vector<float> l = logits;
      out.push_back(s.sample(l.data(), 100, {}, out));
    }
    return out;
  };
  EXPECT_EQ(draw(7), draw(7));
  EXPECT_NE(draw(7), draw(8));
}

TEST(Sampler, TemperatureSamplingFollowsTheSoftmax) {
  // p = softmax([0, ln 2, ln 3]) = [1/6, 2/6, 3/6].
  const std::vector<float> logits = {0.0f, std::log(2.0f), std::log(3.0f)};
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.seed = 1;
  Sampler s(p);
  std::map<int32_t, int> counts;
  const int n = 60000;
  for (int i = 0; i < n; ++i) {
    std::vector<float> l = logits;
    ++counts[s.sample(l.data(), 3, {}, {})];
  }
  EXPECT_NEAR(counts[0] / double(n), 1.0 / 6, 0.01);
  EXPECT_NEAR(counts[1] / double(n), 2.0 / 6, 0.01);
  EXPECT_NEAR(counts[2] / double(n), 3.0 / 6, 0.01);
}

TEST(Sampler, TopKTopPAndMinPKeepOnlyTheirCandidates) {
  const std::vector<float> logits = {5.0f, 4.0f, 3.0f, 2.0f, 1.0f, 0.0f};
  auto seen = [&](SamplingParams p) {
    std::set<int32_t> s;
    for (uint64_t seed = 0; seed < 400; ++seed) {
      p.seed = seed;
      s.insert(sample_once(p, logits));
    }
    return s;
  };
  SamplingParams k;
  k.top_k = 2;
  k.top_p = 1.0f;
  k.min_p = 0.0f;
  EXPECT_EQ(seen(k), (std::set<int32_t>{0, 1}));
  // Probabilities are about .63 .23 .086 .032 ...: a 0.8 nucleus is {0, 1}.
  SamplingParams tp;
  tp.top_p = 0.8f;
  tp.min_p = 0.0f;
  EXPECT_EQ(seen(tp), (std::set<int32_t>{0, 1}));
  // min-p 0.1 keeps tokens with p >= 0.063: {0, 1, 2}.
  SamplingParams mp;
  mp.top_p = 1.0f;
  mp.min_p = 0.1f;
  EXPECT_EQ(seen(mp), (std::set<int32_t>{0, 1, 2}));
}

TEST(Sampler, PenaltiesChangeTheLogitsAsSpecified) {
  SamplingParams p;
  p.temperature = 0.0f;
  // Repetition penalty divides positive logits of seen tokens, multiplies negative ones.
  p.repetition_penalty = 2.0f;
  std::vector<float> l = {4.0f, 3.0f, -1.0f};
  Sampler s(p);
  EXPECT_EQ(s.sample(l.data(), 3, {0}, {2}), 1);  // 4 -> 2 < 3
  EXPECT_FLOAT_EQ(l[0], 2.0f);
  EXPECT_FLOAT_EQ(l[2], -2.0f);
  // Frequency and presence penalties count output tokens only.
  SamplingParams f;
  f.temperature = 0.0f;
  f.frequency_penalty = 0.5f;
  f.presence_penalty = 0.25f;
  std::vector<float> m = {4.0f, 3.0f, 0.0f};
  Sampler t(f);
  t.sample(m.data(), 3, {1, 1, 1}, {0, 0, 2});
  EXPECT_FLOAT_EQ(m[0], 4.0f - 2 * 0.5f - 0.25f);
  EXPECT_FLOAT_EQ(m[1], 3.0f);
  EXPECT_FLOAT_EQ(m[2], 0.0f - 0.5f - 0.25f);
}

TEST(Sampler, ValidateRefusesOutOfRangeParameters) {
  EXPECT_TRUE(SamplingParams{}.validate().ok());
  SamplingParams p;
  p.top_p = 0.0f;
  EXPECT_NE(p.validate().error().message.find("top_p"), std::string::npos);
  p = {};
  p.temperature = -1.0f;
  EXPECT_NE(p.validate().error().message.find("temperature"), std::string::npos);
  p = {};
  p.min_p = 1.5f;
  EXPECT_FALSE(p.validate().ok());
  p = {};
  p.repetition_penalty = 0.0f;
  EXPECT_FALSE(p.validate().ok());
  p = {};
  p.frequency_penalty = 3.0f;
  EXPECT_FALSE(p.validate().ok());
  p = {};
  p.top_k = -2;
  EXPECT_FALSE(p.validate().ok());
}

TEST(Sampler, LogprobsAreALogSoftmax) {
  const std::vector<float> logits = {0.0f, std::log(3.0f)};
  EXPECT_NEAR(token_logprob(logits.data(), 2, 1), std::log(0.75f), 1e-6);
  auto top = top_logprobs(logits.data(), 2, 2);
  ASSERT_EQ(top.size(), 2u);
  EXPECT_EQ(top[0].token, 1);
  EXPECT_NEAR(top[1].logprob, std::log(0.25f), 1e-6);
}

TEST(Sampler, TokenRankIsThePlaceInTopLogprobsOrder) {
  // Ties go to the lower id, as top_logprobs orders them.
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f};
  const auto top = top_logprobs(logits.data(), 5, 5);
  for (size_t i = 0; i < top.size(); ++i)
    EXPECT_EQ(token_rank(logits.data(), 5, top[i].token), static_cast<int32_t>(i) + 1) << "token " << top[i].token;
  EXPECT_EQ(token_rank(logits.data(), 5, 1), 1);
  EXPECT_EQ(token_rank(logits.data(), 5, 3), 2);
  EXPECT_EQ(token_rank(logits.data(), 5, 4), 5);
}

}  // namespace
}  // namespace inferd
