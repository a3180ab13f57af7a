#include "engine/kv_capacity.h"

#include <algorithm>
#include <string>

#include "kv/kv_cache_dtype.h"

namespace inferd {

int64_t kv_tokens_for_blocks(const KVLayout& layout, int64_t usable_blocks) {
  if (layout.num_groups() < 1 || usable_blocks < 1) return 0;
  return usable_blocks / layout.num_groups() * layout.storage_spec().block_size;
}

int64_t kv_state_slots_bytes(const KVLayout& layout, int32_t n_state_slots) {
  if (layout.n_state_layers < 1) return 0;
  return int64_t{n_state_slots + 1} * static_cast<int64_t>(layout.state_slot_bytes());
}

KVCapacity kv_capacity_for_bytes(const ModelConfig& config, int32_t block_size, DType dtype, int64_t budget_bytes,
                                 int32_t n_state_slots, bool skip_sliding_window) {
  const KVLayout layout = KVLayout::plan(config, block_size, dtype, skip_sliding_window);
  KVCapacity c;
  c.dtype = dtype;
  c.bytes_per_token = layout.bytes_per_token();
  if (layout.n_state_layers > 0) {
    c.state_bytes_per_sequence = layout.state_slot_bytes();
    c.state_slots = n_state_slots;
    c.state_bytes = kv_state_slots_bytes(layout, n_state_slots);
  }
  const int64_t block_budget = std::max<int64_t>(0, budget_bytes - c.state_bytes);
  const int64_t block_bytes = static_cast<int64_t>(layout.block_bytes());
  // Block 0 is the pool's reserved null block (kv/block_pool.h).
  c.blocks = block_bytes > 0 ? std::max<int64_t>(0, block_budget / block_bytes - 1) : 0;
  c.tokens = kv_tokens_for_blocks(layout, c.blocks);
  return c;
}

std::vector<DType> supported_kv_cache_dtypes(const Model& model, int32_t block_size) {
  std::vector<DType> supported;
  for (DType t : kv::kv_cache_dtype_choices())
    if (model.check_kv_cache(KVLayout::plan(model.config(), block_size, t))) supported.push_back(t);
  return supported;
}

Status check_kv_cache_dtype(const Model& model, DType dtype, int32_t block_size, bool skip_sliding_window) {
  Status s = model.check_kv_cache(KVLayout::plan(model.config(), block_size, dtype, skip_sliding_window));
  if (s) return s;
  std::string supported;
  for (DType t : supported_kv_cache_dtypes(model, block_size))
    supported += (supported.empty() ? "" : ", ") + kv::kv_cache_dtype_name(t);
  return make_error("KV cache dtype " + kv::kv_cache_dtype_name(dtype) + " is not supported for this model (" +
                    s.error().message + "); supported: " + (supported.empty() ? "none" : supported));
}

}  // namespace inferd
