// The engine on each architecture: continuous batching, chunked prefill,
// preemption and prefix caching must not change a single token. Greedy
// outputs of requests sharing steps are compared with each request run alone
// by the single-sequence generator. Run on the default model and on the tiny
// random-weight models of the other architectures (tests/data/models), whose
// weight types sum in the same order whatever the chunking; the K-quant
// matmuls of Q4_K_M files follow llama.cpp's chunk-dependent kernels (see
// kernels/cpu/matmul.h, TokenPlace), so there the same holds only for equal
// chunking, as in llama.cpp. Each model runs with its KV cache in F16, and
// six of them in Q8_0, Q4_0, F8_E4M3 or BF16 too (batching_cases below), whose attention
// kernels sum in one order for every pass (kernels/cpu/attention_quant.h), so
// the same holds there.
// In the fast numerics tier (kernels/cpu/numerics.h) a token's products never
// depend on the step's shape, so all of this holds for K-quants too: the
// fast cases run the Q4_K_M model beside the default and tiny ones.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include "engine_test_util.h"

namespace inferd {
namespace {

using test::Outputs;

// A model file, the KV cache's dtype, the kernels' numerics tier, and whether
// sliding-window layers keep f16 (--kv-cache-dtype-skip-layers sliding_window).
using BatchingParam = std::tuple<std::string, DType, kernels::Numerics, bool>;

class EngineBatching : public test::ModelTest, public ::testing::WithParamInterface<BatchingParam> {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(use_model(std::get<0>(GetParam()), std::get<2>(GetParam())));
    if (IsSkipped()) return;
    use_kv_dtype(std::get<1>(GetParam()), std::get<3>(GetParam()));
    ModelTest::SetUp();
  }
};

TEST_P(EngineBatching, ConcurrentGreedyRequestsMatchEachRunAlone) {
  // 32 prompts from 1 to 1,500 tokens, spaced geometrically (1, 1, 2, ... 1500).
  constexpr int kRequests = 32;
  std::vector<GenerationParams> reqs;
  int64_t total_prompt = 0;
  for (int i = 0; i < kRequests; ++i) {
    const int64_t len = std::lround(std::pow(1500.0, i / double(kRequests - 1)));
    reqs.push_back(request(random_prompt(len, 100 + i), 8 + i % 9));
    total_prompt += len;
  }
  ASSERT_EQ(reqs.front().prompt_token_ids.size(), 1u);
  ASSERT_EQ(reqs.back().prompt_token_ids.size(), 1500u);

  // A small budget: the long prompts are prefilled in chunks of at most 128
  // tokens, in steps shared with other prompts' chunks and with decodes.
  auto engine = make_engine(engine_config(128, 64, 700));
  ASSERT_TRUE(engine);
  Outputs run;
  std::vector<std::string> ids;
  // Half arrive first (longest first, so short ones queue behind a long
  // prefill); the rest arrive while those run.
  for (int i = kRequests - 1; i >= kRequests / 2; --i) ids.push_back(add(*engine, reqs[i]));
  for (int s = 0; s < 5; ++s) test::step(*engine, run);
  for (int i = kRequests / 2 - 1; i >= 0; --i) ids.push_back(add(*engine, reqs[i]));
  test::run_until_idle(*engine, run);
  test::expect_idle_and_clean(*engine);

  const EngineStats st = engine->stats();
  EXPECT_EQ(st.scheduler.preemptions, 0);
  EXPECT_EQ(st.scheduler.max_step_tokens, 128);
  EXPECT_EQ(st.prompt_tokens, total_prompt);
  EXPECT_EQ(st.requests_added, kRequests);
  std::printf("%lld steps, %.1f tokens per step, %lld prompt tokens computed (%lld from cache)\n",
              static_cast<long long>(st.scheduler.steps), st.mean_tokens_per_step(),
              static_cast<long long>(st.computed_prompt_tokens),
              static_cast<long long>(st.scheduler.prefix_cache.hit_tokens));

  // Requests were added from the longest down: ids[k] is reqs[31 - k].
  for (int k = 0; k < kRequests; ++k) {
    const int i = kRequests - 1 - k;
    const GenerationParams& p = reqs[i];
    const test::Collected& c = run.requests[ids[k]];
    ASSERT_TRUE(c.finished) << "request " << i;
    EXPECT_EQ(c.final_output.status, RequestStatus::kFinishedLength) << "request " << i;
    EXPECT_EQ(c.tokens, run_alone(p.prompt_token_ids, p.max_tokens))
        << "request " << i << " (" << p.prompt_token_ids.size() << " prompt tokens)";
  }
}

TEST_P(EngineBatching, PromptPiecesOfOneTokenChangeNoBit) {
  // A step's budget can leave a prompt a piece of one token (here 33 and 65
  // tokens in steps of 32: a last piece of 1). That token is still a prompt
  // token: computed in a one-token decode's attention order instead of a
  // prompt pass's, it moved every later logprob (by up to 0.09 nats on the
  // default model), so the outputs depended on how the steps cut the prompt.
  // Every sampled token's logprob must equal, to the bit, the one of the same
  // request prefilled in one piece.
  constexpr int64_t kMaxTokens = 6;
  auto run = [&](int64_t budget, const std::vector<int32_t>& prompt) {
    auto engine = make_engine(engine_config(budget, 4, blocks_held_alone(128, budget) + 2, false));
    EXPECT_TRUE(engine);
    if (!engine) return std::vector<SampledLogprobs>{};
    GenerationParams p = request(prompt, kMaxTokens);
    p.logprobs = 0;
    const std::string id = add(*engine, std::move(p));
    Outputs out;
    test::run_until_idle(*engine, out);
    std::vector<SampledLogprobs> lps;
    for (const RequestOutput& d : out.requests[id].deltas) lps.insert(lps.end(), d.logprobs.begin(), d.logprobs.end());
    return lps;
  };
  for (const int64_t len : {33, 65}) {
    const std::vector<int32_t> prompt = random_prompt(len, 300 + static_cast<int>(len));
    const std::vector<SampledLogprobs> pieces = run(32, prompt), whole = run(128, prompt);
    ASSERT_EQ(pieces.size(), static_cast<size_t>(kMaxTokens));
    ASSERT_EQ(whole.size(), static_cast<size_t>(kMaxTokens));
    for (int64_t i = 0; i < kMaxTokens; ++i) {
      EXPECT_EQ(pieces[i].token, whole[i].token) << len << "-token prompt, output " << i;
      EXPECT_EQ(pieces[i].logprob, whole[i].logprob) << len << "-token prompt, output " << i;
    }
  }
}

TEST_P(EngineBatching, PreemptionUnderASmallKvPoolKeepsOutputsIdentical) {
  // 10 prompts of 20 to 335 tokens, 12 new tokens each. The largest needs 22
  // blocks (with one KV group; more on a model with windowed layers); a pool
  // of 4 blocks more runs two or three requests at a time, so decodes that
  // need a new block preempt the newest request.
  constexpr int64_t kMaxTokens = 12;
  std::vector<GenerationParams> reqs;
  for (int i = 0; i < 10; ++i)
    reqs.push_back(request(random_prompt(20 + 35 * i, 200 + i), kMaxTokens));
  auto engine = make_engine(engine_config(128, 16, blocks_held_alone(335 + kMaxTokens - 1, 128) + 5));
  ASSERT_TRUE(engine);
  std::vector<std::string> ids;
  for (const GenerationParams& p : reqs) ids.push_back(add(*engine, p));
  Outputs run;
  test::run_until_idle(*engine, run);
  test::expect_idle_and_clean(*engine);

  const EngineStats st = engine->stats();
  EXPECT_GT(st.scheduler.preemptions, 0);
  int64_t preempted = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const test::Collected& c = run.requests[ids[i]];
    ASSERT_TRUE(c.finished) << "request " << i;
    preempted += c.final_output.metrics.num_preemptions;
    EXPECT_EQ(c.final_output.status, RequestStatus::kFinishedLength);
    EXPECT_EQ(c.tokens, run_alone(reqs[i].prompt_token_ids, kMaxTokens)) << "request " << i;
  }
  EXPECT_EQ(preempted, st.scheduler.preemptions);
  // Preempted requests recomputed their tokens: more positions ran than the
  // requests have (prompt + all but the last output token).
  int64_t needed = 0;
  for (const GenerationParams& p : reqs) needed += static_cast<int64_t>(p.prompt_token_ids.size()) + kMaxTokens - 1;
  std::printf("%lld preemptions; %lld positions computed for %lld needed (%lld from cache)\n",
              static_cast<long long>(st.scheduler.preemptions),
              static_cast<long long>(st.computed_tokens), static_cast<long long>(needed),
              static_cast<long long>(st.scheduler.prefix_cache.hit_tokens));
  EXPECT_GT(st.computed_tokens + st.scheduler.prefix_cache.hit_tokens, needed);
}

TEST_P(EngineBatching, StateSlotsPassFromRequestToRequestWithoutCarryingState) {
  if (!model_->config().has_recurrent_layers()) GTEST_SKIP() << "no recurrent layers";
  // 12 requests of different lengths through an engine that runs 2 at a time:
  // its 2 state slots serve every request in turn, so each later request
  // starts in a slot that an earlier one left full of its state.
  std::vector<GenerationParams> reqs;
  for (int i = 0; i < 12; ++i) reqs.push_back(request(random_prompt(3 + 29 * i, 400 + i), 4 + i % 5));
  auto engine = make_engine(engine_config(64, 2, 200));
  ASSERT_TRUE(engine);
  std::vector<std::string> ids;
  for (const GenerationParams& p : reqs) ids.push_back(add(*engine, p));
  Outputs run;
  while (engine->has_pending_work()) {
    test::step(*engine, run);
    ASSERT_FALSE(HasFatalFailure());
    EXPECT_LE(engine->stats().scheduler.num_running, 2);
  }
  test::expect_idle_and_clean(*engine);
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(run.requests[ids[i]].finished) << "request " << i;
    EXPECT_EQ(run.requests[ids[i]].tokens, run_alone(reqs[i].prompt_token_ids, reqs[i].max_tokens))
        << "request " << i;
  }
}

TEST_P(EngineBatching, WindowedLayersGiveBackTheBlocksTheirWindowNoLongerReaches) {
  const KVLayout layout = kv_layout();
  int64_t window = 0, n_windowed = 0;
  for (int64_t w : layout.group_windows)
    if (w > 0) window = w, ++n_windowed;
  if (n_windowed == 0) GTEST_SKIP() << "no sliding-window layers";
  // A request several windows long, in 128-token chunks, then decodes.
  const int64_t n_prompt = 4 * window + 100, max_tokens = 24, bs = 16;
  auto engine = make_engine(engine_config(128, 4, layout.blocks_for_request(n_prompt + max_tokens, bs) + 1));
  ASSERT_TRUE(engine);
  const GenerationParams p = request(random_prompt(n_prompt, 5), max_tokens);
  const std::string id = add(*engine, p);
  Outputs run;
  const int64_t n_groups = layout.num_groups();
  int64_t decode_steps = 0, max_used = 0;
  auto ceil_blocks = [&](int64_t n) { return (n + bs - 1) / bs; };
  while (engine->has_pending_work()) {
    test::step(*engine, run);
    ASSERT_FALSE(HasFatalFailure());
    const SchedulerStats st = engine->stats().scheduler;
    if (st.num_running == 0) break;
    max_used = std::max<int64_t>(max_used, st.kv_used_blocks);
    if (st.last_step_tokens != 1) continue;
    // After a decode step that fed position n - 1: the full-attention groups
    // hold every block; each windowed group only the blocks from the one
    // holding position n - window (the oldest that token saw) on.
    const int64_t n = st.kv_held_tokens;
    const int64_t windowed_blocks = ceil_blocks(n) - std::max<int64_t>(0, n - window) / bs;
    EXPECT_EQ(st.kv_used_blocks, (n_groups - n_windowed) * ceil_blocks(n) + n_windowed * windowed_blocks)
        << "at " << n << " tokens";
    ++decode_steps;
  }
  EXPECT_EQ(decode_steps, max_tokens - 2);  // the last decode finishes the request: not counted
  // Without giving blocks back every group would hold the whole context.
  const int64_t total = n_prompt + max_tokens - 1;
  EXPECT_LE(max_used, blocks_held_alone(total, 128));
  EXPECT_LT(max_used, n_groups * ceil_blocks(total));
  std::printf("%lld KV groups (%lld windowed, window %lld): at most %lld blocks held for %lld tokens, "
              "%lld without freeing\n",
              static_cast<long long>(n_groups), static_cast<long long>(n_windowed), static_cast<long long>(window),
              static_cast<long long>(max_used), static_cast<long long>(total),
              static_cast<long long>(n_groups * ceil_blocks(total)));
  EXPECT_EQ(run.requests[id].tokens, run_alone(p.prompt_token_ids, max_tokens));
  test::expect_idle_and_clean(*engine);
}

TEST_P(EngineBatching, SharedSystemPromptIsComputedOnceAndCachingChangesNoOutput) {
  // Beside recurrent layers (qwen35) a prefix is taken only up to a snapshot
  // of its state: the first request keeps one at the last full block of its
  // prompt (592 here), where the others' hits end anyway.
  // A 600-token system prompt and a different user turn for each of 16 requests.
  const std::vector<int32_t> system = random_prompt(600, 7);
  std::vector<GenerationParams> reqs;
  int64_t total_prompt = 0;
  for (int i = 0; i < 16; ++i) {
    std::vector<int32_t> p = system;
    std::vector<int32_t> user = random_prompt(5 + 3 * i, 300 + i);
    user[0] = 1000 + i;  // user turns differ from their first token
    p.insert(p.end(), user.begin(), user.end());
    total_prompt += static_cast<int64_t>(p.size());
    reqs.push_back(request(std::move(p), 8));
  }

  // The first request arrives alone; the other 15 arrive once its prompt is
  // in the cache (before that, requests arriving together would each compute
  // the part of the prefix not yet cached).
  auto run_with = [&](bool caching, EngineStats* stats) {
    auto engine = make_engine(engine_config(128, 32, 800, caching));
    Outputs run;
    std::vector<std::string> ids{add(*engine, reqs[0])};
    while (run.requests[ids[0]].tokens.empty()) test::step(*engine, run);
    for (size_t i = 1; i < reqs.size(); ++i) ids.push_back(add(*engine, reqs[i]));
    test::run_until_idle(*engine, run);
    test::expect_idle_and_clean(*engine);
    *stats = engine->stats();
    std::vector<std::vector<int32_t>> outputs;
    for (const std::string& id : ids) {
      EXPECT_TRUE(run.requests[id].finished);
      outputs.push_back(run.requests[id].tokens);
    }
    return outputs;
  };
  EngineStats on, off;
  const auto with_cache = run_with(true, &on);
  const auto without_cache = run_with(false, &off);

  // 600 = 37 full blocks of 16 (592 tokens) and 8 tokens that share a block
  // with the user turn: each later request takes the 37 blocks from the cache.
  const int64_t hit_per_request = 37 * 16;
  EXPECT_EQ(on.scheduler.prefix_cache.requests, 16);
  EXPECT_EQ(on.scheduler.prefix_cache.queried_tokens, total_prompt);
  EXPECT_EQ(on.scheduler.prefix_cache.hit_tokens, 15 * hit_per_request);
  EXPECT_EQ(on.prompt_tokens, total_prompt);
  EXPECT_EQ(on.computed_prompt_tokens, total_prompt - 15 * hit_per_request);
  EXPECT_EQ(off.scheduler.prefix_cache.hit_tokens, 0);
  EXPECT_EQ(off.computed_prompt_tokens, total_prompt);
  EXPECT_EQ(on.scheduler.preemptions, 0);
  EXPECT_EQ(off.scheduler.preemptions, 0);
  std::printf("prompt tokens computed: %lld with the prefix cache, %lld without\n",
              static_cast<long long>(on.computed_prompt_tokens),
              static_cast<long long>(off.computed_prompt_tokens));

  ASSERT_EQ(with_cache.size(), without_cache.size());
  for (size_t i = 0; i < with_cache.size(); ++i) {
    EXPECT_EQ(with_cache[i].size(), 8u) << "request " << i;
    EXPECT_EQ(with_cache[i], without_cache[i]) << "request " << i;
  }
}

// Every model with its cache in F16; the quantized caches on models that
// cover their cases between them (the default model; sliding windows and
// sinks; KV groups of windowed layers; shared experts; a latent cache), each
// in one dtype: the
// quantized kernels sum in one order whatever the pass, so a further pairing
// would test the same thing again for minutes of CI.
std::vector<BatchingParam> batching_cases() {
  std::vector<BatchingParam> cases;
  for (const char* model : {"SmolLM2-135M-Instruct.Q4_1.gguf", "tiny-qwen3.gguf", "tiny-qwen3moe.gguf",
                            "tiny-llama3.gguf", "tiny-gemma3.gguf", "tiny-gpt-oss.gguf", "tiny-glm4moe.gguf",
                            "tiny-deepseek2.gguf", "tiny-qwen35.gguf", "tiny-qwen35moe.gguf",
                            "tiny-nemotron-h.gguf"})
    cases.emplace_back(model, DType::F16, kernels::Numerics::kExact, false);
  cases.emplace_back("SmolLM2-135M-Instruct.Q4_1.gguf", DType::Q8_0, kernels::Numerics::kExact, false);
  cases.emplace_back("tiny-gpt-oss.gguf", DType::Q4_0, kernels::Numerics::kExact, false);
  cases.emplace_back("tiny-gemma3.gguf", DType::Q8_0, kernels::Numerics::kExact, false);
  // Two dtypes in one pool: q8_0 global layers, f16 windowed ones.
  cases.emplace_back("tiny-gemma3.gguf", DType::Q8_0, kernels::Numerics::kExact, true);
  cases.emplace_back("tiny-glm4moe.gguf", DType::Q4_0, kernels::Numerics::kExact, false);
  cases.emplace_back("tiny-llama3.gguf", DType::F8_E4M3, kernels::Numerics::kExact, false);
  cases.emplace_back("tiny-qwen3.gguf", DType::BF16, kernels::Numerics::kExact, false);
  cases.emplace_back("tiny-deepseek2.gguf", DType::Q8_0, kernels::Numerics::kExact, false);
  // The fast tier: dense, mixture-of-experts (gathered expert inputs), MXFP4
  // experts, latent attention, sliding windows, and K-quants.
  for (const char* model : {"SmolLM2-135M-Instruct.Q4_1.gguf", "tiny-qwen3moe.gguf", "tiny-gpt-oss.gguf",
                            "tiny-deepseek2.gguf", "tiny-gemma3.gguf", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"})
    cases.emplace_back(model, DType::F16, kernels::Numerics::kFast, false);
  cases.emplace_back("tiny-qwen3.gguf", DType::Q8_0, kernels::Numerics::kFast, false);
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Models, EngineBatching, ::testing::ValuesIn(batching_cases()),
                         [](const ::testing::TestParamInfo<BatchingParam>& info) {
                           const std::string model =
                               test::model_name({std::get<0>(info.param), info.index});
                           return model + "_" + dtype_name(std::get<1>(info.param)) +
                                  (std::get<3>(info.param) ? "_skip_sliding_window" : "") +
                                  (std::get<2>(info.param) == kernels::Numerics::kFast ? "_fast" : "");
                         });

}  // namespace
}  // namespace inferd
