// Perplexity (engine/perplexity.h) against llama.cpp's llama-perplexity on the
// committed corpus: one test per file of tests/data/perplexity/ (made by
// tools/reference/perplexity_reference.py, without flash attention, the path
// whose logits ours match bit for bit). A quantized cache's KL divergence from
// the f16 cache against llama.cpp's for the same cache type (tests/data/
// kv_quality/, tools/reference/kv_quality_reference.py). And the KV-dtype
// comparison's own arithmetic: a cache compared with a cache of its own dtype
// moves nothing.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/perplexity.h"
#include "engine_test_util.h"
#include "kernels/cpu/flavour.h"
#include "kv/kv_cache_dtype.h"
#include "model/model.h"
#include "test_data.h"

namespace inferd {
namespace {

namespace fs = std::filesystem;

std::string data_dir() { return inferd::test::test_data_root(); }

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> reference_files() {
  std::vector<std::string> out;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(data_dir() + "/perplexity", ec))
    if (e.path().extension() == ".json") out.push_back(e.path().stem().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::unique_ptr<Model> load(const std::string& file, kernels::GgmlFlavour flavour) {
  const std::string path = test::find_model_file(file);
  if (path.empty()) return nullptr;
  LoadOptions lo;
  lo.prefault = false;
  lo.ggml_flavour = flavour;
  lo.n_threads = 2;
  auto loaded = Model::load(path, lo);
  if (!loaded.ok()) return nullptr;
  return std::move(*loaded);
}

class LlamaCppPerplexity : public ::testing::TestWithParam<std::string> {};

// The logits are llama.cpp's to the bit; only the log-softmax's arithmetic
// differs (ours in double, llama-perplexity's partly in float), which moves
// the tiny random models' huge perplexities (1e7: every token improbable) in
// the eighth digit. The printed figures have 4 decimals.
TEST_P(LlamaCppPerplexity, WindowsAndFinalEstimateMatch) {
  const nlohmann::json ref = nlohmann::json::parse(read_file(data_dir() + "/perplexity/" + GetParam() + ".json"));
  const auto flavour = kernels::parse_ggml_flavour(ref.at("ggml_flavour").get<std::string>());
  ASSERT_TRUE(flavour.has_value());
  const std::string model_file = ref.at("model").get<std::string>();
  std::unique_ptr<Model> model = load(model_file, *flavour);
  ASSERT_TRUE(model) << model_file << " not found or not loadable (scripts/fetch_models.sh)";
  const std::string text = read_file(data_dir() + "/../../" + ref.at("corpus").get<std::string>());
  ASSERT_FALSE(text.empty());
  const std::vector<int32_t> tokens = model->tokenizer().encode(text, /*add_special=*/true, false);

  PerplexityOptions o;
  o.context = ref.at("context");
  o.batch = o.context;
  o.max_windows = ref.at("chunks");
  std::vector<double> windows;
  auto r = measure_perplexity(*model, tokens, o, [&](const PerplexityResult& p) { windows.push_back(p.perplexity()); });
  ASSERT_TRUE(r.ok()) << r.error().message;
  const std::vector<double> want = ref.at("window_perplexity").get<std::vector<double>>();
  ASSERT_EQ(windows.size(), want.size());
  auto near = [](double got, double want) { return std::abs(got - want) <= 5e-5 + 1e-7 * std::abs(want); };
  for (size_t i = 0; i < want.size(); ++i) EXPECT_PRED2(near, windows[i], want[i]) << "window " << i + 1;
  EXPECT_PRED2(near, r->perplexity(), ref.at("perplexity").get<double>());
  EXPECT_PRED2(near, r->perplexity_error(), ref.at("perplexity_error").get<double>());
  EXPECT_EQ(r->scored, o.max_windows * (o.context - o.context / 2 - 1));
}

INSTANTIATE_TEST_SUITE_P(Models, LlamaCppPerplexity, ::testing::ValuesIn(reference_files()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string n = info.param;
                           std::replace_if(n.begin(), n.end(), [](char c) { return !std::isalnum(c); }, '_');
                           return n;
                         });

std::vector<std::string> kv_quality_files() {
  std::vector<std::string> out;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(data_dir() + "/kv_quality", ec))
    if (e.path().extension() == ".json") out.push_back(e.path().stem().string());
  std::sort(out.begin(), out.end());
  return out;
}

class LlamaCppKVQuality : public ::testing::TestWithParam<std::string> {};

// Each engine's quantized cache against its own f16 cache, same windows: the
// two engines' attention arithmetic differs (llama.cpp's flash attention, which
// it needs for a quantized latent cache), so their KL figures differ a little
// either way; a cache that quantized worse than llama.cpp's (a wrong scale,
// rounding, block layout) would cost clearly more.
TEST_P(LlamaCppKVQuality, QuantizedCacheCostsNoMoreKLThanLlamaCpps) {
  constexpr double kSlack = 1.1;
  const nlohmann::json ref =
      nlohmann::json::parse(read_file(data_dir() + "/kv_quality/" + GetParam() + ".json"));
  const std::string model_file = ref.at("model").get<std::string>();
  std::unique_ptr<Model> model = load(model_file, kernels::native_ggml_flavour());
  ASSERT_TRUE(model) << model_file << " not found or not loadable";
  const std::string text = read_file(data_dir() + "/../../" + ref.at("corpus").get<std::string>());
  const std::vector<int32_t> tokens = model->tokenizer().encode(text, /*add_special=*/true, false);
  ASSERT_FALSE(ref.at("types").empty());
  for (const auto& [name, want] : ref.at("types").items()) {
    auto dtype = kv::parse_kv_cache_dtype(name);
    ASSERT_TRUE(dtype.ok()) << name;
    PerplexityOptions o;
    o.context = ref.at("context");
    o.batch = o.context;
    o.max_windows = ref.at("chunks");
    o.kv_dtype = *dtype;
    o.compare_with_f16 = true;
    auto r = measure_perplexity(*model, tokens, o);
    ASSERT_TRUE(r.ok()) << name << ": " << r.error().message;
    const double llama_kl = want.at("kl_divergence_mean").get<double>();
    std::printf("[ info ] %s %s: mean KL %.6f (llama.cpp %.6f), same top %.2f%% (llama.cpp %.2f%%)\n",
                GetParam().c_str(), name.c_str(), r->kl_mean(), llama_kl, 100 * r->same_top_share(),
                100 * want.at("same_top").get<double>());
    EXPECT_GT(r->kl_mean(), 0.0) << name << ": the cache was not quantized";
    EXPECT_LE(r->kl_mean(), kSlack * llama_kl) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, LlamaCppKVQuality, ::testing::ValuesIn(kv_quality_files()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string n = info.param;
                           std::replace_if(n.begin(), n.end(), [](char c) { return !std::isalnum(c); }, '_');
                           return n;
                         });

TEST(EnginePerplexity, AnF16CacheComparedWithF16MovesNothing) {
  std::unique_ptr<Model> model = load("tiny-qwen3.gguf", kernels::native_ggml_flavour());
  ASSERT_TRUE(model);
  const std::vector<int32_t> tokens =
      model->tokenizer().encode(read_file(data_dir() + "/text/perplexity_corpus.txt"), true, false);
  PerplexityOptions o;
  o.context = 64;
  o.batch = 24;  // windows in three passes: the scored half starts inside the second
  o.max_windows = 2;
  o.compare_with_f16 = true;
  auto r = measure_perplexity(*model, tokens, o);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_TRUE(r->compared);
  EXPECT_EQ(r->scored, 2 * 31);
  ASSERT_EQ(r->kl.size(), static_cast<size_t>(r->scored));
  EXPECT_EQ(r->kl_quantile(1.0), 0.0);
  EXPECT_EQ(r->p_diff_rms(), 0.0);
  EXPECT_EQ(r->same_top, r->scored);
  EXPECT_EQ(r->perplexity(), r->perplexity_base());

  // The same windows in one pass each score the same (positions are
  // positions, whatever the passes).
  PerplexityOptions whole = o;
  whole.batch = 64;
  whole.compare_with_f16 = false;
  auto w = measure_perplexity(*model, tokens, whole);
  ASSERT_TRUE(w.ok());
  EXPECT_NEAR(w->perplexity(), r->perplexity(), 1e-6 * r->perplexity());
}

TEST(EnginePerplexity, RefusesTextsShorterThanAWindowAndContextsPastTheModels) {
  std::unique_ptr<Model> model = load("tiny-qwen3.gguf", kernels::native_ggml_flavour());
  ASSERT_TRUE(model);
  const std::vector<int32_t> tokens = model->tokenizer().encode("A short text.", true, false);
  PerplexityOptions o;
  o.context = 64;
  auto r = measure_perplexity(*model, tokens, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("fewer than one window"), std::string::npos) << r.error().message;
  o.context = model->config().context_length + 1;
  r = measure_perplexity(*model, std::vector<int32_t>(o.context, 1), o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("exceeds the model's"), std::string::npos) << r.error().message;
}

TEST(EnginePerplexity, ScoreRowIsALogSoftmax) {
  const std::vector<float> logits = {1.0f, 3.0f, -2.0f, 3.0f, 0.5f};
  std::vector<double> lp;
  const RowScore s = score_row(logits.data(), 5, 4, &lp);
  double z = 0;
  for (float l : logits) z += std::exp(static_cast<double>(l));
  EXPECT_NEAR(s.log_prob, 0.5 - std::log(z), 1e-12);
  EXPECT_EQ(s.top, 1);  // the first of two largest
  double total = 0;
  for (double v : lp) total += std::exp(v);
  EXPECT_NEAR(total, 1.0, 1e-12);
}

}  // namespace
}  // namespace inferd
