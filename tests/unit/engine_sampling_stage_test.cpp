// The sampling stage on hand-made rows of logits (no model): draft
// acceptance, the penalties seeing accepted drafts as output, a grammar's
// mask and the logprobs renormalised over what it allows, prompt logprobs
// not scored twice after a recompute, beam candidates and pooled rows.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "engine/sampling_stage.h"

namespace inferd {
namespace {

constexpr int64_t kVocab = 8;

// A decode of `drafts.size() + 1` tokens: the last real token, then the drafts.
ScheduledRequest verifying(const std::string& id, int64_t computed, std::vector<int32_t> drafts) {
  ScheduledRequest s;
  s.request_id = id;
  s.num_computed_tokens = computed;
  s.token_ids = {0};
  s.token_ids.insert(s.token_ids.end(), drafts.begin(), drafts.end());
  s.num_new_tokens = static_cast<int64_t>(s.token_ids.size());
  s.num_draft_tokens = static_cast<int64_t>(drafts.size());
  s.num_prompt_tokens = 1;
  s.sample = true;
  return s;
}

// Rows of kVocab logits, each 0 but for the given (token, value) pairs.
std::vector<float> rows(const std::vector<std::vector<std::pair<int32_t, float>>>& peaks) {
  std::vector<float> l(peaks.size() * kVocab, 0.0f);
  for (size_t r = 0; r < peaks.size(); ++r)
    for (auto [t, v] : peaks[r]) l[r * kVocab + t] = v;
  return l;
}

SamplingRequest greedy() {
  SamplingRequest r;
  r.params.temperature = 0.0f;
  r.prompt_token_ids = {0};
  return r;
}

std::vector<int32_t> sample(SamplingStage& stage, const ScheduledRequest& s, std::vector<float> logits,
                            StepSamplingInputs inputs = {}) {
  SchedulerOutput out;
  out.scheduled = {s};
  ModelRunnerOutput result;
  stage.sample(out, inputs, logits.data(), kVocab, result);
  return result.requests[0].tokens;
}

TEST(EngineSamplingStage, AcceptsDraftsWhileEachSampledTokenEqualsItsDraft) {
  SamplingStage stage;
  stage.add_request("a", greedy());
  // Row 0 samples 3 (= draft 0), row 1 samples 6 (not draft 1 = 5): two tokens, row 2 unused.
  EXPECT_EQ(sample(stage, verifying("a", 1, {3, 5}), rows({{{3, 1}}, {{6, 1}}, {{2, 1}}})),
            (std::vector<int32_t>{3, 6}));
  // Every draft accepted: k + 1 tokens.
  EXPECT_EQ(sample(stage, verifying("a", 3, {3, 5}), rows({{{3, 1}}, {{5, 1}}, {{2, 1}}})),
            (std::vector<int32_t>{3, 5, 2}));
  // The first draft rejected: one token.
  EXPECT_EQ(sample(stage, verifying("a", 6, {4, 5}), rows({{{1, 1}}, {{5, 1}}, {{2, 1}}})),
            (std::vector<int32_t>{1}));
}

TEST(EngineSamplingStage, PenaltiesSeeAcceptedDraftsAndEarlierStepsAsOutput) {
  SamplingStage stage;
  SamplingRequest r = greedy();
  r.params.presence_penalty = 2.0f;  // a token in the output loses 2
  stage.add_request("a", r);
  // Row 0: 3 leads and is accepted; row 1: 3 leads 2 by 1, but 3 is now output.
  EXPECT_EQ(sample(stage, verifying("a", 1, {3}), rows({{{3, 5}}, {{3, 5}, {2, 4}}})),
            (std::vector<int32_t>{3, 2}));
  // The next step: 3 and 2 are both output; 4 wins although it is lowest of the three.
  EXPECT_EQ(sample(stage, verifying("a", 3, {}), rows({{{3, 5}, {2, 4.9f}, {4, 3.5f}}})),
            (std::vector<int32_t>{4}));
}

TEST(EngineSamplingStage, MaskedRowsSampleAndReportLogprobsOverTheAllowedTokensOnly) {
  SamplingStage stage;
  SamplingRequest r = greedy();
  r.logprobs = 5;
  r.constrained = true;
  stage.add_request("a", r);
  const std::vector<uint32_t> mask = {(1u << 1) | (1u << 4)};  // tokens 1 and 4
  StepSamplingInputs inputs;
  inputs.allowed = {{mask, static_cast<int32_t>(kVocab)}};
  SchedulerOutput out;
  out.scheduled = {verifying("a", 1, {})};
  std::vector<float> logits = rows({{{7, 9}, {1, 2}, {4, 1}}});
  ModelRunnerOutput result;
  stage.sample(out, inputs, logits.data(), kVocab, result);
  ASSERT_EQ(result.requests[0].tokens, (std::vector<int32_t>{1}));
  ASSERT_EQ(result.requests[0].logprobs.size(), 1u);
  const SampledLogprobs& lp = result.requests[0].logprobs[0];
  const double lse = std::log(std::exp(2.0) + std::exp(1.0));  // over the allowed two
  EXPECT_NEAR(lp.logprob, 2.0 - lse, 1e-5);
  EXPECT_EQ(lp.rank, 1);
  ASSERT_EQ(lp.top.size(), 2u);  // 5 asked for, 2 allowed
  EXPECT_EQ(lp.top[1].token, 4);
  EXPECT_NEAR(lp.top[1].logprob, 1.0 - lse, 1e-5);
}

TEST(EngineSamplingStage, PromptPositionsScoredBeforeARecomputeAreNotScoredAgain) {
  SamplingStage stage;
  SamplingRequest r = greedy();
  r.prompt_token_ids = {0, 1, 2, 3, 4};
  r.prompt_logprobs = 0;
  stage.add_request("a", r);
  ScheduledRequest s;
  s.request_id = "a";
  s.prompt_logits = true;
  s.num_prompt_tokens = 5;
  s.token_ids = {0, 1};
  s.num_new_tokens = 2;  // positions 0, 1: rows scoring tokens 1 and 2
  SchedulerOutput out;
  out.scheduled = {s};
  std::vector<float> logits(2 * kVocab, 0.0f);
  ModelRunnerOutput result;
  stage.sample(out, {}, logits.data(), kVocab, result);
  ASSERT_EQ(result.requests[0].prompt_logprobs.size(), 2u);
  EXPECT_EQ(result.requests[0].prompt_logprobs[1].token, 2);
  EXPECT_NEAR(result.requests[0].prompt_logprobs[1].logprob, -std::log(8.0), 1e-5);  // a flat row
  // Preempted, then recomputed from the start with the whole prompt: rows
  // for positions 0..3, of which only those scoring tokens 3 and 4 are new.
  out.scheduled[0].token_ids = {0, 1, 2, 3, 4};
  out.scheduled[0].num_new_tokens = 5;
  out.scheduled[0].sample = true;
  logits.assign(5 * kVocab, 0.0f);
  logits[4 * kVocab + 6] = 1.0f;  // the sample row
  stage.sample(out, {}, logits.data(), kVocab, result);
  ASSERT_EQ(result.requests[0].prompt_logprobs.size(), 2u);
  EXPECT_EQ(result.requests[0].prompt_logprobs[0].token, 3);
  EXPECT_EQ(result.requests[0].prompt_logprobs[1].token, 4);
  EXPECT_EQ(result.requests[0].tokens, (std::vector<int32_t>{6}));
}

TEST(EngineSamplingStage, BeamsGetTheirCandidatesAndPooledRequestsTheirRow) {
  SamplingStage stage;
  stage.add_request("beam", {.kind = SamplingRequest::Kind::kBeam, .beam_candidates = 3});
  stage.add_request("pool", {.kind = SamplingRequest::Kind::kPooled});
  SchedulerOutput out;
  out.scheduled = {verifying("beam", 1, {}), verifying("pool", 1, {})};
  std::vector<float> logits = rows({{{5, 3}, {2, 2}, {7, 1}}, {{1, 0.5f}}});
  ModelRunnerOutput result;
  stage.sample(out, {}, logits.data(), kVocab, result);
  const std::vector<TokenLogprob>& c = result.requests[0].beam_candidates;
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[0].token, 5);
  EXPECT_EQ(c[1].token, 2);
  EXPECT_EQ(c[2].token, 7);
  double sum = 0;
  for (int i = 0; i < kVocab; ++i) sum += std::exp(logits[i]);
  EXPECT_NEAR(c[0].logprob, 3.0 - std::log(sum), 1e-5);
  EXPECT_TRUE(result.requests[0].tokens.empty());
  EXPECT_EQ(result.requests[1].pooled, std::vector<float>(logits.begin() + kVocab, logits.end()));
  stage.remove_request("beam");
  EXPECT_FALSE(stage.has_request("beam"));
  EXPECT_EQ(stage.num_requests(), 1u);
}

}  // namespace
}  // namespace inferd
