// Tensor parallelism's shard arithmetic (model/tensor_shard.h), without MPI:
// which heads, FFN columns and vocabulary rows each rank holds, the views and
// copies of those parts, and the refusals (KV heads, block boundaries,
// architectures not split yet).
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "model/model.h"
#include "model/tensor_shard.h"

namespace inferd {
namespace {

std::string tiny(const std::string& name) { return std::string(INFERD_TEST_DATA_DIR) + "/models/" + name + ".gguf"; }

TEST(TensorShard, UnitsAreContiguousAndBalanced) {
  // 19 units over 2 ranks: 10 and 9; over 4: 5, 5, 5, 4.
  EXPECT_EQ(shard_units(19, {0, 2}), (ShardRange{0, 10}));
  EXPECT_EQ(shard_units(19, {1, 2}), (ShardRange{10, 19}));
  const std::vector<ShardRange> four = {{0, 5}, {5, 10}, {10, 15}, {15, 19}};
  for (int r = 0; r < 4; ++r) EXPECT_EQ(shard_units(19, {r, 4}), four[r]) << r;
}

// A config and weights shaped like Qwen2.5-Coder-0.5B (14 query heads, 2 KV
// heads of 64, n_ff 4864, ffn_down in Q4_K/Q6_K: 256-value blocks), views
// over a buffer large enough for the biggest tensor.
struct QwenShape {
  ModelConfig config;
  ModelWeights weights;
  std::vector<uint8_t> bytes = std::vector<uint8_t>(1 << 22);
  QwenShape() {
    config.architecture = "qwen2";
    config.n_layer = 2;
    config.n_embd = 896;
    config.n_head = 14;
    config.n_head_kv = 2;
    config.head_dim = 64;
    config.n_ff = 4864;
    config.n_vocab = 151936;
    config.traits = find_architecture("qwen2");
    config.layers.resize(2);
    weights.layers.resize(2);
    for (LayerWeights& L : weights.layers) {
      auto view = [this](DType t, int64_t cols, int64_t rows) { return WeightView{t, bytes.data(), cols, rows}; };
      L.proj = {view(DType::Q5_0, 896, 896), view(DType::Q5_0, 896, 128), view(DType::Q8_0, 896, 128),
                view(DType::Q5_0, 896, 896), view(DType::Q5_0, 896, 4864), view(DType::Q5_0, 896, 4864),
                view(DType::Q4_K, 4864, 896)};
    }
    weights.output = WeightView{DType::Q8_0, bytes.data(), 896, 151936};
  }
};

TEST(TensorShard, QwenShapedPlanHoldsWholeHeadGroupsAndWholeBlocks) {
  QwenShape m;
  ASSERT_NE(m.config.traits, nullptr);
  for (int r = 0; r < 2; ++r) {
    auto plan = plan_tensor_shard(m.config, m.weights, {r, 2});
    ASSERT_TRUE(plan.ok()) << plan.error().message;
    EXPECT_EQ(plan->kv_heads, (ShardRange{r, r + 1}));
    EXPECT_EQ(plan->q_heads, (ShardRange{7 * r, 7 * r + 7}));  // each KV head's group of 7
    EXPECT_EQ(plan->ffn_unit, 256);                            // Q4_K's block
    // 19 blocks of 256: 10 and 9, so the ffn_down split falls on a block boundary.
    EXPECT_EQ(plan->ffn, r == 0 ? (ShardRange{0, 2560}) : (ShardRange{2560, 4864}));
    EXPECT_EQ(plan->vocab, r == 0 ? (ShardRange{0, 75968}) : (ShardRange{75968, 151936}));
  }
}

TEST(TensorShard, RefusesWhatItCannotSplitNamingTheRule) {
  QwenShape m;
  const auto message = [&](TensorShard s) { return plan_tensor_shard(m.config, m.weights, s).error().message; };
  // SmolLM2-135M's 3 KV heads over 2 ranks; here 2 KV heads over 4.
  EXPECT_NE(message({0, 4}).find("must divide the model's 2 KV heads"), std::string::npos);
  m.config.moe.n_expert = 8;
  EXPECT_NE(message({0, 2}).find("mixture-of-experts"), std::string::npos);
  m.config.moe.n_expert = 0;
  m.config.architecture = "deepseek2";
  EXPECT_NE(message({0, 2}).find("'deepseek2' is not one of them"), std::string::npos);
}

TEST(TensorShard, RowsAreViewsAndColumnsCopiesOfTheirOwnBytes) {
  // 3 rows of 64 Q8_0 values (2 blocks of 34 bytes each per row), bytes numbered.
  std::vector<uint8_t> bytes(3 * 68);
  std::iota(bytes.begin(), bytes.end(), uint8_t{0});
  const WeightView w{DType::Q8_0, bytes.data(), 64, 3};
  const WeightView rows = shard_rows(w, {1, 3});
  EXPECT_EQ(rows.data, bytes.data() + 68);
  EXPECT_EQ(rows.rows, 2);
  std::vector<std::shared_ptr<const std::vector<std::byte>>> derived;
  auto cols = shard_columns(w, {32, 64}, "blk.0.ffn_down.weight", derived);
  ASSERT_TRUE(cols.ok()) << cols.error().message;
  EXPECT_EQ(cols->cols, 32);
  EXPECT_EQ(cols->rows, 3);
  ASSERT_EQ(derived.size(), 1u);
  for (int r = 0; r < 3; ++r)  // each row's second block
    EXPECT_EQ(std::memcmp(static_cast<const uint8_t*>(cols->data) + r * 34, bytes.data() + r * 68 + 34, 34), 0) << r;
  // A boundary inside a 32-value block is refused, naming the tensor and the rule.
  auto split = shard_columns(w, {0, 48}, "blk.0.ffn_down.weight", derived);
  ASSERT_FALSE(split.ok());
  EXPECT_NE(split.error().message.find("blk.0.ffn_down.weight"), std::string::npos);
  EXPECT_NE(split.error().message.find("32-value block boundary"), std::string::npos);
}

TEST(TensorShard, AppliedToQwenShapeAttnOutputOffBlockBoundaryIsRefused) {
  // attn_output in a 256-value type with 7 heads of 64 (448 columns) a rank:
  // not on a block boundary.
  QwenShape m;
  for (LayerWeights& L : m.weights.layers) L.proj[static_cast<int>(Projection::kO)].dtype = DType::Q4_K;
  m.weights.layers[0].proj[static_cast<int>(Projection::kO)].cols = 896;
  auto plan = plan_tensor_shard(m.config, m.weights, {0, 2});
  ASSERT_TRUE(plan.ok());
  auto held = apply_tensor_shard(m.config, m.weights, *plan, {0, 2});
  ASSERT_FALSE(held.ok());
  EXPECT_NE(held.error().message.find("blk.0.attn_output.weight"), std::string::npos);
  EXPECT_NE(held.error().message.find("256-value block boundary"), std::string::npos);
}

TEST(TensorShard, TinyQwen3ShardsShrinkTheConfigAndKeepEveryByte) {
  // tiny-qwen3: 4 query heads, 2 KV heads of 32, n_ff 96 (3 blocks of 32).
  auto whole = Model::load(tiny("tiny-qwen3"), {.prefault = false, .n_threads = 1});
  ASSERT_TRUE(whole.ok()) << whole.error().message;
  ModelConfig config[2];
  ModelWeights weights[2];
  int64_t ffn = 0, vocab = 0;
  for (int r = 0; r < 2; ++r) {
    config[r] = (*whole)->config();
    weights[r] = (*whole)->weights();
    auto plan = plan_tensor_shard(config[r], weights[r], {r, 2});
    ASSERT_TRUE(plan.ok()) << plan.error().message;
    ASSERT_TRUE(apply_tensor_shard(config[r], weights[r], *plan, {r, 2}).ok());
    EXPECT_EQ(config[r].n_head, 2);
    EXPECT_EQ(config[r].n_head_kv, 1);
    ffn += config[r].n_ff;
    vocab += weights[r].output.rows;
    const LayerWeights& L = weights[r].layers[0];
    EXPECT_EQ(L[Projection::kQ].rows, 64);
    EXPECT_EQ(L[Projection::kO].cols, 64);
    EXPECT_EQ(L[Projection::kDown].cols, config[r].n_ff);
    EXPECT_EQ(L[Projection::kGate].rows, config[r].n_ff);
  }
  EXPECT_EQ(config[0].n_ff, 64);  // 2 blocks, then 1
  EXPECT_EQ(ffn, 96);
  EXPECT_EQ(vocab, (*whole)->weights().output.rows);
  // Rank 1's ffn_down row 0 is the whole row's last block.
  const WeightView& down = (*whole)->weights().layers[0][Projection::kDown];
  const size_t block = row_bytes(down.dtype, 32);
  EXPECT_EQ(std::memcmp(weights[1].layers[0][Projection::kDown].data, static_cast<const uint8_t*>(down.data) + 2 * block,
                        block),
            0);
}

}  // namespace
}  // namespace inferd
