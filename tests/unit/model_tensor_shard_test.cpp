// Tensor parallelism's shard arithmetic (model/tensor_shard.h), without MPI:
// which heads, rows and experts each rank holds, the views of those parts,
// and the refusals (KV heads, architectures not split yet, expert parallelism's
// rules).
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/cpu/quants.h"
#include "model/linear.h"
#include "model/model.h"
#include "model/tensor_shard.h"
#include "test_data.h"

namespace inferd {
namespace {

std::string tiny(const std::string& name) { return inferd::test::test_data_root() + "/models/" + name + ".gguf"; }

TEST(TensorShard, UnitsAreContiguousAndBalanced) {
  // 19 units over 2 ranks: 10 and 9; over 4: 5, 5, 5, 4.
  EXPECT_EQ(shard_units(19, {0, 2}), (ShardRange{0, 10}));
  EXPECT_EQ(shard_units(19, {1, 2}), (ShardRange{10, 19}));
  const std::vector<ShardRange> four = {{0, 5}, {5, 10}, {10, 15}, {15, 19}};
  for (int r = 0; r < 4; ++r) EXPECT_EQ(shard_units(19, {r, 4}), four[r]) << r;
}

TEST(TensorShard, RowsSplitInWholeGroupsWithTheTailOnTheLastRank) {
  EXPECT_EQ(split_rows(896, 16, 2).edges, (std::vector<int64_t>{0, 448, 896}));
  // 100 rows: 6 whole groups of 16, two a rank, and the last 4 rows to rank 2.
  const ShardSplit split = split_rows(100, 16, 3);
  EXPECT_EQ(split.edges, (std::vector<int64_t>{0, 32, 64, 100}));
  EXPECT_EQ(split.of(2), (ShardRange{64, 100}));
  EXPECT_EQ(split.whole(), 100);
  EXPECT_EQ(split.count(), 3);
  // 2 KV head groups of 7 heads of 64 columns.
  EXPECT_EQ(split_units(2, 7 * 64, 2).edges, (std::vector<int64_t>{0, 448, 896}));
}

// A config and weights shaped like Qwen2.5-Coder-0.5B (14 query heads, 2 KV
// heads of 64, n_ff 4864, ffn_down in Q4_K), views
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

TEST(TensorShard, QwenShapedPlanHoldsWholeHeadGroupsAndWholeRowGroups) {
  QwenShape m;
  ASSERT_NE(m.config.traits, nullptr);
  for (int r = 0; r < 2; ++r) {
    auto plan = plan_tensor_shard(m.config, m.weights, {r, 2});
    ASSERT_TRUE(plan.ok()) << plan.error().message;
    EXPECT_EQ(plan->kv_heads, (ShardRange{r, r + 1}));
    EXPECT_EQ(plan->q_heads, (ShardRange{7 * r, 7 * r + 7}));  // each KV head's group of 7
    // Every rank knows every rank's part: the gathers put them in place.
    EXPECT_EQ(plan->attn.edges, (std::vector<int64_t>{0, 448, 896}));
    EXPECT_EQ(plan->ffn.edges, (std::vector<int64_t>{0, 2432, 4864}));
    EXPECT_EQ(plan->embd.edges, (std::vector<int64_t>{0, 448, 896}));
    EXPECT_EQ(plan->vocab.edges, (std::vector<int64_t>{0, 75968, 151936}));
  }
}

TEST(TensorShard, RefusesWhatItCannotSplitNamingTheRule) {
  QwenShape m;
  const auto message = [&](TensorShard s) { return plan_tensor_shard(m.config, m.weights, s).error().message; };
  // SmolLM2-135M's 3 KV heads over 2 ranks; here 2 KV heads over 4.
  EXPECT_NE(message({0, 4}).find("must divide the model's 2 KV heads"), std::string::npos);
  m.config.moe.n_expert = 8;
  EXPECT_NE(message({0, 2}).find("mixture-of-experts model is split across ranks by its experts: add "
                                 "--enable-expert-parallel"),
            std::string::npos);
  // With expert parallelism: a mixture it knows, of at least T experts.
  EXPECT_NE(message({0, 2, true}).find("expert parallelism splits the mixtures qwen3moe and glm4moe only; 'qwen2' "
                                       "is not one of them"),
            std::string::npos);
  m.config.architecture = "qwen3moe";
  m.config.n_head_kv = 4;
  m.config.n_head = 16;
  m.config.moe.n_expert = 2;
  EXPECT_NE(message({0, 4, true}).find("the model's 2 experts must be at least the tensor parallel size"),
            std::string::npos);
  m.config.mla.kv_lora_rank = 512;
  EXPECT_NE(message({0, 2, true}).find("multi-latent attention (MLA) is not split across ranks yet"),
            std::string::npos);
  m.config.mla.kv_lora_rank = 0;
  m.config.moe.n_expert = 0;
  m.config.architecture = "deepseek2";
  EXPECT_NE(message({0, 2}).find("'deepseek2' is not one of them"), std::string::npos);
}

TEST(TensorShard, RowsAreViewsOfTheirOwnBytes) {
  // 3 rows of 64 Q8_0 values (2 blocks of 34 bytes each per row), bytes numbered.
  std::vector<uint8_t> bytes(3 * 68);
  std::iota(bytes.begin(), bytes.end(), uint8_t{0});
  const WeightView w{DType::Q8_0, bytes.data(), 64, 3};
  const WeightView rows = shard_rows(w, {1, 3});
  EXPECT_EQ(rows.data, bytes.data() + 68);
  EXPECT_EQ(rows.rows, 2);
  EXPECT_EQ(rows.cols, 64);
}

TEST(TensorShard, TinyQwen3ShardsAreRowViewsOfTheWholeModel) {
  // tiny-qwen3: n_embd 32, 4 query heads, 2 KV heads of 32, n_ff 96.
  auto whole = Model::load(tiny("tiny-qwen3"), {.prefault = false, .n_threads = 1});
  ASSERT_TRUE(whole.ok()) << whole.error().message;
  const ModelWeights& all = (*whole)->weights();
  int64_t vocab = 0;
  for (int r = 0; r < 2; ++r) {
    ModelConfig config = (*whole)->config();
    ModelWeights weights = all;
    auto plan = plan_tensor_shard(config, weights, {r, 2});
    ASSERT_TRUE(plan.ok()) << plan.error().message;
    EXPECT_GT(apply_tensor_shard(config, weights, *plan), 0);
    EXPECT_EQ(config.n_head, 2);
    EXPECT_EQ(config.n_head_kv, 1);
    EXPECT_EQ(config.n_ff, 48);
    vocab += weights.output.rows;
    for (size_t l = 0; l < weights.layers.size(); ++l) {
      const LayerWeights &L = weights.layers[l], &W = all.layers[l];
      // Each projection is its rows of the whole one, read in place: Q, K, V
      // by head, gate/up by FFN row, attn_output and ffn_down by output row
      // over the whole input (the gathered heads, the gathered hidden).
      auto expect_rows = [&](Projection p, int64_t first, int64_t n, int64_t cols) {
        const size_t bytes = row_bytes(W[p].dtype, W[p].cols);
        EXPECT_EQ(L[p].data, static_cast<const uint8_t*>(W[p].data) + bytes * first) << l;
        EXPECT_EQ(L[p].rows, n) << l;
        EXPECT_EQ(L[p].cols, cols) << l;
      };
      expect_rows(Projection::kQ, 64 * r, 64, 32);
      expect_rows(Projection::kK, 32 * r, 32, 32);
      expect_rows(Projection::kV, 32 * r, 32, 32);
      expect_rows(Projection::kO, 16 * r, 16, 128);
      expect_rows(Projection::kGate, 48 * r, 48, 32);
      expect_rows(Projection::kUp, 48 * r, 48, 32);
      expect_rows(Projection::kDown, 16 * r, 16, 96);
    }
  }
  EXPECT_EQ(vocab, all.output.rows);
}

TEST(TensorShard, ExpertParallelRanksHoldTheirExpertsBytesAndTheWholeRouter) {
  // tiny-qwen3moe: 16 experts of 64 rows (gate/up) and 32 (down) in each of 3
  // layers; 2 KV heads.
  auto whole = Model::load(tiny("tiny-qwen3moe"), {.prefault = false, .n_threads = 1});
  ASSERT_TRUE(whole.ok()) << whole.error().message;
  const ModelWeights& all = (*whole)->weights();
  for (int r = 0; r < 2; ++r) {
    ModelConfig config = (*whole)->config();
    ModelWeights weights = all;
    auto plan = plan_tensor_shard(config, weights, {r, 2, true});
    ASSERT_TRUE(plan.ok()) << plan.error().message;
    EXPECT_EQ(plan->experts.edges, (std::vector<int64_t>{0, 8, 16}));
    EXPECT_GT(apply_tensor_shard(config, weights, *plan), 0);
    EXPECT_EQ(config.moe.n_expert, 16);  // the router's outputs: every rank routes every token
    for (size_t l = 0; l < weights.layers.size(); ++l) {
      const MoeWeights &M = weights.layers[l].moe, &W = all.layers[l].moe;
      ASSERT_TRUE(M);
      EXPECT_EQ(M.router.data, W.router.data);
      EXPECT_EQ(M.router.rows, 16);
      for (auto [part, full] : {std::pair{&M.gate, &W.gate}, {&M.up, &W.up}, {&M.down, &W.down}}) {
        EXPECT_EQ(part->n_expert, 8) << l;
        EXPECT_EQ(part->rows, full->rows) << l;
        EXPECT_EQ(part->cols, full->cols) << l;
        // Expert i of the rank is expert 8r + i of the file, in place.
        for (int64_t i = 0; i < 8; ++i) EXPECT_EQ(part->expert(i).data, full->expert(8 * r + i).data) << l;
      }
    }
  }
  // Without the flag the same model is refused, naming it.
  ModelConfig config = (*whole)->config();
  auto refused = plan_tensor_shard(config, all, {0, 2});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("--enable-expert-parallel"), std::string::npos);
}

TEST(TensorShard, ExpertParallelSplitsTheSharedExpertAndLeadingDenseLayersByRows) {
  // tiny-glm4moe: 2 leading dense layers (n_ff 96), then MoE layers of 16
  // experts with one shared expert of 64 rows; n_embd 32.
  auto whole = Model::load(tiny("tiny-glm4moe"), {.prefault = false, .n_threads = 1});
  ASSERT_TRUE(whole.ok()) << whole.error().message;
  const ModelWeights& all = (*whole)->weights();
  for (int r = 0; r < 2; ++r) {
    ModelConfig config = (*whole)->config();
    ModelWeights weights = all;
    auto plan = plan_tensor_shard(config, weights, {r, 2, true});
    ASSERT_TRUE(plan.ok()) << plan.error().message;
    EXPECT_EQ(plan->shared.edges, (std::vector<int64_t>{0, 32, 64}));
    apply_tensor_shard(config, weights, *plan);
    EXPECT_EQ(config.moe.shared_width(), 32);
    EXPECT_EQ(config.n_ff, 48);
    for (size_t l = 0; l < weights.layers.size(); ++l) {
      const LayerWeights &L = weights.layers[l], &W = all.layers[l];
      if (!W.moe) {
        EXPECT_EQ(L[Projection::kGate].data,
                  static_cast<const uint8_t*>(W[Projection::kGate].data) +
                      row_bytes(W[Projection::kGate].dtype, W[Projection::kGate].cols) * 48 * r);
        continue;
      }
      const size_t gate_row = row_bytes(W.moe.gate_shexp.dtype, W.moe.gate_shexp.cols);
      EXPECT_EQ(L.moe.gate_shexp.data, static_cast<const uint8_t*>(W.moe.gate_shexp.data) + gate_row * 32 * r);
      EXPECT_EQ(L.moe.gate_shexp.rows, 32);
      const size_t down_row = row_bytes(W.moe.down_shexp.dtype, W.moe.down_shexp.cols);
      EXPECT_EQ(L.moe.down_shexp.data, static_cast<const uint8_t*>(W.moe.down_shexp.data) + down_row * 16 * r);
      EXPECT_EQ(L.moe.down_shexp.rows, 16);
      EXPECT_EQ(L.moe.down_shexp.cols, 64);  // the whole gathered hidden
      EXPECT_EQ(L.moe.gate.expert(0).data, W.moe.gate.expert(8 * r).data);
      EXPECT_EQ(L.moe.selection_bias.data, W.moe.selection_bias.data);
    }
  }
}

// What bit-identity rests on: a rank's rows of a projection, made a Linear of
// their own (repacked as one process repacks the whole), compute the same
// bits as those rows of the whole matrix, for the layouts that group rows
// (packed Q4_0/Q8_0, Q4_K's repack, tinyBLAS F32) and the tiled K-quant path
// (9 tokens), a tail of rows past the last 16-row group included. (Split in
// groups of 4 instead, Q4_K's ranks leave the repack and differ.)
TEST(TensorShard, ARanksRowsComputeTheWholeMatrixsBits) {
  const int64_t cols = 256;
  uint32_t seed = 1;
  auto next = [&seed] {
    seed = seed * 1664525u + 1013904223u;
    return static_cast<float>(seed >> 8) / static_cast<float>(1u << 24) - 0.5f;
  };
  for (const auto& [type, rows] : std::vector<std::pair<DType, int64_t>>{
           {DType::Q4_0, 48}, {DType::Q8_0, 44}, {DType::Q4_K, 40}, {DType::Q6_K, 44}, {DType::F32, 44}}) {
    const size_t row = row_bytes(type, cols);
    std::vector<uint8_t> bytes(row * rows);
    std::vector<float> values(cols);
    for (int64_t r = 0; r < rows; ++r) {
      for (float& v : values) v = next();
      kernels::quantize_row(type, values.data(), bytes.data() + row * r, cols);
    }
    const WeightView w{type, bytes.data(), cols, rows};
    const Linear whole = Linear::make(w);
    for (int64_t n_tokens : {1, 5, 9}) {
      std::vector<float> x(n_tokens * cols);
      for (float& v : x) v = next();
      const std::vector<kernels::TokenPlace> places = kernels::one_chunk(n_tokens);
      const StepTokens tokens{n_tokens, places.data()};
      LinearInput in;
      whole.prepare(in, n_tokens);
      whole.quantize(x.data(), 0, n_tokens, tokens, in);
      std::vector<float> expected(n_tokens * rows);
      whole.compute(in, tokens, expected.data(), 0, 1);
      const ShardSplit split = split_rows(rows, kShardRowGroup, 2);
      for (int rank = 0; rank < 2; ++rank) {
        const ShardRange mine = split.of(rank);
        const Linear part = Linear::make(shard_rows(w, mine));
        LinearInput part_in;
        part.prepare(part_in, n_tokens);
        part.quantize(x.data(), 0, n_tokens, tokens, part_in);
        std::vector<float> got(n_tokens * mine.size());
        part.compute(part_in, tokens, got.data(), 0, 1);
        for (int64_t t = 0; t < n_tokens; ++t)
          EXPECT_EQ(std::memcmp(got.data() + t * mine.size(), expected.data() + t * rows + mine.begin,
                                mine.size() * sizeof(float)),
                    0)
              << info(type).name << ", " << n_tokens << " tokens, rank " << rank << ", token " << t;
      }
    }
  }
}

}  // namespace
}  // namespace inferd
