// Tensor parallelism's arithmetic: which part of each weight one of T ranks
// holds (Megatron's split, GQA-aware, every projection cut along its output
// rows), and the views of those parts. No MPI here: a rank's shard is a
// smaller model of the same shape whose outputs the ranks gather
// (model/tensor_parallel_comm.h).
//
// Rank i of T holds row ranges, each a view into the mapping:
//  - KV heads [g0, g1) (whole heads; T must divide n_head_kv) and the query
//    heads of their groups: attn_q/k/v's rows and biases of those heads;
//  - FFN rows [f0, f1) of ffn_gate/up;
//  - rows [e0, e1) of n_embd of attn_output and ffn_down (and attn_output's
//    bias): each reads the whole gathered input (the heads' outputs, the
//    activated hidden), so every dot product is one process's, bit for bit;
//  - vocabulary rows [v0, v1) of the LM head (its logits are gathered);
//  - the norms, the embedding table (each rank looks up its tokens' rows)
//    and the RoPE factors whole;
//  - with expert parallelism (a mixture-of-experts model): experts [x0, x1)
//    of each MoE layer, whole (their gate/up/down matrices' bytes); the
//    router, its biases and the selection bias whole, so every rank routes
//    every token as one process does; the shared expert's rows split like a
//    dense FFN's (gate/up rows [s0, s1), down's output rows as ffn_down's).
//    Each rank's experts' output rows are gathered (all_gather_rows).
// The row splits other than the heads' are in whole groups of
// kShardRowGroup rows, so that each rank's kernels take the same layout and
// order for its rows as one process takes for the whole matrix.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/result.h"
#include "model/config.h"
#include "model/weights.h"

namespace inferd {

// This process's share of a tensor-parallel model: rank `index` of `count`.
struct TensorShard {
  int index = 0;
  int count = 1;
  // Divide a mixture's experts among the ranks (--enable-expert-parallel);
  // without it a mixture-of-experts model is refused.
  bool expert_parallel = false;
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

// How n rows (or columns) are cut among every rank: rank r's are
// [edges[r], edges[r + 1]). Every rank knows every rank's part, so that a
// gather can put each part in place.
struct ShardSplit {
  std::vector<int64_t> edges;  // count + 1 entries, from 0 to the whole
  ShardRange of(int rank) const { return {edges[rank], edges[rank + 1]}; }
  int64_t whole() const { return edges.empty() ? 0 : edges.back(); }
  int count() const { return static_cast<int>(edges.size()) - 1; }
};

// The rows a layout of the CPU kernels groups (the packed, fast and BF16
// layouts' 16, the Q4_K repack's 8, tinyBLAS's 4 divide it): a rank's rows
// start on a multiple of it, so its matrix takes the kernels one process
// takes for those rows.
inline constexpr int64_t kShardRowGroup = 16;

// n rows in whole groups of `group` balanced over `count` ranks (shard_units
// of the groups); the rows after the last whole group go to the last rank,
// whose part then ends as the whole matrix ends.
ShardSplit split_rows(int64_t n, int64_t group, int count);
// n_units whole units of `unit` rows each (shard_units), in rows: the
// attention output's columns by KV head group.
ShardSplit split_units(int64_t n_units, int64_t unit, int count);

// What one rank holds, in the full model's numbering, and how the gathered
// activations are split among all ranks.
struct TensorShardPlan {
  TensorShard shard;
  ShardRange kv_heads;  // this rank's, of n_head_kv
  ShardRange q_heads;   // this rank's, of n_head: the groups of kv_heads
  ShardSplit attn;      // the attention output's q_dim columns (each rank's q heads)
  ShardSplit ffn;       // n_ff: rows of gate/up, columns of the activated hidden
  ShardSplit embd;      // n_embd: rows of attn_output and ffn_down
  ShardSplit vocab;     // rows of the LM head
  // Expert parallelism only (a mixture-of-experts model), else empty:
  ShardSplit experts;   // the experts of each MoE layer (whole experts, balanced)
  ShardSplit shared;    // the shared expert's hidden: rows of its gate/up
};

// The plan for this rank, or an error naming the rule a model breaks: T must
// divide the KV heads; a dense attention + gated-FFN model, or with
// shard.expert_parallel a mixture of at least T experts (latent attention,
// recurrent hybrids, attention sinks and pooled models are refused by name).
Result<TensorShardPlan> plan_tensor_shard(const ModelConfig& config, const ModelWeights& weights, TensorShard shard);

// Rows [r.begin, r.end) of w: a view into the same bytes.
WeightView shard_rows(const WeightView& w, ShardRange r);

// Experts [r.begin, r.end) of w: a view into the same bytes.
ExpertsView shard_experts(const ExpertsView& w, ShardRange r);

// Turns a whole model's config and weights into rank `shard`'s (plan from
// plan_tensor_shard): fewer heads, a narrower FFN (and shared expert), views
// of its rows and experts (config.moe.n_expert stays the router's whole).
// Returns the bytes of weights this rank holds of `layers` (a pipeline
// stage's, else all; the head's counted when they reach the last layer).
int64_t apply_tensor_shard(ModelConfig& config, ModelWeights& weights, const TensorShardPlan& plan,
                           ShardRange layers = {0, INT64_MAX});

}  // namespace inferd
