// What a KV cache of a given dtype holds for a model, and whether the model
// can have one: the numbers people size a cache by (bytes per token, tokens
// for a budget) and the check behind --kv-cache-dtype. The bytes themselves
// come from the specs (kv/kv_cache_spec.h via KVLayout); this only turns
// blocks into tokens.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/result.h"
#include "model/kv_cache.h"
#include "model/model.h"

namespace inferd {

// Tokens of full context that `usable_blocks` blocks of a layout hold: each
// token takes a slot in every group's block, so a model with windowed layers
// (several groups) holds fewer per block than a model with one group.
int64_t kv_tokens_for_blocks(const KVLayout& layout, int64_t usable_blocks);

struct KVCapacity {
  DType dtype = kv::kDefaultKVCacheDType;
  size_t bytes_per_token = 0;  // keys and values of every layer, each in its group's dtype
  int64_t blocks = 0;          // usable blocks (the reserved null block excluded)
  int64_t tokens = 0;          // tokens of full context those blocks hold
  // A model with recurrent layers: one sequence's state (every recurrent
  // layer's, f32 whatever the dtype), the slots the budget keeps (one per
  // sequence that can run at once) and their bytes, the cache's spare slot
  // included. All 0 for other models.
  size_t state_bytes_per_sequence = 0;
  int32_t state_slots = 0;
  int64_t state_bytes = 0;
};

// Bytes of the state slots a cache for this model keeps for n_state_slots
// running sequences, before its blocks (ModelRunner takes them from the KV
// budget first); 0 for a model without recurrent layers.
int64_t kv_state_slots_bytes(const KVLayout& layout, int32_t n_state_slots);

// What a cache of `budget_bytes` of this dtype holds for a model with blocks
// of block_size tokens (as ModelRunner sizes it: the state slots of
// n_state_slots sequences first if the model has recurrent layers, then
// whole blocks, one reserved). No blocks when the slots take the budget.
// skip_sliding_window: sliding-window layers in f16 (KVLayout::plan).
KVCapacity kv_capacity_for_bytes(const ModelConfig& config, int32_t block_size, DType dtype, int64_t budget_bytes,
                                 int32_t n_state_slots = 0, bool skip_sliding_window = false);

// The dtypes of kv::kv_cache_dtype_choices() this model's executor can keep
// its KV cache in, f16 first.
std::vector<DType> supported_kv_cache_dtypes(const Model& model, int32_t block_size);

// Ok when this model's executor can keep its KV cache in `dtype`; else an
// error naming the dtype, why not, and the dtypes it can.
Status check_kv_cache_dtype(const Model& model, DType dtype, int32_t block_size, bool skip_sliding_window = false);

}  // namespace inferd
