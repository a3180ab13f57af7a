// The default model's forward pass against llama.cpp, the independent
// reference: last-position logits for 20 prompts of 1 to 1,000 tokens, and
// 64-token greedy continuations. Reference data: tools/reference/logits_reference.py.
// The prompts are fed as llama.cpp's token ids, so this test does not depend
// on our tokenizer. The tolerance is justified in docs/design.md.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "engine/sequence_generator.h"

namespace inferd {
namespace {

// Max |our logit - llama.cpp's| allowed at any vocabulary entry (see
// docs/design.md, "Logit tolerance").
constexpr float kLogitTolerance = 0.35f;

std::string data_dir() { return std::string(INFERD_TEST_DATA_DIR) + "/logits"; }

std::string model_path() {
  const char* d = std::getenv("INFERD_MODEL_DIR");
  std::string dir = d && *d ? d : std::string(std::getenv("HOME") ? std::getenv("HOME") : ".") + "/.cache/inferd/models";
  return dir + "/SmolLM2-135M-Instruct.Q4_1.gguf";
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in) << "missing " << path;
  return nlohmann::json::parse(in);
}

class LlamaCppReference : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::ifstream(model_path())) return;
    LoadOptions o;
    o.prefault = false;
    auto m = Model::load(model_path(), o);
    ASSERT_TRUE(m.ok()) << m.error().message;
    model_ = std::move(*m).release();
    pool_ = new ThreadPool(2);
  }
  static void TearDownTestSuite() {
    delete model_;
    delete pool_;
  }
  void SetUp() override {
    if (!model_) GTEST_SKIP() << "default model not found at " << model_path()
                              << " (run scripts/fetch_models.sh)";
  }
  static Model* model_;
  static ThreadPool* pool_;
};
Model* LlamaCppReference::model_ = nullptr;
ThreadPool* LlamaCppReference::pool_ = nullptr;

TEST_F(LlamaCppReference, LastPositionLogitsWithinTolerance) {
  const nlohmann::json prompts = read_json(data_dir() + "/prompts.json");
  const int64_t n_vocab = model_->config().n_vocab;
  std::ifstream lf(data_dir() + "/last_logits.f32", std::ios::binary);
  ASSERT_TRUE(lf);
  std::vector<float> ref(prompts.size() * n_vocab);
  lf.read(reinterpret_cast<char*>(ref.data()), static_cast<std::streamsize>(ref.size() * 4));
  ASSERT_EQ(lf.gcount(), static_cast<std::streamsize>(ref.size() * 4));

  float worst = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::vector<int32_t> ids = prompts[i]["ids"].get<std::vector<int32_t>>();
    SequenceGenerator fresh(*model_, *pool_, 1200);
    auto logits = fresh.prompt_logits(ids);
    ASSERT_TRUE(logits.ok()) << logits.error().message;
    float max_diff = 0, max_abs = 0;
    int64_t worst_tok = 0;
    for (int64_t v = 0; v < n_vocab; ++v) {
      const float d = std::fabs((*logits)[v] - ref[i * n_vocab + v]);
      if (d > max_diff) max_diff = d, worst_tok = v;
      max_abs = std::max(max_abs, std::fabs(ref[i * n_vocab + v]));
    }
    worst = std::max(worst, max_diff);
    EXPECT_LE(max_diff, kLogitTolerance)
        << "prompt " << prompts[i]["name"] << " (" << ids.size() << " tokens): token " << worst_tok
        << " differs by " << max_diff << " (largest |logit| " << max_abs << ")";
  }
  std::cout << "[ info ] largest logit difference over all prompts: " << worst << "\n";
}

TEST_F(LlamaCppReference, GreedyContinuationsMatch) {
  const nlohmann::json prompts = read_json(data_dir() + "/prompts.json");
  const nlohmann::json greedy = read_json(data_dir() + "/greedy.json");
  ASSERT_EQ(prompts.size(), greedy.size());
  int identical = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::vector<int32_t> ids = prompts[i]["ids"].get<std::vector<int32_t>>();
    const std::vector<int32_t> want = greedy[i]["tokens"].get<std::vector<int32_t>>();
    const std::vector<float> gaps = greedy[i]["top2_gaps"].get<std::vector<float>>();
    SequenceGenerator gen(*model_, *pool_, 1200);
    GenerationOptions o;
    o.max_tokens = static_cast<int64_t>(want.size());
    o.sampling.temperature = 0.0f;
    o.stop_at_end_of_generation = false;
    auto got = gen.generate(ids, o, [](int32_t) { return true; });
    ASSERT_TRUE(got.ok()) << got.error().message;
    size_t first_diff = 0;
    while (first_diff < want.size() && first_diff < got->size() && (*got)[first_diff] == want[first_diff])
      ++first_diff;
    if (first_diff == want.size()) {
      ++identical;
      continue;
    }
    // A divergence is acceptable only where llama.cpp itself nearly tied.
    EXPECT_LT(gaps[first_diff], kLogitTolerance)
        << "prompt " << prompts[i]["name"] << " diverges at step " << first_diff
        << " where llama.cpp's top-2 gap is " << gaps[first_diff];
    std::cout << "[ info ] prompt " << prompts[i]["name"] << " diverges at step " << first_diff
              << " (llama.cpp top-2 gap " << gaps[first_diff] << ")\n";
  }
  EXPECT_GE(identical, static_cast<int>(prompts.size()) - 1)
      << identical << " of " << prompts.size() << " continuations are identical";
}

}  // namespace
}  // namespace inferd
