// Decoder embedding models through the engine (GenerationParams::pooled): the
// random-weight tiny-qwen3-embed-last (qwen3, last-token pooling, EOS appended
// as Qwen3-Embedding's GGUFs do) and tiny-llama-embed-mean (llama, mean
// pooling), each sentence's tokens and pooled vector against llama.cpp's
// (tools/reference/decoder_embedding_reference.py: the pooled final-normed
// hidden states, llama_get_embeddings_seq). Many inputs batched in the
// engine's steps give each input's vector alone, to the bit; such a model
// refuses to generate. The model is loaded with the rounding of the GGML build
// that made the data (its "ggml_flavour"), as the logits reference test does.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>

#include "engine_test_util.h"
#include "test_data.h"

namespace inferd {
namespace {

using test::ModelTest;
using test::Outputs;

struct Sentence {
  std::string text;
  std::vector<int32_t> ids;
  std::vector<float> raw;  // llama.cpp's pooled vector, unnormalized
};

nlohmann::json reference_file(const std::string& model) {
  std::ifstream in(inferd::test::test_data_root() + "/embeddings/" + model + ".expected.json");
  return nlohmann::json::parse(in);
}

std::vector<Sentence> reference(const std::string& model) {
  const nlohmann::json j = reference_file(model);
  std::vector<Sentence> out;
  for (const nlohmann::json& s : j["sentences"])
    out.push_back({s["text"].get<std::string>(), s["ids"].get<std::vector<int32_t>>(),
                   s["raw"].get<std::vector<float>>()});
  return out;
}

double cosine(const std::vector<float>& a, const std::vector<float>& b) {
  double ab = 0.0, aa = 0.0, bb = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    ab += static_cast<double>(a[i]) * b[i];
    aa += static_cast<double>(a[i]) * a[i];
    bb += static_cast<double>(b[i]) * b[i];
  }
  return ab / std::sqrt(aa * bb);
}

class DecoderEmbeddingTest : public ModelTest, public ::testing::WithParamInterface<const char*> {
 protected:
  void SetUp() override {
    const nlohmann::json j = reference_file(GetParam());
    ASSERT_TRUE(j.contains("ggml_flavour")) << GetParam() << ".expected.json has no ggml_flavour";
    const std::optional<kernels::GgmlFlavour> flavour = kernels::parse_ggml_flavour(j["ggml_flavour"].get<std::string>());
    ASSERT_TRUE(flavour.has_value()) << j["ggml_flavour"];
    use_model(std::string(GetParam()) + ".gguf", kernels::Numerics::kExact, *flavour);
  }

  static GenerationParams embed_request(std::vector<int32_t> ids) {
    GenerationParams p;
    p.prompt_token_ids = std::move(ids);
    p.pooled = true;
    return p;
  }

  static std::unique_ptr<Engine> embedding_engine() {
    EngineConfig c;
    c.max_num_batched_tokens = 512;
    c.max_num_seqs = 64;
    c.kv_cache_bytes = 16 << 20;
    return make_engine(c);
  }

  // Every input queued at once on one engine; their vectors by input.
  static std::vector<std::vector<float>> run(Engine& e, const std::vector<std::vector<int32_t>>& inputs) {
    std::vector<std::string> ids;
    for (const std::vector<int32_t>& in : inputs) ids.push_back(add(e, embed_request(in)));
    Outputs o;
    test::run_until_idle(e, o);
    std::vector<std::vector<float>> out;
    for (const std::string& id : ids) {
      const test::Collected& c = o.requests[id];
      EXPECT_TRUE(c.finished);
      EXPECT_TRUE(c.tokens.empty());
      out.push_back(c.final_output.embedding);
    }
    return out;
  }
};

TEST_P(DecoderEmbeddingTest, ConfigSaysPooledDecoder) {
  const ModelConfig& c = model_->config();
  EXPECT_FALSE(c.is_encoder());
  EXPECT_TRUE(c.returns_pooled());
  EXPECT_TRUE(c.can_embed());
  EXPECT_FALSE(c.can_rank());
  EXPECT_EQ(model_->n_logits(), c.n_embd);
}

TEST_P(DecoderEmbeddingTest, TokensMatchLlamaCpp) {
  for (const Sentence& s : reference(GetParam()))
    EXPECT_EQ(model_->tokenizer().encode(s.text, /*add_special=*/true, /*parse_special=*/true), s.ids) << s.text;
}

TEST_P(DecoderEmbeddingTest, VectorsMatchLlamaCpp) {
  auto engine = embedding_engine();
  ASSERT_TRUE(engine);
  double worst_cosine = 1.0, worst_diff = 0.0;
  for (const Sentence& s : reference(GetParam())) {
    const std::vector<float> v = run(*engine, {s.ids}).front();
    ASSERT_EQ(v.size(), s.raw.size()) << s.text;
    const double cos = cosine(v, s.raw);
    EXPECT_GE(cos, 0.9999) << s.text;
    double diff = 0.0;
    for (size_t i = 0; i < v.size(); ++i) diff = std::max(diff, std::abs(static_cast<double>(v[i]) - s.raw[i]));
    EXPECT_LT(diff, 1e-3) << s.text;
    worst_cosine = std::min(worst_cosine, cos);
    worst_diff = std::max(worst_diff, diff);
  }
  std::printf("%s against llama.cpp: lowest cosine %.9f, largest difference %.3e (unnormalized vectors)\n",
              GetParam(), worst_cosine, worst_diff);
}

TEST_P(DecoderEmbeddingTest, ManyInputsBatchedGiveTheirVectorsAlone) {
  std::vector<std::vector<int32_t>> base;
  for (const Sentence& s : reference(GetParam())) base.push_back(s.ids);
  std::vector<std::vector<int32_t>> inputs;
  for (size_t i = 0; inputs.size() < 40; ++i) inputs.push_back(base[i % base.size()]);
  auto engine = embedding_engine();
  ASSERT_TRUE(engine);
  const std::vector<std::vector<float>> batched = run(*engine, inputs);
  ASSERT_EQ(batched.size(), inputs.size());
  for (size_t i = 0; i < base.size(); ++i) {
    const std::vector<float> alone = run(*engine, {base[i]}).front();
    ASSERT_EQ(static_cast<int64_t>(alone.size()), model_->config().n_embd);
    for (size_t j = i; j < inputs.size(); j += base.size()) EXPECT_EQ(batched[j], alone) << "input " << j;
  }
}

TEST_P(DecoderEmbeddingTest, RefusesToGenerate) {
  auto engine = embedding_engine();
  ASSERT_TRUE(engine);
  auto gen = engine->add_request(request(reference(GetParam()).front().ids, 4));
  ASSERT_FALSE(gen.ok());
  EXPECT_NE(gen.error().message.find("cannot generate"), std::string::npos) << gen.error().message;
}

INSTANTIATE_TEST_SUITE_P(TinyModels, DecoderEmbeddingTest,
                         ::testing::Values("tiny-qwen3-embed-last", "tiny-llama-embed-mean"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string name = info.param;
                           for (char& ch : name)
                             if (ch == '-') ch = '_';
                           return name;
                         });

}  // namespace
}  // namespace inferd
