// Storage for the key/value cache: a pool of fixed-size blocks of slots, one
// slot per token, holding every layer's keys and values in f16. Which blocks
// belong to which sequence is decided elsewhere (the block tables passed in a
// ForwardBatch); this class only owns the memory.
#pragma once
#include <cstdint>
#include <memory>

#include "core/aligned_bytes.h"
#include "model/config.h"

namespace inferd {

class KVCache {
 public:
  KVCache(const ModelConfig& config, int64_t n_blocks, int64_t block_size);

  int64_t n_blocks() const { return n_blocks_; }
  int64_t block_size() const { return block_size_; }
  int64_t n_slots() const { return n_blocks_ * block_size_; }
  int64_t kv_dim() const { return kv_dim_; }
  size_t bytes() const { return 2 * n_elements_ * sizeof(uint16_t); }
  // Bytes one token takes across all layers (keys and values).
  static size_t bytes_per_token(const ModelConfig& c) {
    return static_cast<size_t>(2 * c.n_layer * c.kv_dim()) * sizeof(uint16_t);
  }

  uint16_t* k(int64_t layer) { return reinterpret_cast<uint16_t*>(k_.data()) + layer * n_slots() * kv_dim_; }
  uint16_t* v(int64_t layer) { return reinterpret_cast<uint16_t*>(v_.data()) + layer * n_slots() * kv_dim_; }

 private:
  int64_t n_blocks_, block_size_, kv_dim_;
  size_t n_elements_;
  // Left uninitialized: a slot is always written before it is read, and an
  // untouched page costs no memory, so a cache sized from a memory budget
  // neither takes seconds to zero nor commits pages it never uses. On huge
  // pages: a decode step writes each layer's new keys and values to fresh
  // memory, and on 4 KiB pages that was several page faults per token, taken
  // by whichever thread writes them while the others wait at the next barrier.
  AlignedBytes k_, v_;
};

}  // namespace inferd
