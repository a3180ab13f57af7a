// Tensor parallelism's arithmetic: which part of each weight one of T ranks
// holds (Megatron's split, GQA-aware), and the views of those parts. No MPI
// here: a rank's shard is a smaller model of the same shape (fewer heads, a
// narrower FFN, a slice of the vocabulary) whose partial sums the ranks add
// up (model/tensor_parallel_comm.h).
//
// Rank i of T holds:
//  - KV heads [g0, g1) (whole heads; T must divide n_head_kv) and the query
//    heads of their groups: attn_q/k/v's rows and biases of those heads, and
//    attn_output's columns of those query heads;
//  - FFN units [f0, f1): ffn_gate/up's rows and ffn_down's columns, the units
//    being the largest quantization block of the ffn_down tensors, so that no
//    quantized block of a row is ever split (the split may then be uneven);
//  - vocabulary rows [v0, v1) of the LM head (its logits are gathered);
//  - attn_output's bias on rank 0 only (the ranks' outputs are summed);
//  - the norms, the embedding table (each rank looks up its tokens' rows)
//    and the RoPE factors whole.
#pragma once
#include <cstdint>
#include <string>

#include "core/result.h"
#include "model/config.h"
#include "model/weights.h"

namespace inferd {

// This process's share of a tensor-parallel model: rank `index` of `count`.
struct TensorShard {
  int index = 0;
  int count = 1;
};

// A half-open range of rows, columns, heads or units.
struct ShardRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const ShardRange&) const = default;
};

// Shard `shard`'s part of n units: contiguous and balanced (the first
// n % count shards take one more).
ShardRange shard_units(int64_t n, TensorShard shard);

// What one rank holds, in the full model's numbering.
struct TensorShardPlan {
  ShardRange kv_heads;   // of n_head_kv
  ShardRange q_heads;    // of n_head: the groups of kv_heads
  ShardRange ffn;        // of n_ff: rows of gate/up, columns of down
  ShardRange vocab;      // rows of the LM head
  int64_t ffn_unit = 0;  // n_ff is split in whole units of this many columns
};

// The plan for this rank, or an error naming the rule a model breaks: T must
// divide the KV heads; a dense attention + gated-FFN model (MoE FFNs, latent
// attention, recurrent hybrids and pooled models are refused by name); every
// column split (attn_output, ffn_down) on its type's block boundary.
Result<TensorShardPlan> plan_tensor_shard(const ModelConfig& config, const ModelWeights& weights, TensorShard shard);

// Rows [r.begin, r.end) of w: a view into the same bytes.
WeightView shard_rows(const WeightView& w, ShardRange r);
// Columns [c.begin, c.end) of every row of w, copied into a buffer kept in
// `derived` (only those bytes of w are read). Refused, naming `name`, when
// either end is not on the boundary of w's quantization blocks.
Result<WeightView> shard_columns(const WeightView& w, ShardRange c, const std::string& name,
                                 std::vector<std::shared_ptr<const std::vector<std::byte>>>& derived);

// Turns a whole model's config and weights into rank `shard`'s: fewer heads,
// a narrower FFN, views of its rows, copies of its columns (plan from
// plan_tensor_shard). Returns the bytes of weights this rank holds.
Result<int64_t> apply_tensor_shard(ModelConfig& config, ModelWeights& weights, const TensorShardPlan& plan,
                                   TensorShard shard);

}  // namespace inferd
