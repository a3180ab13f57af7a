// The default model's forward pass against llama.cpp, the independent
// reference: last-position logits for 20 prompts of 1 to 1,000 tokens, and
// 64-token greedy continuations. Reference data: tools/reference/logits_reference.py.
// The prompts are fed as llama.cpp's token ids, so this test does not depend
// on our tokenizer. The tolerance is justified in docs/design.md.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "engine/sequence_generator.h"
#include "engine_test_util.h"

namespace inferd {
namespace {

// Our forward pass reproduces llama.cpp's CPU arithmetic bit for bit up to the
// output projection (docs/design.md, "Logit tolerance"); only that last
// product, over the 576-wide final hidden state, sums in another order (llama.cpp
// runs its repacked Q8_0 kernel there). That moves a logit by about 1e-5.
constexpr float kLogitTolerance = 1e-3f;
// A greedy divergence is accepted only where llama.cpp's own top-2 logits are
// closer than the tolerance; the issue asks for 19 identical continuations of 20.
constexpr float kNearTieGap = kLogitTolerance;
constexpr int kMinIdenticalContinuations = 19;

std::string data_dir() { return std::string(INFERD_TEST_DATA_DIR) + "/logits"; }

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in) << "missing " << path;
  return nlohmann::json::parse(in);
}

using LlamaCppReference = test::ModelTest;

// One pass per prompt: prefill (compare the last-position logits), then 64
// greedy steps from a fresh cache (compare the continuation).
TEST_F(LlamaCppReference, LogitsAndGreedyContinuationsMatch) {
  const nlohmann::json prompts = read_json(data_dir() + "/prompts.json");
  const nlohmann::json greedy = read_json(data_dir() + "/greedy.json");
  ASSERT_EQ(prompts.size(), greedy.size());
  const int64_t n_vocab = model_->config().n_vocab;
  std::ifstream lf(data_dir() + "/last_logits.f32", std::ios::binary);
  ASSERT_TRUE(lf);
  std::vector<float> ref(prompts.size() * n_vocab);
  lf.read(reinterpret_cast<char*>(ref.data()), static_cast<std::streamsize>(ref.size() * 4));
  ASSERT_EQ(lf.gcount(), static_cast<std::streamsize>(ref.size() * 4));

  int identical = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::string name = prompts[i]["name"];
    const std::vector<int32_t> ids = prompts[i]["ids"].get<std::vector<int32_t>>();
    SequenceGenerator gen(*model_, *pool_, 1200);
    auto logits = gen.prompt_logits(ids);
    ASSERT_TRUE(logits.ok()) << logits.error().message;
    const float* want = &ref[i * n_vocab];
    double sum_abs = 0;
    float max_abs = 0;
    for (int64_t v = 0; v < n_vocab; ++v) {
      const float d = std::fabs((*logits)[v] - want[v]);
      sum_abs += d;
      max_abs = std::max(max_abs, d);
    }
    EXPECT_LE(max_abs, kLogitTolerance) << name << " (" << ids.size() << " tokens)";

    // Greedy continuation from a fresh cache, as llama.cpp ran it: the whole
    // prompt prefilled (so step 0 comes from prefill logits), then one token
    // per step. Reusing the cache above would recompute the last prompt token
    // alone, a decode pass, whose summation order is not llama.cpp's prefill one.
    const std::vector<int32_t> want_tokens = greedy[i]["tokens"].get<std::vector<int32_t>>();
    const std::vector<float> gaps = greedy[i]["top2_gaps"].get<std::vector<float>>();
    GenerationOptions o;
    o.max_tokens = static_cast<int64_t>(want_tokens.size());
    o.sampling.temperature = 0.0f;
    o.stop_at_end_of_generation = false;
    SequenceGenerator fresh(*model_, *pool_, 1200);
    auto got = fresh.generate(ids, o, [](int32_t) { return true; });
    ASSERT_TRUE(got.ok()) << got.error().message;
    size_t first_diff = 0;
    while (first_diff < want_tokens.size() && first_diff < got->size() &&
           (*got)[first_diff] == want_tokens[first_diff])
      ++first_diff;
    std::printf("[ info ] %-28s %4zu tokens  max|d| %.2e  mean|d| %.2e  ", name.c_str(), ids.size(), max_abs,
                sum_abs / n_vocab);
    if (first_diff == want_tokens.size()) {
      ++identical;
      std::printf("continuation identical\n");
      continue;
    }
    std::printf("diverges at step %zu (llama.cpp top-2 gap %.4f)\n", first_diff, gaps[first_diff]);
    // A divergence is acceptable only where llama.cpp itself nearly tied.
    EXPECT_LT(gaps[first_diff], kNearTieGap)
        << name << " diverges at step " << first_diff << " where llama.cpp's top-2 gap is "
        << gaps[first_diff];
  }
  std::printf("[ info ] %d of %zu continuations identical\n", identical, prompts.size());
  EXPECT_GE(identical, kMinIdenticalContinuations);
}

}  // namespace
}  // namespace inferd
