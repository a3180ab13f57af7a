// The bert encoder's forward pass against the model's own Hugging Face
// implementation: all-MiniLM-L6-v2 (the GGUF scripts/fetch_models.sh --all
// converts) embeds every sentence of tests/data/embeddings/sentences.jsonl
// that fits its 512 positions, mean-pooled and L2-normalized, with cosine
// similarity at least 0.9999 to transformers' float32 vectors
// (tools/reference/embedding_reference.py); and a batch of them gives each
// input's vector alone, to the bit. Both numerics tiers: exact (F16 weights
// as GGML multiplies them) and fast (the BF16 product, kernels/cpu/bf16_gemm.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/kv_cache.h"
#include "model/model.h"
#include "test_data.h"

namespace inferd {
namespace {

std::string minilm_path() {
  const char* d = std::getenv("INFERD_MODEL_DIR");
  const char* home = std::getenv("HOME");
  const std::string dir = d && *d ? d : std::string(home ? home : "/root") + "/.cache/inferd/models";
  return dir + "/all-MiniLM-L6-v2.f16.gguf";
}

struct Case {
  std::vector<int32_t> ids;
  std::vector<float> embedding;
};

std::vector<Case> cases_with_embeddings() {
  std::vector<Case> out;
  std::ifstream in(inferd::test::test_data_root() + "/embeddings/all-minilm-l6-v2.expected.jsonl");
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (!j.contains("embedding")) continue;
    out.push_back({j["ids"].get<std::vector<int32_t>>(), j["embedding"].get<std::vector<float>>()});
  }
  return out;
}

// One forward pass of the inputs as sequences of one batch: each one's pooled output.
std::vector<std::vector<float>> embed(Model& model, const std::vector<std::vector<int32_t>>& inputs) {
  ForwardBatch batch;
  for (const std::vector<int32_t>& ids : inputs) {
    SequenceSlice sl;
    sl.first_token = static_cast<int32_t>(batch.tokens.size());
    sl.n_tokens = static_cast<int32_t>(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      batch.tokens.push_back(ids[i]);
      batch.positions.push_back(static_cast<int32_t>(i));
    }
    batch.sequences.push_back(sl);
    batch.logit_rows.push_back(sl.first_token + sl.n_tokens - 1);
  }
  KVCache cache(model.config(), 1, 16);  // an encoder keeps no keys or values
  std::vector<float> out;
  model.forward(batch, cache, out);
  const int64_t width = model.n_logits();
  std::vector<std::vector<float>> rows;
  for (size_t r = 0; r < inputs.size(); ++r) rows.emplace_back(out.begin() + r * width, out.begin() + (r + 1) * width);
  return rows;
}

double cosine(const std::vector<float>& a, const std::vector<float>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ab += static_cast<double>(a[i]) * b[i];
    aa += static_cast<double>(a[i]) * a[i];
    bb += static_cast<double>(b[i]) * b[i];
  }
  return ab / std::sqrt(aa * bb);
}

class EncoderReferenceTest : public ::testing::TestWithParam<kernels::Numerics> {
 protected:
  void SetUp() override {
    LoadOptions o;
    o.prefault = false;
    o.n_threads = 2;
    o.numerics = GetParam();
    auto m = Model::load(minilm_path(), o);
    ASSERT_TRUE(m.ok()) << m.error().message << " (run scripts/fetch_models.sh --all)";
    model_ = std::move(*m);
  }
  std::unique_ptr<Model> model_;
};

TEST_P(EncoderReferenceTest, ConfigIsBertWithMeanPooling) {
  const ModelConfig& c = model_->config();
  EXPECT_TRUE(c.is_encoder());
  EXPECT_TRUE(c.can_embed());
  EXPECT_EQ(c.pooling, PoolingType::kMean);
  EXPECT_EQ(c.n_layer, 6);
  EXPECT_EQ(c.n_embd, 384);
  EXPECT_EQ(c.context_length, 512);
  EXPECT_EQ(model_->n_logits(), 384);
}

TEST_P(EncoderReferenceTest, EmbeddingsMatchHuggingFace) {
  const std::vector<Case> cases = cases_with_embeddings();
  ASSERT_GE(cases.size(), 40u);
  double lowest = 1.0;
  for (const Case& c : cases) {
    const std::vector<float> got = embed(*model_, {c.ids}).front();
    ASSERT_EQ(got.size(), c.embedding.size());
    const double cos = cosine(got, c.embedding);
    EXPECT_GE(cos, 0.9999) << "input of " << c.ids.size() << " tokens";
    lowest = std::min(lowest, cos);
  }
  std::printf("lowest cosine similarity to Hugging Face (%s numerics): %.7f\n", kernels::numerics_name(GetParam()),
              lowest);
}

TEST_P(EncoderReferenceTest, BatchedInputsGiveTheirVectorsAlone) {
  const std::vector<Case> cases = cases_with_embeddings();
  std::vector<std::vector<int32_t>> inputs;
  for (const Case& c : cases) inputs.push_back(c.ids);
  const std::vector<std::vector<float>> batched = embed(*model_, inputs);
  for (size_t i = 0; i < inputs.size(); ++i) EXPECT_EQ(batched[i], embed(*model_, {inputs[i]}).front()) << i;
}

INSTANTIATE_TEST_SUITE_P(Numerics, EncoderReferenceTest,
                         ::testing::Values(kernels::Numerics::kExact, kernels::Numerics::kFast),
                         [](const ::testing::TestParamInfo<kernels::Numerics>& i) {
                           return std::string(kernels::numerics_name(i.param));
                         });

}  // namespace
}  // namespace inferd
