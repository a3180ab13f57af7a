#include "model/tensor_shard.h"

#include <algorithm>
#include <array>

#include "kernels/cpu/bf16_layout.h"
#include "kernels/cpu/fast_layout.h"
#include "kernels/cpu/packed_layout.h"

namespace inferd {

namespace {

static_assert(kShardRowGroup % kernels::kPackRows == 0 && kShardRowGroup % kernels::kFastRows == 0 &&
                  kShardRowGroup % kernels::kBf16Rows == 0,
              "a rank's rows must be whole row groups of every kernel layout");

// The dense decoders whose layers are attention + a dense FFN with separate
// Q/K/V and gate/up/down tensors: what the split below knows how to cut.
constexpr std::array<std::string_view, 5> kShardedArchitectures = {"llama", "qwen2", "qwen3", "mistral", "gemma3"};
// The mixtures whose layers are that attention and a routed FFN (with, for
// glm4moe, leading dense layers and a shared expert): what expert
// parallelism cuts.
constexpr std::array<std::string_view, 2> kExpertParallelArchitectures = {"qwen3moe", "glm4moe"};

bool one_of(std::string_view name, const auto& names) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// A 1-D F32 vector's elements [r.begin, r.end) (a bias of split rows).
WeightView shard_vector(const WeightView& w, ShardRange r) {
  if (!w) return w;
  return WeightView{w.dtype, w.f32() + r.begin, r.size(), 1};
}

int64_t view_bytes(const WeightView& w) {
  return w ? static_cast<int64_t>(row_bytes(w.dtype, w.cols)) * w.rows : 0;
}

}  // namespace

ShardRange shard_units(int64_t n, TensorShard shard) {
  const int64_t base = n / shard.count, extra = n % shard.count;
  const int64_t begin = shard.index * base + std::min<int64_t>(shard.index, extra);
  return {begin, begin + base + (shard.index < extra ? 1 : 0)};
}

ShardSplit split_units(int64_t n_units, int64_t unit, int count) {
  ShardSplit split;
  split.edges.push_back(0);
  for (int r = 0; r < count; ++r) split.edges.push_back(shard_units(n_units, {r, count}).end * unit);
  return split;
}

ShardSplit split_rows(int64_t n, int64_t group, int count) {
  ShardSplit split = split_units(n / group, group, count);
  split.edges.back() = n;
  return split;
}

Result<TensorShardPlan> plan_tensor_shard(const ModelConfig& c, const ModelWeights& w, TensorShard shard) {
  const std::string t = std::to_string(shard.count);
  const std::string refused = "--tensor-parallel-size " + t + ": ";
  if (!c.can_generate() || c.returns_pooled())
    return make_error(refused + "only a generating decoder model is split across ranks");
  const bool moe = c.moe.n_expert > 0;
  if (moe && !shard.expert_parallel)
    return make_error(refused + "a mixture-of-experts model is split across ranks by its experts: add "
                      "--enable-expert-parallel (each rank then holds 1/" + t + " of the experts)");
  if (c.mla)
    return make_error(refused + "multi-latent attention (MLA) is not split across ranks yet (neither by tensor "
                      "nor by expert parallelism)");
  if (c.has_recurrent_layers() || c.attn_output_gate)
    return make_error(refused + "hybrid recurrent layers are not split across ranks yet");
  for (const LayerWeights& L : w.layers)
    if (L.attn_sinks) return make_error(refused + "attention sinks are not split across ranks yet");
  if (moe && !one_of(c.architecture, kExpertParallelArchitectures))
    return make_error(refused + "expert parallelism splits the mixtures qwen3moe and glm4moe only; '" +
                      c.architecture + "' is not one of them yet");
  if (!moe && !one_of(c.architecture, kShardedArchitectures))
    return make_error(refused + "tensor parallelism splits the dense architectures llama, qwen2, qwen3, mistral and "
                      "gemma3 only; '" + c.architecture + "' is not one of them yet");
  if (moe && c.moe.n_expert < shard.count)
    return make_error(refused + "each rank holds whole experts, so the model's " + std::to_string(c.moe.n_expert) +
                      " experts must be at least the tensor parallel size");
  if (c.n_head_kv % shard.count != 0)
    return make_error(refused + "each rank holds whole KV heads, so the tensor parallel size must divide the "
                      "model's " + std::to_string(c.n_head_kv) + " KV heads (" + std::to_string(c.n_head) +
                      " query heads)");
  TensorShardPlan plan;
  plan.shard = shard;
  plan.kv_heads = shard_units(c.n_head_kv, shard);
  const int64_t group = c.n_head / c.n_head_kv;
  plan.q_heads = {plan.kv_heads.begin * group, plan.kv_heads.end * group};
  plan.attn = split_units(c.n_head_kv, group * c.head_dim, shard.count);
  plan.ffn = split_rows(c.n_ff, kShardRowGroup, shard.count);
  plan.embd = split_rows(c.n_embd, kShardRowGroup, shard.count);
  plan.vocab = split_rows(w.output ? w.output.rows : c.n_vocab, kShardRowGroup, shard.count);
  if (moe) {
    plan.experts = split_units(c.moe.n_expert, 1, shard.count);
    plan.shared = split_rows(c.moe.shared_width(), kShardRowGroup, shard.count);
    if (c.moe.shared_width() > 0 && c.moe.shared_width() < kShardRowGroup * shard.count)
      return make_error(refused + "the shared expert's " + std::to_string(c.moe.shared_width()) +
                        " rows give a rank fewer than " + std::to_string(kShardRowGroup) + " rows");
  }
  // A mixture without dense layers does not read n_ff.
  const bool dense_ffn = !moe || c.moe.n_leading_dense > 0;
  if ((dense_ffn && c.n_ff < kShardRowGroup * shard.count) || c.n_embd < kShardRowGroup * shard.count)
    return make_error(refused + "the FFN's " + std::to_string(c.n_ff) + " and the embedding's " +
                      std::to_string(c.n_embd) + " rows give a rank fewer than " + std::to_string(kShardRowGroup) +
                      " rows");
  return plan;
}

WeightView shard_rows(const WeightView& w, ShardRange r) {
  if (!w) return w;
  const size_t bytes = row_bytes(w.dtype, w.cols);
  return WeightView{w.dtype, static_cast<const uint8_t*>(w.data) + bytes * static_cast<size_t>(r.begin), w.cols,
                    r.size()};
}

ExpertsView shard_experts(const ExpertsView& w, ShardRange r) {
  if (!w) return w;
  ExpertsView part = w;
  part.data = static_cast<const uint8_t*>(w.expert(r.begin).data);
  part.n_expert = r.size();
  return part;
}

int64_t apply_tensor_shard(ModelConfig& c, ModelWeights& w, const TensorShardPlan& plan, ShardRange layers) {
  const int rank = plan.shard.index;
  const int64_t D = c.head_dim;
  const ShardRange q_rows{plan.q_heads.begin * D, plan.q_heads.end * D};
  const ShardRange kv_rows{plan.kv_heads.begin * D, plan.kv_heads.end * D};
  const ShardRange ffn_rows = plan.ffn.of(rank), embd_rows = plan.embd.of(rank);
  int64_t held = 0;
  for (int64_t l = 0; l < static_cast<int64_t>(w.layers.size()); ++l) {
    LayerWeights& L = w.layers[l];
    // Every layer is cut (views: nothing is read); a stage's are counted.
    const bool mine = l >= layers.begin && l < layers.end;
    auto& proj = L.proj;
    auto cut = [&proj, &L](Projection p, ShardRange rows) { proj[static_cast<int>(p)] = shard_rows(L[p], rows); };
    cut(Projection::kQ, q_rows);
    cut(Projection::kK, kv_rows);
    cut(Projection::kV, kv_rows);
    L.bq = shard_vector(L.bq, q_rows);
    L.bk = shard_vector(L.bk, kv_rows);
    L.bv = shard_vector(L.bv, kv_rows);
    cut(Projection::kO, embd_rows);
    L.bo = shard_vector(L.bo, embd_rows);
    cut(Projection::kGate, ffn_rows);
    cut(Projection::kUp, ffn_rows);
    cut(Projection::kDown, embd_rows);
    if (mine)
      for (const WeightView& p : L.proj) held += view_bytes(p);
    if (MoeWeights& m = L.moe; m) {
      const ShardRange experts = plan.experts.of(rank), shared_rows = plan.shared.of(rank);
      for (ExpertsView* e : {&m.gate, &m.up, &m.down}) {
        *e = shard_experts(*e, experts);
        if (mine) held += view_bytes(e->expert(0)) * e->n_expert;
      }
      m.gate_shexp = shard_rows(m.gate_shexp, shared_rows);
      m.up_shexp = shard_rows(m.up_shexp, shared_rows);
      m.down_shexp = shard_rows(m.down_shexp, embd_rows);
      if (mine)
        for (const WeightView* p : {&m.router, &m.gate_shexp, &m.up_shexp, &m.down_shexp, &m.gate_inp_shexp})
          held += view_bytes(*p);
    }
  }
  w.output = shard_rows(w.output, plan.vocab.of(rank));
  if (layers.end >= static_cast<int64_t>(w.layers.size())) held += view_bytes(w.output);
  c.n_head = plan.q_heads.size();
  c.n_head_kv = plan.kv_heads.size();
  c.n_ff = ffn_rows.size();
  if (c.moe.shared_width() > 0) c.moe.n_ff_shared = plan.shared.of(rank).size();
  return held;
}

}  // namespace inferd
