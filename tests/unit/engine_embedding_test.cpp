// Embedding requests through the engine (GenerationParams::pooled): many
// inputs batched in the engine's steps give each input's vector alone, to the
// bit, and equal the model's own forward pass; an encoder refuses to
// generate, a generative model refuses to embed, inputs longer than the
// model's positions or the step budget are refused.
#include <gtest/gtest.h>

#include <fstream>

#include "engine_test_util.h"
#include "test_data.h"

namespace inferd {
namespace {

using test::ModelTest;
using test::Outputs;

class EmbeddingEngineTest : public ModelTest {
 protected:
  void SetUp() override { use_model("all-MiniLM-L6-v2.f16.gguf"); }

  static std::vector<std::vector<int32_t>> sentences() {
    std::vector<std::vector<int32_t>> out;
    std::ifstream in(inferd::test::test_data_root() + "/embeddings/all-minilm-l6-v2.expected.jsonl");
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json j = nlohmann::json::parse(line);
      if (j.contains("embedding")) out.push_back(j["ids"].get<std::vector<int32_t>>());
    }
    return out;
  }

  static GenerationParams embed_request(std::vector<int32_t> ids) {
    GenerationParams p;
    p.prompt_token_ids = std::move(ids);
    p.pooled = true;
    return p;
  }

  // Runs every input through one engine, all queued at once; their outputs by input.
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

TEST_F(EmbeddingEngineTest, ManyInputsBatchedGiveTheirVectorsAlone) {
  const std::vector<std::vector<int32_t>> base = sentences();
  std::vector<std::vector<int32_t>> inputs;
  for (size_t i = 0; inputs.size() < 256; ++i) inputs.push_back(base[i % base.size()]);
  EngineConfig c;
  c.max_num_batched_tokens = 2048;
  c.max_num_seqs = 256;
  c.kv_cache_bytes = 64 << 20;
  auto engine = make_engine(c);
  ASSERT_TRUE(engine);
  const std::vector<std::vector<float>> batched = run(*engine, inputs);
  ASSERT_EQ(batched.size(), inputs.size());
  for (size_t i = 0; i < base.size(); ++i) {
    const std::vector<float> alone = run(*engine, {base[i]}).front();
    ASSERT_EQ(alone.size(), 384u);
    for (size_t j = i; j < inputs.size(); j += base.size()) EXPECT_EQ(batched[j], alone) << "input " << j;
  }
}

TEST_F(EmbeddingEngineTest, RefusesGenerationAndOverlongInputs) {
  EngineConfig c;
  c.max_num_batched_tokens = 256;
  c.kv_cache_bytes = 16 << 20;
  auto engine = make_engine(c);
  ASSERT_TRUE(engine);
  auto gen = engine->add_request(request({101, 7592, 102}, 4));
  ASSERT_FALSE(gen.ok());
  EXPECT_NE(gen.error().message.find("cannot generate"), std::string::npos) << gen.error().message;
  auto too_long = engine->add_request(embed_request(std::vector<int32_t>(513, 1996)));
  ASSERT_FALSE(too_long.ok());
  EXPECT_NE(too_long.error().message.find("512 positions"), std::string::npos) << too_long.error().message;
  auto over_budget = engine->add_request(embed_request(std::vector<int32_t>(300, 1996)));
  ASSERT_FALSE(over_budget.ok());
  EXPECT_NE(over_budget.error().message.find("max_num_batched_tokens"), std::string::npos)
      << over_budget.error().message;
  EXPECT_FALSE(engine->add_request(embed_request({})).ok());
}

TEST_F(EmbeddingEngineTest, GenerativeModelRefusesToEmbed) {
  use_model("SmolLM2-135M-Instruct.Q4_1.gguf");
  EngineConfig c;
  c.kv_cache_bytes = 16 << 20;
  auto engine = make_engine(c);
  ASSERT_TRUE(engine);
  auto h = engine->add_request(embed_request({1, 2, 3}));
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.error().message.find("cannot embed"), std::string::npos) << h.error().message;
}

}  // namespace
}  // namespace inferd
