// Prompt logprobs against llama.cpp: for each directory of tests/data/logits/
// with a prompt_logprobs.json (tools/reference/logits_reference.py
// --prompt-logprobs: llama-cpp-python's logits at every prompt position, with
// logits_all, as a float64 log-softmax), the engine scores the same prompt ids
// (GenerationParams::prompt_logprobs) and every position's logprob of the next
// prompt token and its top alternatives must agree.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "engine_test_util.h"
#include "kernels/cpu/flavour.h"
#include "test_data.h"

namespace inferd {
namespace {

namespace fs = std::filesystem;

// The logits tests' tolerance (engine_llamacpp_reference_test.cpp: a logit
// within 1e-3 of llama.cpp's), twice: a logprob is a logit less the
// log-sum-exp of the row, which may move by as much again. At a position
// where llama.cpp disagrees with itself by more (llamacpp_spread: the same
// position computed last in its own prefix, another batch shape; up to 0.2
// on Qwen2.5-Coder-1.5B), that spread is the tolerance there: no engine can
// be held closer to llama.cpp than llama.cpp is to itself.
constexpr double kLogprobTolerance = 2 * 1e-3;

std::vector<std::string> scored_dirs() { return test::logits_dirs_with("prompt_logprobs.json"); }


class PromptLogprobsReference : public ::testing::TestWithParam<std::string> {};

TEST_P(PromptLogprobsReference, EveryPositionMatchesLlamaCpp) {
  const std::string dir = test::logits_root() + "/" + GetParam();
  const nlohmann::json meta = test::read_json(dir + "/meta.json");
  const std::string model_file = meta["model_file"].get<std::string>();
  const std::string path = test::find_model_file(model_file);
  ASSERT_FALSE(path.empty()) << model_file << " not found in " << test::model_dir() << " nor in "
                             << inferd::test::test_data_root() << "/models: run scripts/fetch_models.sh --all";
  if (const std::string why = test::large_model_skip(path); !why.empty()) GTEST_SKIP() << why;
  const std::optional<kernels::GgmlFlavour> flavour = kernels::parse_ggml_flavour(meta["ggml_flavour"].get<std::string>());
  ASSERT_TRUE(flavour.has_value());
  LoadOptions lo;
  lo.prefault = false;
  lo.ggml_flavour = *flavour;
  lo.n_threads = 2;
  auto model = Model::load(path, lo);
  ASSERT_TRUE(model.ok()) << path << ": " << model.error().message;

  const nlohmann::json scored = test::read_json(dir + "/prompt_logprobs.json");
  ASSERT_FALSE(scored.empty());
  EngineConfig config;
  config.kv_cache_bytes = 64 << 20;
  config.warm_up = false;
  auto engine = Engine::create(**model, config);
  ASSERT_TRUE(engine.ok()) << engine.error().message;
  // Every prompt in one batch: each is scored as it would be alone.
  std::map<std::string, const nlohmann::json*> by_id;
  for (const nlohmann::json& p : scored) {
    GenerationParams g;
    g.prompt_token_ids = p["ids"].get<std::vector<int32_t>>();
    g.max_tokens = 1;
    g.sampling.temperature = 0.0f;
    g.prompt_logprobs = static_cast<int32_t>(p["top"][0].size());
    auto h = (*engine)->add_request(std::move(g));
    ASSERT_TRUE(h.ok()) << h.error().message;
    by_id[h->request_id] = &p;
  }
  test::Outputs run;
  test::run_until_idle(**engine, run);

  double worst = 0;
  size_t positions_at_spread = 0;
  for (const auto& [id, p] : by_id) {
    const std::string name = (*p)["name"];
    std::vector<SampledLogprobs> got;
    for (const RequestOutput& o : run.requests[id].deltas)
      got.insert(got.end(), o.prompt_logprobs.begin(), o.prompt_logprobs.end());
    const std::vector<int32_t> ids = (*p)["ids"].get<std::vector<int32_t>>();
    const std::vector<double> want = (*p)["logprobs"].get<std::vector<double>>();
    const nlohmann::json& want_top = (*p)["top"];
    const std::vector<double> spread = (*p)["llamacpp_spread"].get<std::vector<double>>();
    ASSERT_EQ(got.size(), want.size()) << name;
    ASSERT_EQ(spread.size(), want.size()) << name;
    for (size_t i = 0; i < got.size(); ++i) {
      const double tolerance = std::max(kLogprobTolerance, spread[i]);
      if (spread[i] > kLogprobTolerance) ++positions_at_spread;
      EXPECT_EQ(got[i].token, ids[i + 1]) << name << " position " << i;
      EXPECT_NEAR(got[i].logprob, want[i], tolerance) << name << " position " << i;
      worst = std::max(worst, std::fabs(got[i].logprob - want[i]));
      ASSERT_EQ(got[i].top.size(), want_top[i].size()) << name;
      for (size_t j = 0; j < got[i].top.size(); ++j) {
        const double ref = want_top[i][j][1].get<double>();
        EXPECT_NEAR(got[i].top[j].logprob, ref, tolerance) << name << " position " << i << " rank " << j + 1;
        // The same token at each rank, unless llama.cpp's neighbours there are closer than the tolerance.
        const bool near_tie = (j > 0 && want_top[i][j - 1][1].get<double>() - ref < tolerance) ||
                              (j + 1 < want_top[i].size() && ref - want_top[i][j + 1][1].get<double>() < tolerance);
        if (!near_tie) {
          EXPECT_EQ(got[i].top[j].token, want_top[i][j][0].get<int32_t>())
              << name << " position " << i << " rank " << j + 1;
        }
      }
    }
  }
  std::printf("[ info ] %s: %zu prompts, largest logprob difference %.3g; %zu positions where llama.cpp's own spread "
              "exceeds %.3g\n",
              GetParam().c_str(), by_id.size(), worst, positions_at_spread, kLogprobTolerance);
}

std::string test_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string n = info.param;
  for (char& c : n)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return n;
}

INSTANTIATE_TEST_SUITE_P(Models, PromptLogprobsReference, ::testing::ValuesIn(scored_dirs()), test_name);

// Every model with llama.cpp reference data has its prompts scored too, so a
// new reference directory cannot skip this check.
TEST(PromptLogprobsReferenceData, EveryReferenceModelIsScored) {
  const std::vector<std::string> with_meta = test::logits_dirs_with("meta.json");
  EXPECT_GE(with_meta.size(), 2u);
  EXPECT_EQ(scored_dirs(), with_meta) << "run tools/reference/logits_reference.py --prompt-logprobs on each directory "
                                         "(with a llama.cpp build of the directory's ggml_flavour)";
}

}  // namespace
}  // namespace inferd
