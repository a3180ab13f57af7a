#include "model/tensor_shard.h"

#include <algorithm>
#include <array>
#include <cstring>

namespace inferd {

namespace {

// The dense decoders whose layers are attention + a dense FFN with separate
// Q/K/V and gate/up/down tensors: what the split below knows how to cut.
constexpr std::array<std::string_view, 5> kShardedArchitectures = {"llama", "qwen2", "qwen3", "mistral", "gemma3"};

int64_t block_of(DType t) { return info(t).block_size; }

std::string range_text(ShardRange r) { return "[" + std::to_string(r.begin) + ", " + std::to_string(r.end) + ")"; }

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

Result<TensorShardPlan> plan_tensor_shard(const ModelConfig& c, const ModelWeights& w, TensorShard shard) {
  const std::string t = std::to_string(shard.count);
  const std::string refused = "--tensor-parallel-size " + t + ": ";
  if (!c.can_generate() || c.returns_pooled())
    return make_error(refused + "only a generating decoder model is split across ranks");
  if (c.moe.n_expert > 0) return make_error(refused + "mixture-of-experts FFNs are not split across ranks yet");
  if (c.mla) return make_error(refused + "multi-latent attention (MLA) is not split across ranks yet");
  if (c.has_recurrent_layers() || c.attn_output_gate)
    return make_error(refused + "hybrid recurrent layers are not split across ranks yet");
  for (const LayerWeights& L : w.layers)
    if (L.attn_sinks) return make_error(refused + "attention sinks are not split across ranks yet");
  if (std::find(kShardedArchitectures.begin(), kShardedArchitectures.end(), c.architecture) ==
      kShardedArchitectures.end())
    return make_error(refused + "tensor parallelism splits the dense architectures llama, qwen2, qwen3, mistral and "
                      "gemma3 only; '" + c.architecture + "' is not one of them yet");
  if (c.n_head_kv % shard.count != 0)
    return make_error(refused + "each rank holds whole KV heads, so the tensor parallel size must divide the "
                      "model's " + std::to_string(c.n_head_kv) + " KV heads (" + std::to_string(c.n_head) +
                      " query heads)");
  TensorShardPlan plan;
  plan.kv_heads = shard_units(c.n_head_kv, shard);
  const int64_t group = c.n_head / c.n_head_kv;
  plan.q_heads = {plan.kv_heads.begin * group, plan.kv_heads.end * group};
  // ffn_down's rows are split along their K dimension: on whole blocks of
  // every layer's type (the largest one; the block sizes divide each other).
  plan.ffn_unit = 1;
  for (const LayerWeights& L : w.layers)
    if (const WeightView& down = L[Projection::kDown]) plan.ffn_unit = std::max(plan.ffn_unit, block_of(down.dtype));
  if (c.n_ff % plan.ffn_unit != 0 || c.n_ff / plan.ffn_unit < shard.count)
    return make_error(refused + "the FFN's " + std::to_string(c.n_ff) + " columns split on whole " +
                      std::to_string(plan.ffn_unit) + "-value blocks of ffn_down give fewer blocks than ranks");
  const ShardRange units = shard_units(c.n_ff / plan.ffn_unit, shard);
  plan.ffn = {units.begin * plan.ffn_unit, units.end * plan.ffn_unit};
  plan.vocab = shard_units(w.output ? w.output.rows : c.n_vocab, shard);
  return plan;
}

WeightView shard_rows(const WeightView& w, ShardRange r) {
  if (!w) return w;
  const size_t bytes = row_bytes(w.dtype, w.cols);
  return WeightView{w.dtype, static_cast<const uint8_t*>(w.data) + bytes * static_cast<size_t>(r.begin), w.cols,
                    r.size()};
}

Result<WeightView> shard_columns(const WeightView& w, ShardRange c, const std::string& name,
                                 std::vector<std::shared_ptr<const std::vector<std::byte>>>& derived) {
  const int64_t block = block_of(w.dtype);
  if (c.begin % block != 0 || c.end % block != 0)
    return make_error("tensor " + name + " (" + std::string(info(w.dtype).name) + ") cannot be split at columns " +
                      range_text(c) + ": a rank's columns must start and end on the type's " +
                      std::to_string(block) + "-value block boundary (a quantized block is never split across "
                      "ranks); use another --tensor-parallel-size or a file of another type");
  const size_t in_row = row_bytes(w.dtype, w.cols), skip = row_bytes(w.dtype, c.begin),
               out_row = row_bytes(w.dtype, c.size());
  auto bytes = std::make_shared<std::vector<std::byte>>(out_row * static_cast<size_t>(w.rows));
  const auto* src = static_cast<const std::byte*>(w.data);
  for (int64_t r = 0; r < w.rows; ++r)
    std::memcpy(bytes->data() + out_row * static_cast<size_t>(r), src + in_row * static_cast<size_t>(r) + skip, out_row);
  WeightView view{w.dtype, bytes->data(), c.size(), w.rows};
  derived.push_back(std::move(bytes));
  return view;
}

Result<int64_t> apply_tensor_shard(ModelConfig& c, ModelWeights& w, const TensorShardPlan& plan, TensorShard shard) {
  const int64_t D = c.head_dim;
  const ShardRange q_rows{plan.q_heads.begin * D, plan.q_heads.end * D};
  const ShardRange kv_rows{plan.kv_heads.begin * D, plan.kv_heads.end * D};
  int64_t held = 0;
  for (size_t l = 0; l < w.layers.size(); ++l) {
    LayerWeights& L = w.layers[l];
    const std::string prefix = "blk." + std::to_string(l) + ".";
    auto& proj = L.proj;
    proj[static_cast<int>(Projection::kQ)] = shard_rows(L[Projection::kQ], q_rows);
    proj[static_cast<int>(Projection::kK)] = shard_rows(L[Projection::kK], kv_rows);
    proj[static_cast<int>(Projection::kV)] = shard_rows(L[Projection::kV], kv_rows);
    L.bq = shard_vector(L.bq, q_rows);
    L.bk = shard_vector(L.bk, kv_rows);
    L.bv = shard_vector(L.bv, kv_rows);
    if (shard.index != 0) L.bo = {};  // added once, to the sum
    auto o = shard_columns(L[Projection::kO], q_rows, prefix + "attn_output.weight", w.derived);
    if (!o) return o.error();
    proj[static_cast<int>(Projection::kO)] = *o;
    proj[static_cast<int>(Projection::kGate)] = shard_rows(L[Projection::kGate], plan.ffn);
    proj[static_cast<int>(Projection::kUp)] = shard_rows(L[Projection::kUp], plan.ffn);
    auto down = shard_columns(L[Projection::kDown], plan.ffn, prefix + "ffn_down.weight", w.derived);
    if (!down) return down.error();
    proj[static_cast<int>(Projection::kDown)] = *down;
    for (const WeightView& p : L.proj) held += view_bytes(p);
  }
  w.output = shard_rows(w.output, plan.vocab);
  held += view_bytes(w.output);
  c.n_head = plan.q_heads.size();
  c.n_head_kv = plan.kv_heads.size();
  c.n_ff = plan.ffn.size();
  return held;
}

}  // namespace inferd
