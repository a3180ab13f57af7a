// Beam search against an independent one. tools/reference/beam_search_reference.py runs
// vLLM's beam search, written in Python, over llama.cpp's logits for the default model (a
// handful of prompts; widths 2, 3 and 4; several length penalties and early-stopping
// settings; chats whose beams end with <|im_end|>) and writes the beams it returns to
// tests/data/beam_search/smollm2-135m.json. Here the engine runs the same requests, all at
// once, its beams sharing KV blocks (the partial one copied on write), and must return the
// same beams in the same order with cumulative logprobs within a small tolerance. As in the
// logits reference test, the model is loaded to follow the GGML build that made the data
// (ggml_flavour) and must be present (scripts/fetch_models.sh).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine_test_util.h"
#include "kernels/cpu/flavour.h"
#include "model/model.h"
#include "test_data.h"

namespace inferd {
namespace {

// Our logits follow llama.cpp's bit for bit but for the output projection's order of
// summation (about 1e-5 a logit, docs/design.md); over 12 tokens that stays far below this.
constexpr double kCumulativeTolerance = 1e-3;

std::string data_path() { return inferd::test::test_data_root() + "/beam_search/smollm2-135m.json"; }

EarlyStopping early_stopping_of(const nlohmann::json& v) {
  if (v.is_boolean()) return v.get<bool>() ? EarlyStopping::kTrue : EarlyStopping::kFalse;
  EXPECT_EQ(v, "never");
  return EarlyStopping::kNever;
}

TEST(BeamSearchReference, TheEnginesBeamsAreAPythonBeamSearchOverLlamaCppLogits) {
  std::ifstream in(data_path());
  ASSERT_TRUE(in) << "missing " << data_path() << " (tools/reference/beam_search_reference.py writes it)";
  const nlohmann::json data = nlohmann::json::parse(in);
  const std::string model_file = data.at("model_file").get<std::string>();
  const std::string path = test::find_model_file(model_file);
  ASSERT_FALSE(path.empty()) << model_file << " not found in " << test::model_dir()
                             << ": run scripts/fetch_models.sh, or set INFERD_MODEL_DIR";
  if (const std::string why = test::large_model_skip(path); !why.empty()) GTEST_SKIP() << why;
  const std::optional<kernels::GgmlFlavour> flavour =
      kernels::parse_ggml_flavour(data.at("ggml_flavour").get<std::string>());
  ASSERT_TRUE(flavour.has_value()) << data.at("ggml_flavour");
  LoadOptions lo;
  lo.prefault = false;
  lo.ggml_flavour = *flavour;
  lo.n_threads = 2;
  auto model = Model::load(path, lo);
  ASSERT_TRUE(model.ok()) << model.error().message;

  const nlohmann::json& cases = data.at("cases");
  ASSERT_GE(cases.size(), 10u);
  int32_t seats = 0;
  for (const nlohmann::json& c : cases) seats += c.at("beam_width").get<int32_t>();
  EngineConfig config;
  config.max_num_seqs = seats;
  config.max_model_len = 256;
  config.kv_cache_bytes = static_cast<int64_t>(KVCache::block_bytes((*model)->config(), config.block_size)) *
                          (int64_t{seats} * 16 + 1);
  auto engine = Engine::create(**model, config);
  ASSERT_TRUE(engine.ok()) << engine.error().message;

  // Every case at once: the beams of different requests share steps.
  std::map<std::string, const nlohmann::json*> by_id;
  for (const nlohmann::json& c : cases) {
    GenerationParams p;
    p.request_id = c.at("name").get<std::string>();
    p.prompt_token_ids = c.at("prompt_ids").get<std::vector<int32_t>>();
    p.max_tokens = c.at("max_tokens").get<int64_t>();
    BeamSearchParams bs;
    bs.beam_width = c.at("beam_width").get<int32_t>();
    bs.length_penalty = c.at("length_penalty").get<float>();
    bs.early_stopping = early_stopping_of(c.at("early_stopping"));
    p.beam_search = bs;
    auto h = (*engine)->add_request(std::move(p));
    ASSERT_TRUE(h.ok()) << h.error().message;
    by_id[h->request_id] = &c;
  }
  test::Outputs run;
  test::run_until_idle(**engine, run);
  test::expect_idle_and_clean(**engine);

  int checked = 0;
  for (const auto& [id, c] : by_id) {
    SCOPED_TRACE(id);
    const test::Collected& got = run.requests[id];
    ASSERT_TRUE(got.finished);
    EXPECT_EQ(got.deltas.size(), 1u) << "a beam search emits its final output only";
    const std::vector<BeamOutput>& beams = got.final_output.beams;
    const nlohmann::json& want = c->at("beams");
    ASSERT_EQ(beams.size(), want.size());
    for (size_t i = 0; i < beams.size(); ++i) {
      EXPECT_EQ(beams[i].token_ids, want[i].at("token_ids").get<std::vector<int32_t>>()) << "beam " << i;
      EXPECT_NEAR(beams[i].cumulative_logprob, want[i].at("cumulative_logprob").get<double>(), kCumulativeTolerance)
          << "beam " << i;
      EXPECT_STREQ(finish_reason(beams[i].status), want[i].at("finish_reason").get<std::string>().c_str())
          << "beam " << i;
      EXPECT_EQ(beams[i].text, want[i].at("text").get<std::string>()) << "beam " << i;
    }
    // The request's own tokens and text are its best beam's.
    EXPECT_EQ(got.final_output.token_ids, beams.at(0).token_ids);
    EXPECT_EQ(got.final_output.text, beams.at(0).text);
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(cases.size()));
}

}  // namespace
}  // namespace inferd
