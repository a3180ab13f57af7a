// Each model's forward pass against llama.cpp, the independent reference:
// last-position logits for 20 prompts, and 20 greedy continuations. One test per
// directory of tests/data/logits/ (made by tools/reference/logits_reference.py):
// its meta.json names the model file, looked up in INFERD_MODEL_DIR (default
// ~/.cache/inferd/models) and then in tests/data/models/ (the tiny random-weight
// models of tools/reference/make_tiny_models.py), and the GGML build whose
// arithmetic made the data ("ggml_flavour": avx512 or avx2), which the model is
// loaded to follow. The prompts are fed as llama.cpp's token ids, so this test
// does not depend on our tokenizer. The tolerance is justified in docs/design.md.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/sequence_generator.h"
#include "engine_test_util.h"
#include "kernels/cpu/flavour.h"
#include "model/model.h"
#include "test_data.h"

namespace inferd {
namespace {

namespace fs = std::filesystem;

// Our forward pass reproduces llama.cpp's CPU arithmetic bit for bit up to the
// output projection (docs/design.md, "Logit tolerance"); only that last
// product, over the final hidden state, may sum in another order (llama.cpp
// runs a repacked kernel there). That moves a logit by about 1e-5.
constexpr float kLogitTolerance = 1e-3f;
// A greedy divergence is accepted only where llama.cpp's own top-2 logits are
// closer than the tolerance; at least 19 of 20 continuations must be identical.
constexpr float kNearTieGap = kLogitTolerance;
constexpr int kMinIdenticalOf20 = 19;

// Every directory of tests/data/logits/ with a meta.json, sorted.
std::vector<std::string> reference_dirs() { return test::logits_dirs_with("meta.json"); }


class LlamaCppReference : public ::testing::TestWithParam<std::string> {};

// One pass per prompt: prefill (compare the last-position logits), then the
// greedy steps from a fresh cache (compare the continuation).
TEST_P(LlamaCppReference, LogitsAndGreedyContinuationsMatch) {
  const std::string dir = test::logits_root() + "/" + GetParam();
  const nlohmann::json meta = test::read_json(dir + "/meta.json");
  ASSERT_TRUE(meta.is_object());
  ASSERT_TRUE(meta.contains("model_file")) << dir << "/meta.json names no model_file";
  const std::string model_file = meta["model_file"].get<std::string>();
  const std::string path = test::find_model_file(model_file);
  ASSERT_FALSE(path.empty()) << "model file " << model_file << " (for " << dir << ") not found in "
                             << test::model_dir() << " nor in " << inferd::test::test_data_root()
                             << "/models: run scripts/fetch_models.sh --all, or set INFERD_MODEL_DIR";
  if (const std::string why = test::large_model_skip(path); !why.empty()) GTEST_SKIP() << why;
  ASSERT_TRUE(meta.contains("ggml_flavour")) << dir << "/meta.json has no ggml_flavour";
  const std::string flavour_name = meta["ggml_flavour"].get<std::string>();
  const std::optional<kernels::GgmlFlavour> flavour = kernels::parse_ggml_flavour(flavour_name);
  ASSERT_TRUE(flavour.has_value()) << "unknown ggml_flavour \"" << flavour_name << "\" in " << dir;

  LoadOptions lo;
  lo.prefault = false;
  lo.ggml_flavour = *flavour;
  lo.n_threads = 2;
  auto loaded = Model::load(path, lo);
  ASSERT_TRUE(loaded.ok()) << path << ": " << loaded.error().message;
  std::unique_ptr<Model> model = std::move(*loaded);

  const nlohmann::json prompts = test::read_json(dir + "/prompts.json");
  const nlohmann::json greedy = test::read_json(dir + "/greedy.json");
  ASSERT_EQ(prompts.size(), greedy.size());
  ASSERT_FALSE(prompts.empty());
  const int64_t n_vocab = model->config().n_vocab;
  ASSERT_EQ(n_vocab, meta.value("n_vocab", int64_t{-1})) << "the model's vocabulary is not the reference's";
  std::ifstream lf(dir + "/last_logits.f32", std::ios::binary);
  ASSERT_TRUE(lf) << "missing " << dir << "/last_logits.f32";
  std::vector<float> ref(prompts.size() * n_vocab);
  lf.read(reinterpret_cast<char*>(ref.data()), static_cast<std::streamsize>(ref.size() * 4));
  ASSERT_EQ(lf.gcount(), static_cast<std::streamsize>(ref.size() * 4));

  int64_t max_context = 0;
  for (size_t i = 0; i < prompts.size(); ++i)
    max_context = std::max<int64_t>(max_context, prompts[i]["ids"].size() + greedy[i]["tokens"].size());
  max_context += 16;

  std::printf("[ info ] %s: %s (%s), GGML %s arithmetic\n", GetParam().c_str(), model_file.c_str(),
              meta.value("architecture", std::string("?")).c_str(), flavour_name.c_str());
  int identical = 0;
  float worst_max_abs = -1;
  std::string worst_prompt;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::string name = prompts[i]["name"];
    const std::vector<int32_t> ids = prompts[i]["ids"].get<std::vector<int32_t>>();
    // One fresh prefill per prompt, as llama.cpp ran it: the whole prompt
    // (so step 0 comes from prefill logits, which are also compared), then
    // one token per step. A second call on the same cache would recompute the
    // last prompt token alone, a decode pass, whose order is not the prefill's.
    const std::vector<int32_t> want_tokens = greedy[i]["tokens"].get<std::vector<int32_t>>();
    const std::vector<float> gaps = greedy[i]["top2_gaps"].get<std::vector<float>>();
    std::vector<float> prompt_logits;
    auto got = test::fresh_greedy(*model, max_context, ids, static_cast<int64_t>(want_tokens.size()), prompt_logits);
    ASSERT_TRUE(got.ok()) << name << ": " << got.error().message;
    ASSERT_EQ(static_cast<int64_t>(prompt_logits.size()), n_vocab);
    const std::vector<float>* logits = &prompt_logits;
    const float* want = &ref[i * n_vocab];
    double sum_abs = 0;
    float max_abs = 0;
    for (int64_t v = 0; v < n_vocab; ++v) {
      const float d = std::fabs((*logits)[v] - want[v]);
      sum_abs += d;
      max_abs = std::max(max_abs, d);
    }
    if (!(max_abs <= worst_max_abs)) {  // NaN counts as worst
      worst_max_abs = max_abs;
      worst_prompt = name;
    }
    EXPECT_LE(max_abs, kLogitTolerance) << GetParam() << ": " << name << " (" << ids.size() << " tokens)";

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
    if (first_diff >= gaps.size()) {  // ours stopped early
      std::printf("stops after %zu of %zu tokens\n", got->size(), want_tokens.size());
      ADD_FAILURE() << GetParam() << ": " << name << " gave " << got->size() << " tokens, llama.cpp "
                    << want_tokens.size();
      continue;
    }
    std::printf("diverges at step %zu (llama.cpp top-2 gap %.4f)\n", first_diff, gaps[first_diff]);
    // A divergence is acceptable only where llama.cpp itself nearly tied.
    EXPECT_LT(gaps[first_diff], kNearTieGap)
        << GetParam() << ": " << name << " diverges at step " << first_diff
        << " where llama.cpp's top-2 gap is " << gaps[first_diff];
  }
  const int n = static_cast<int>(prompts.size());
  // 19 of 20, and the same share for a set of another size.
  const int min_identical = n - (n * (20 - kMinIdenticalOf20) + 19) / 20;
  std::printf("[ info ] %s: %d of %d continuations identical, max|d| %.2e (%s)\n", GetParam().c_str(), identical,
              n, worst_max_abs, worst_prompt.c_str());
  EXPECT_GE(identical, min_identical) << GetParam();
}

std::string test_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string n = info.param;
  for (char& c : n) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return n;
}

INSTANTIATE_TEST_SUITE_P(Models, LlamaCppReference, ::testing::ValuesIn(reference_dirs()), test_name);

// The data set itself: every reference directory is complete and says which
// model and which GGML build made it, so that a new model's data cannot be
// silently skipped.
TEST(LlamaCppReferenceData, EveryDirectoryIsComplete) {
  const std::vector<std::string> dirs = reference_dirs();
  EXPECT_GE(dirs.size(), 1u) << "no reference data under " << test::logits_root();
  for (const fs::directory_entry& e : fs::directory_iterator(test::logits_root())) {
    EXPECT_TRUE(e.is_directory()) << e.path() << ": reference data lives in one directory per model";
  }
  for (const std::string& d : dirs) {
    const nlohmann::json meta = test::read_json(test::logits_root() + "/" + d + "/meta.json");
    EXPECT_TRUE(meta.contains("model_file")) << d;
    EXPECT_TRUE(meta.contains("model_sha256")) << d;
    EXPECT_TRUE(meta.contains("ggml_flavour") &&
                kernels::parse_ggml_flavour(meta["ggml_flavour"].get<std::string>()).has_value())
        << d;
    for (const char* f : {"prompts.json", "greedy.json", "last_logits.f32"})
      EXPECT_TRUE(fs::exists(test::logits_root() + "/" + d + "/" + f)) << d << "/" << f;
  }
}

}  // namespace
}  // namespace inferd
