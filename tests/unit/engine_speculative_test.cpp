// Speculative decoding with the n-gram proposer on real models: the outputs
// must be token-identical to the same requests without speculation (greedy
// and seeded sampling alike, see engine/speculative.h), under continuous
// batching, chunked prefill and preemption, with stop strings and logprobs
// behaving as plain steps do. Every test also checks that drafts were
// accepted, so that it exercises verification rather than plain decoding.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "engine/speculative.h"
#include "engine_test_util.h"

namespace inferd {
namespace {

using test::Outputs;

TEST(NgramProposer, ProposesWhatFollowedTheLatestEarlierOccurrenceOfTheLongestSuffix) {
  const std::vector<int32_t> t = {1, 2, 3, 4, 9, 2, 3, 5, 6, 7, 1, 2, 3};
  // Suffix "1 2 3" occurred at 0: "4 9 2" followed it.
  EXPECT_EQ(propose_ngram(t, 1, 3, 3), (std::vector<int32_t>{4, 9, 2}));
  // Only 2-grams: "2 3" last occurred at 5, followed by "5 6".
  EXPECT_EQ(propose_ngram(t, 1, 2, 2), (std::vector<int32_t>{5, 6}));
  // Cut at the end of the sequence.
  EXPECT_EQ(propose_ngram(std::vector<int32_t>{7, 8, 7}, 1, 2, 5), (std::vector<int32_t>{8, 7}));
  EXPECT_TRUE(propose_ngram(std::vector<int32_t>{1, 2, 3}, 1, 3, 4).empty());  // no repeat
  EXPECT_TRUE(propose_ngram(t, 4, 5, 3).empty());  // no 4-gram repeats
  EXPECT_TRUE(propose_ngram(std::vector<int32_t>{}, 1, 3, 4).empty());
}

class EngineSpeculative : public test::ModelTest, public ::testing::WithParamInterface<std::string> {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(use_model(GetParam()));
    ModelTest::SetUp();
  }

  static SpeculativeConfig ngram(int32_t k) {
    SpeculativeConfig c;
    c.method = SpeculativeConfig::Method::kNgram;
    c.num_speculative_tokens = k;
    c.prompt_lookup_min = 1;
    c.prompt_lookup_max = 3;
    return c;
  }

  // A prompt that repeats itself, so that the n-gram proposer finds matches
  // in the prompt and in outputs that copy it.
  static std::vector<int32_t> repeating_prompt(int64_t n, uint32_t seed) {
    std::vector<int32_t> p = random_prompt((n + 1) / 2, seed);
    const std::vector<int32_t> half = p;
    p.insert(p.end(), half.begin(), half.end());
    p.resize(static_cast<size_t>(n));
    return p;
  }

  // Runs the requests on a fresh engine (all added at once) and returns each
  // request's collected output, in order, and the engine's final stats.
  static std::vector<test::Collected> run_all(EngineConfig c, const std::vector<GenerationParams>& reqs,
                                              EngineStats* stats = nullptr) {
    auto engine = make_engine(c);
    EXPECT_TRUE(engine);
    if (!engine) return {};
    std::vector<std::string> ids;
    for (const GenerationParams& p : reqs) ids.push_back(add(*engine, p));
    Outputs run;
    test::run_until_idle(*engine, run);
    test::expect_idle_and_clean(*engine);
    if (stats) *stats = engine->stats();
    std::vector<test::Collected> out;
    for (const std::string& id : ids) out.push_back(run.requests[id]);
    return out;
  }

  // Runs reqs with and without speculation and expects the same tokens,
  // text, finish reason and logprobs; returns the speculative run's stats.
  static EngineStats expect_same_with_speculation(EngineConfig c, const std::vector<GenerationParams>& reqs) {
    const std::vector<test::Collected> plain = run_all(c, reqs);
    c.speculative = ngram(4);
    EngineStats st;
    const std::vector<test::Collected> spec = run_all(c, reqs, &st);
    EXPECT_EQ(plain.size(), spec.size());
    for (size_t i = 0; i < std::min(plain.size(), spec.size()); ++i) {
      EXPECT_TRUE(spec[i].finished) << "request " << i;
      EXPECT_EQ(spec[i].final_output.error, "") << "request " << i;
      EXPECT_EQ(spec[i].tokens, plain[i].tokens) << "request " << i;
      EXPECT_EQ(spec[i].text, plain[i].text) << "request " << i;
      EXPECT_EQ(spec[i].final_output.status, plain[i].final_output.status) << "request " << i;
      std::vector<SampledLogprobs> lp_plain, lp_spec;
      for (const RequestOutput& o : plain[i].deltas) lp_plain.insert(lp_plain.end(), o.logprobs.begin(), o.logprobs.end());
      for (const RequestOutput& o : spec[i].deltas) lp_spec.insert(lp_spec.end(), o.logprobs.begin(), o.logprobs.end());
      EXPECT_EQ(lp_spec.size(), lp_plain.size()) << "request " << i;
      for (size_t t = 0; t < std::min(lp_plain.size(), lp_spec.size()); ++t) {
        EXPECT_EQ(lp_spec[t].token, lp_plain[t].token);
        EXPECT_EQ(lp_spec[t].logprob, lp_plain[t].logprob) << "request " << i << " token " << t;
        EXPECT_EQ(lp_spec[t].top.size(), lp_plain[t].top.size());
      }
    }
    // The requests' own counts add up to the engine's.
    int64_t verifications = 0, drafted = 0, accepted = 0;
    for (const test::Collected& c : spec) {
      verifications += c.final_output.metrics.speculative.drafts;
      drafted += c.final_output.metrics.speculative.draft_tokens;
      accepted += c.final_output.metrics.speculative.accepted_tokens;
    }
    EXPECT_EQ(verifications, st.speculative.drafts);
    EXPECT_EQ(drafted, st.speculative.draft_tokens);
    EXPECT_EQ(accepted, st.speculative.accepted_tokens);
    std::printf("%lld drafts, %lld draft tokens, %lld accepted (mean acceptance length %.2f), %lld steps\n",
                static_cast<long long>(st.speculative.drafts), static_cast<long long>(st.speculative.draft_tokens),
                static_cast<long long>(st.speculative.accepted_tokens), st.speculative.mean_acceptance_length(),
                static_cast<long long>(st.scheduler.steps));
    EXPECT_GT(st.speculative.accepted_tokens, 0) << "no draft was ever accepted: verification was not exercised";
    return st;
  }
};

TEST_P(EngineSpeculative, ConcurrentGreedyRequestsAreTokenIdenticalWithNgramDrafts) {
  // 24 prompts of 2 to 400 tokens with chunked prefill (a budget of 96
  // tokens) beside the decodes that verify drafts.
  std::vector<GenerationParams> reqs;
  for (int i = 0; i < 24; ++i) {
    const int64_t len = std::lround(std::pow(200.0, i / 23.0)) * 2;
    reqs.push_back(request(repeating_prompt(len, 300 + i), 12 + i % 13));
  }
  expect_same_with_speculation(engine_config(96, 32, 700), reqs);
}

// Preempted requests recompute their output tokens as decodes (ModelRunner::
// build_batch), so their outputs stay the same whatever the pool.
TEST_P(EngineSpeculative, PreemptionUnderASmallKvPoolKeepsOutputsIdentical) {
  constexpr int64_t kMaxTokens = 24;
  std::vector<GenerationParams> reqs;
  for (int i = 0; i < 8; ++i) reqs.push_back(request(repeating_prompt(20 + 35 * i, 400 + i), kMaxTokens));
  const EngineStats st =
      expect_same_with_speculation(engine_config(128, 16, blocks_held_alone(265 + kMaxTokens - 1, 128) + 5), reqs);
  EXPECT_GT(st.scheduler.preemptions, 0);
}

TEST_P(EngineSpeculative, SeededSamplingLogprobsAndStopStringsAreAsWithoutDrafts) {
  SamplingParams sp;
  sp.temperature = 0.8f;
  sp.top_k = 40;
  sp.top_p = 0.95f;
  sp.min_p = 0.02f;
  sp.repetition_penalty = 1.05f;
  sp.frequency_penalty = 0.1f;
  std::vector<GenerationParams> reqs;
  for (int i = 0; i < 6; ++i) {
    sp.seed = 1000 + i;
    GenerationParams p = request(repeating_prompt(40 + 17 * i, 500 + i), 32, i % 2 ? sp : greedy());
    p.logprobs = 2;
    reqs.push_back(std::move(p));
  }
  // Stop strings taken from the middle of the plain outputs: the request ends
  // where a plain run would, even when the string completes inside an
  // accepted run of drafts.
  const EngineConfig c = engine_config(128, 8, 400);
  const std::vector<test::Collected> plain = run_all(c, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    const std::string& text = plain[i].text;
    if (text.size() >= 12) reqs[i].stop = {text.substr(text.size() / 2, 3)};
  }
  expect_same_with_speculation(c, reqs);
}

// SmolLM2 and the tiny Qwen3 model sum in the same order whatever the
// chunking, so their batched runs can be compared (the tiny Llama 3 and
// Gemma 3 models' random outputs rarely repeat, so their drafts are almost
// never accepted and would test little); Gemma 3's Q4_K_M file follows
// llama.cpp's chunk-dependent kernels (kernels/cpu/matmul.h), so it runs one
// request at a time below, where both runs chunk alike.
INSTANTIATE_TEST_SUITE_P(Models, EngineSpeculative,
                         ::testing::Values("SmolLM2-135M-Instruct.Q4_1.gguf", "tiny-qwen3.gguf"),
                         test::model_name);

// A Q4_K_M file, whose K-quant matmuls sum in an order that depends on a
// token's place in its chunk: the verified drafts must still give the logits
// of one-token decode steps, bit for bit, or greedy outputs would drift.
class EngineSpeculativeQ4KM : public EngineSpeculative {};

TEST_P(EngineSpeculativeQ4KM, VerifiedDraftsAreComputedAsDecodeSteps) {
  std::vector<GenerationParams> reqs;
  for (int i = 0; i < 3; ++i) reqs.push_back(request(repeating_prompt(30 + 40 * i, 600 + i), 40));
  expect_same_with_speculation(engine_config(256, 1, 200), reqs);
}

INSTANTIATE_TEST_SUITE_P(Models, EngineSpeculativeQ4KM, ::testing::Values("gemma-3-270m-q4_k_m.gguf"),
                         test::model_name);

}  // namespace
}  // namespace inferd
