// Rank pooling (a reranker's classification head) against llama.cpp: the
// random-weight BERT cross-encoder tests/data/models/tiny-bert-reranker.gguf
// (make_tiny_models.py, llama.cpp's BERT vocabulary) scores each (query,
// document) pair as llama.cpp does (tools/reference/rerank_reference.py), from
// the same tokens, which inferd's encode_pair makes as llama.cpp's tokenizer
// does. Both run GGML's GELU and F32 attention (the reference has flash
// attention off: it rounds to F16), so the scores agree to float rounding.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/kv_cache.h"
#include "model/model.h"
#include "test_data.h"

namespace inferd {
namespace {

TEST(EncoderRank, ScoresMatchLlamaCpp) {
  LoadOptions o;
  o.prefault = false;
  o.n_threads = 2;
  auto m = Model::load(inferd::test::test_data_root() + "/models/tiny-bert-reranker.gguf", o);
  ASSERT_TRUE(m.ok()) << m.error().message;
  Model& model = **m;
  ASSERT_TRUE(model.config().can_rank());
  ASSERT_EQ(model.n_logits(), 1);
  std::ifstream in(inferd::test::test_data_root() + "/rerank/tiny-bert-reranker.expected.json");
  const nlohmann::json expected = nlohmann::json::parse(in);
  ASSERT_GE(expected["pairs"].size(), 8u);
  KVCache cache(model.config(), 1, 16);
  double worst = 0.0;
  for (const nlohmann::json& pair : expected["pairs"]) {
    const std::vector<int32_t> ids = pair["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(encode_pair(model.tokenizer(), pair["query"].get<std::string>(), pair["document"].get<std::string>()), ids);
    ForwardBatch batch;
    for (size_t i = 0; i < ids.size(); ++i) {
      batch.tokens.push_back(ids[i]);
      batch.positions.push_back(static_cast<int32_t>(i));
    }
    batch.sequences.push_back(SequenceSlice{0, static_cast<int32_t>(ids.size())});
    batch.logit_rows.push_back(static_cast<int32_t>(ids.size()) - 1);
    std::vector<float> score;
    model.forward(batch, cache, score);
    ASSERT_EQ(score.size(), 1u);
    const double want = pair["score"][0].get<double>();
    EXPECT_NEAR(score[0], want, 1e-5) << pair["query"] << " / " << pair["document"];
    worst = std::max(worst, std::abs(score[0] - want));
  }
  std::printf("largest score difference from llama.cpp: %.2e\n", worst);
}

}  // namespace
}  // namespace inferd
