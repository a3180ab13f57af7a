#include "engine/kv_capacity.h"

#include <algorithm>
#include <string>

#include "kv/kv_cache_dtype.h"

namespace inferd {

int64_t kv_tokens_for_blocks(const KVLayout& layout, int64_t usable_blocks) {
  if (layout.num_groups() < 1 || usable_blocks < 1) return 0;
  return usable_blocks / layout.num_groups() * layout.storage_spec().block_size;
}

KVCapacity kv_capacity_for_bytes(const ModelConfig& config, int32_t block_size, DType dtype, int64_t budget_bytes) {
  const KVLayout layout = KVLayout::plan(config, block_size, dtype);
  KVCapacity c;
  c.dtype = dtype;
  c.bytes_per_token = KVCache::bytes_per_token(config, dtype);
  const int64_t block_bytes = static_cast<int64_t>(layout.block_bytes());
  // Block 0 is the pool's reserved null block (kv/block_pool.h).
  c.blocks = block_bytes > 0 ? std::max<int64_t>(0, budget_bytes / block_bytes - 1) : 0;
  c.tokens = kv_tokens_for_blocks(layout, c.blocks);
  return c;
}

std::vector<DType> supported_kv_cache_dtypes(const Model& model, int32_t block_size) {
  std::vector<DType> supported;
  for (DType t : kv::kv_cache_dtype_choices())
    if (model.check_kv_cache(KVLayout::plan(model.config(), block_size, t))) supported.push_back(t);
  return supported;
}

Status check_kv_cache_dtype(const Model& model, DType dtype, int32_t block_size) {
  Status s = model.check_kv_cache(KVLayout::plan(model.config(), block_size, dtype));
  if (s) return s;
  std::string supported;
  for (DType t : supported_kv_cache_dtypes(model, block_size))
    supported += (supported.empty() ? "" : ", ") + kv::kv_cache_dtype_name(t);
  return make_error("KV cache dtype " + kv::kv_cache_dtype_name(dtype) + " is not supported for this model (" +
                    s.error().message + "); supported: " + (supported.empty() ? "none" : supported));
}

}  // namespace inferd
