#include "model/token_cost.h"

#include <charconv>
#include <string_view>

#include "model/model.h"

namespace inferd {

namespace {
// The layer index of a `blk.<i>.` tensor name, or -1.
int64_t block_index(std::string_view name) {
  constexpr std::string_view kPrefix = "blk.";
  if (!name.starts_with(kPrefix)) return -1;
  int64_t i = -1;
  const char* first = name.data() + kPrefix.size();
  const auto [end, ec] = std::from_chars(first, name.data() + name.size(), i);
  return ec == std::errc{} && end != first ? i : -1;
}
}  // namespace

TokenCost token_cost(const Model& model) {
  const ModelConfig& c = model.config();
  TokenCost cost;
  const double experts_used =
      c.moe.n_expert > 0 ? static_cast<double>(c.moe.n_expert_used) / static_cast<double>(c.moe.n_expert) : 1.0;
  for (const gguf::TensorInfo& t : model.file().tensors()) {
    const int64_t layer = block_index(t.name);
    if (layer < 0 || layer >= c.n_layer) continue;  // embeddings, head, NextN blocks that do not run
    const bool experts = t.name.find("_exps.") != std::string::npos;
    cost.projection_macs += static_cast<double>(t.n_elements()) * (experts ? experts_used : 1.0);
  }
  // A tensor-parallel rank computes its share of every projection; its
  // config() already has its own heads.
  if (model.tensor_comm()) cost.projection_macs /= model.tensor_shard_plan().shard.count;

  const int64_t per_head = c.mla ? 2 * c.mla.kv_lora_rank + c.mla.qk_rope : 2 * c.head_dim;
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const bool attends_to_all =
        c.layers.empty() || (c.layers[l].keeps_kv() && c.layers[l].sliding_window == 0);
    if (attends_to_all) cost.attention_macs_per_position += static_cast<double>(c.n_head * per_head);
  }
  return cost;
}

}  // namespace inferd
