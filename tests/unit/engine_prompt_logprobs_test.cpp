// Prompt logprobs (GenerationParams::prompt_logprobs) on the default model:
// each prompt token after the first scored from the logits of the position
// before it, computed in the prompt's own chunked passes; against the
// single-sequence generator's logits of each prefix, with the prefix cache
// warm, under preemption, and beside generating requests.
#include <gtest/gtest.h>

#include <cmath>

#include "engine_test_util.h"

namespace inferd {
namespace {

using test::Collected;
using test::Outputs;

// The engine runs a prompt in chunks, the generator each prefix whole: their
// logits may sum in another order (the reference tests' logit tolerance).
constexpr float kLogprobTolerance = 1e-3f;

class EnginePromptLogprobs : public test::ModelTest {
 protected:
  // Every prompt logprob of a request, in the order emitted.
  static std::vector<SampledLogprobs> prompt_logprobs(const Collected& c) {
    std::vector<SampledLogprobs> all;
    for (const RequestOutput& o : c.deltas) all.insert(all.end(), o.prompt_logprobs.begin(), o.prompt_logprobs.end());
    return all;
  }

  // Checks `got` against the generator's last-position logits of each prefix.
  static void expect_matches_prefixes(const std::vector<int32_t>& prompt, const std::vector<SampledLogprobs>& got,
                                      size_t k) {
    ASSERT_EQ(got.size(), prompt.size() - 1);
    const int64_t n_vocab = model_->config().n_vocab;
    for (size_t i = 0; i < got.size(); ++i) {
      SequenceGenerator gen(*model_, static_cast<int64_t>(prompt.size()) + 1);
      auto logits = gen.prompt_logits(std::vector<int32_t>(prompt.begin(), prompt.begin() + i + 1));
      ASSERT_TRUE(logits.ok()) << logits.error().message;
      const int32_t target = prompt[i + 1];
      EXPECT_EQ(got[i].token, target) << "position " << i;
      EXPECT_NEAR(got[i].logprob, token_logprob(logits->data(), n_vocab, target), kLogprobTolerance)
          << "position " << i;
      ASSERT_EQ(got[i].top.size(), k);
      const std::vector<TokenLogprob> want = top_logprobs(logits->data(), n_vocab, static_cast<int>(k));
      for (size_t j = 0; j < k; ++j) {
        EXPECT_NEAR(got[i].top[j].logprob, want[j].logprob, kLogprobTolerance) << "position " << i << " top " << j;
        if (j > 0) {
          EXPECT_GE(got[i].top[j - 1].logprob, got[i].top[j].logprob);
        }
      }
      EXPECT_GE(got[i].rank, 1);
      if (got[i].rank == 1) {
        EXPECT_EQ(got[i].top[0].token, target);
      }
    }
  }

  static bool same(const std::vector<SampledLogprobs>& a, const std::vector<SampledLogprobs>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (a[i].token != b[i].token || std::fabs(a[i].logprob - b[i].logprob) > kLogprobTolerance) return false;
      if (a[i].top.size() != b[i].top.size()) return false;
    }
    return true;
  }
};

TEST_F(EnginePromptLogprobs, EveryPromptTokenAfterTheFirstIsScoredAcrossChunks) {
  // A budget of 16 tokens: the 40-token prompt runs in three chunks.
  const std::vector<int32_t> prompt = random_prompt(40, 31);
  auto engine = make_engine(engine_config(16, 4, 64));
  ASSERT_TRUE(engine);
  GenerationParams p = request(prompt, 3);
  p.prompt_logprobs = 4;
  const std::string id = add(*engine, p);
  Outputs run;
  test::run_until_idle(*engine, run);
  const Collected& c = run.requests[id];
  ASSERT_TRUE(c.finished);
  // All of them come before (with) the first token, and only once.
  EXPECT_EQ(c.deltas.front().prompt_logprobs.size(), prompt.size() - 1);
  expect_matches_prefixes(prompt, prompt_logprobs(c), 4);
  // Scoring changes nothing about the generation.
  EXPECT_EQ(c.tokens, run_alone(prompt, 3));
}

TEST_F(EnginePromptLogprobs, AWarmPrefixCacheIsNotUsedForTheScoredPositions) {
  const std::vector<int32_t> prompt = random_prompt(48, 32);
  auto engine = make_engine(engine_config(64, 4, 64));
  ASSERT_TRUE(engine);
  Outputs run;
  add(*engine, request(prompt, 2));  // fills the prefix cache with the prompt's blocks
  test::run_until_idle(*engine, run);
  GenerationParams p = request(prompt, 2);
  p.prompt_logprobs = 0;
  const std::string id = add(*engine, p);
  test::run_until_idle(*engine, run);
  const Collected& c = run.requests[id];
  EXPECT_EQ(c.final_output.metrics.num_cached_tokens, 0);
  expect_matches_prefixes(prompt, prompt_logprobs(c), 0);
  // A request that does not score the same prompt still hits the cache.
  const std::string again = add(*engine, request(prompt, 2));
  test::run_until_idle(*engine, run);
  EXPECT_GT(run.requests[again].final_output.metrics.num_cached_tokens, 0);
}

TEST_F(EnginePromptLogprobs, PreemptionAndBatchingNeitherDuplicateNorLoseEntries) {
  // EngineBatching's preemption recipe: prompts of 20 to 335 tokens in a pool
  // that runs two or three at a time; every other request scores its prompt.
  constexpr int64_t kMaxTokens = 12;
  std::vector<GenerationParams> reqs;
  for (int i = 0; i < 10; ++i) {
    reqs.push_back(request(random_prompt(20 + 35 * i, 300 + i), kMaxTokens));
    if (i % 2 == 0) reqs.back().prompt_logprobs = 2;
  }
  auto engine = make_engine(engine_config(128, 16, blocks_held_alone(335 + kMaxTokens - 1, 128) + 5));
  ASSERT_TRUE(engine);
  std::vector<std::string> ids;
  for (const GenerationParams& p : reqs) ids.push_back(add(*engine, p));
  Outputs run;
  test::run_until_idle(*engine, run);
  test::expect_idle_and_clean(*engine);
  EXPECT_GT(engine->stats().scheduler.preemptions, 0);

  // Each scored request alone, for its reference.
  int64_t scored_preemptions = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const Collected& c = run.requests[ids[i]];
    ASSERT_TRUE(c.finished) << "request " << i;
    EXPECT_EQ(c.tokens, run_alone(reqs[i].prompt_token_ids, kMaxTokens)) << "request " << i;
    if (reqs[i].prompt_logprobs < 0) {
      EXPECT_TRUE(prompt_logprobs(c).empty());
      continue;
    }
    scored_preemptions += c.final_output.metrics.num_preemptions;
    auto alone = make_engine(engine_config(128, 1, blocks_held_alone(335 + kMaxTokens - 1, 128) + 1));
    ASSERT_TRUE(alone);
    const std::string id = add(*alone, reqs[i]);
    Outputs solo;
    test::run_until_idle(*alone, solo);
    const std::vector<SampledLogprobs> got = prompt_logprobs(c), want = prompt_logprobs(solo.requests[id]);
    ASSERT_EQ(got.size(), reqs[i].prompt_token_ids.size() - 1) << "request " << i;
    EXPECT_TRUE(same(got, want)) << "request " << i << " (" << c.final_output.metrics.num_preemptions
                                 << " preemptions)";
  }
  EXPECT_GT(scored_preemptions, 0) << "no scoring request was preempted: the recompute went untested";
}

TEST_F(EnginePromptLogprobs, AskingForMoreThanMaxLogprobsOrWithBeamSearchIsRefused) {
  auto engine = make_engine(engine_config(64, 4, 64));
  ASSERT_TRUE(engine);
  GenerationParams p = request(random_prompt(8, 33), 2);
  p.prompt_logprobs = engine->config().max_logprobs + 1;
  auto h = engine->add_request(p);
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.error().message.find("prompt_logprobs"), std::string::npos) << h.error().message;
  p.prompt_logprobs = 1;
  p.beam_search = BeamSearchParams{};
  EXPECT_FALSE(engine->add_request(p).ok());
}

}  // namespace
}  // namespace inferd
