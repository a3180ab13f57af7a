// deepseek2 files from before llama.cpp's converter split attn_kv_b
// (model/mla_kv_b_split.h): tiny-deepseek2-kv-b holds one F16 attn_kv_b a
// layer and MHA-shaped metadata; tiny-deepseek2-kv-b-split the same weights
// split by convert_hf_to_gguf.py's recipe (tools/reference/
// make_tiny_models.py, numpy). Split at load, the first must give the
// second's logits to the bit, prompts and decode steps alike. A quantized
// attn_kv_b cannot be split exactly and is refused, naming the tensor.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "engine/sequence_generator.h"
#include "gguf/gguf.h"
#include "gguf_test_util.h"
#include "model/mla_kv_b_split.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "test_data.h"

namespace inferd {
namespace {

std::unique_ptr<Model> load(const std::string& name) {
  LoadOptions lo;
  lo.prefault = false;
  lo.n_threads = 2;
  auto model = Model::load(inferd::test::test_data_root() + "/models/" + name, lo);
  EXPECT_TRUE(model.ok()) << name << ": " << (model.ok() ? "" : model.error().message);
  return model.ok() ? std::move(*model) : nullptr;
}

TEST(ModelMlaKvBSplit, AnOlderFileRunsAsTheSplitForm) {
  const auto unsplit = load("tiny-deepseek2-kv-b.gguf");
  const auto split = load("tiny-deepseek2-kv-b-split.gguf");
  ASSERT_TRUE(unsplit && split);
  const ModelConfig& a = unsplit->config();
  const ModelConfig& b = split->config();
  EXPECT_TRUE(a.mla.kv_b_unsplit);
  EXPECT_FALSE(b.mla.kv_b_unsplit);
  // Per-head sizes from key_length/value_length; the cache one latent head.
  EXPECT_EQ(a.mla.qk_nope, b.mla.qk_nope);
  EXPECT_EQ(a.mla.v_head, b.mla.v_head);
  EXPECT_EQ(a.n_head_kv, 1);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(KVCache::bytes_per_token(a), KVCache::bytes_per_token(b));

  // Several prompts, fed whole (a prefill pass), then a token at a time.
  const std::vector<std::vector<int32_t>> prompts = {{9707, 11, 1879, 0}, {785, 6722, 315, 9625, 374},
                                                     {16, 11, 220, 17, 11, 220, 18, 11, 220, 19, 11}};
  for (const std::vector<int32_t>& prompt : prompts) {
    SequenceGenerator ga(*unsplit, 64), gb(*split, 64);
    std::vector<int32_t> fed = prompt;
    for (int step = 0; step < 12; ++step) {
      auto la = ga.prompt_logits(fed);
      auto lb = gb.prompt_logits(fed);
      ASSERT_TRUE(la.ok() && lb.ok());
      ASSERT_EQ(la->size(), lb->size());
      for (size_t i = 0; i < la->size(); ++i) {
        uint32_t x, y;
        std::memcpy(&x, &(*la)[i], 4);
        std::memcpy(&y, &(*lb)[i], 4);
        ASSERT_EQ(x, y) << "step " << step << " logit " << i << ": " << (*la)[i] << " vs " << (*lb)[i];
      }
      fed.push_back(static_cast<int32_t>(std::max_element(la->begin(), la->end()) - la->begin()));
    }
  }
}

TEST(ModelMlaKvBSplit, AQuantizedAttnKvBIsRefusedByName) {
  // kv_lora_rank 64, 2 heads of qk_nope 32 and v_head 32.
  const MlaConfig m{0, 64, 32, 16, 32};
  for (DType t : {DType::Q8_0, DType::Q4_0, DType::F16}) {
    gguf::testing::Writer w;
    w.str("general.architecture", "deepseek2");
    w.tensor("blk.0.attn_kv_b.weight", t, {64, 2 * 64});
    const gguf::testing::Bytes image = w.build();
    auto f = gguf::File::from_memory(image.data(), image.size());
    ASSERT_TRUE(f.ok()) << f.error().message;
    auto r = split_attn_kv_b(**f, "blk.0.attn_kv_b.weight", m, 2);
    if (t == DType::F16) {
      ASSERT_TRUE(r.ok()) << r.error().message;
      EXPECT_EQ(r->k_b.cols, 32);
      EXPECT_EQ(r->k_b.rows, 64);
      EXPECT_EQ(r->v_b.cols, 64);
      EXPECT_EQ(r->v_b.rows, 32);
      continue;
    }
    ASSERT_FALSE(r.ok()) << dtype_name(t);
    EXPECT_NE(r.error().message.find("'blk.0.attn_kv_b.weight' is " + std::string(dtype_name(t))), std::string::npos)
        << r.error().message;
    EXPECT_NE(r.error().message.find("no split keeps its weights exactly"), std::string::npos) << r.error().message;
  }
  gguf::testing::Writer w;
  w.str("general.architecture", "deepseek2");
  const gguf::testing::Bytes image = w.build();
  auto f = gguf::File::from_memory(image.data(), image.size());
  ASSERT_TRUE(f.ok());
  auto r = split_attn_kv_b(**f, "blk.0.attn_kv_b.weight", m, 2);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("missing tensor 'blk.0.attn_kv_b.weight'"), std::string::npos);
}

}  // namespace
}  // namespace inferd
