// Storage for the key/value cache: a pool of fixed-size blocks of slots, one
// slot per token, holding keys and values in f16. Which blocks belong to which
// sequence is decided elsewhere (the block tables passed in a ForwardBatch);
// this class only owns the memory and says which layers share a block.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/aligned_bytes.h"
#include "core/shared_bytes.h"
#include "model/config.h"

namespace inferd {

// Which layers' keys and values a KV block holds (vLLM v1's KV cache groups).
// Layers with the same attention window form groups of layers_per_block
// layers each, so a block of any group is the same size and all groups share
// one pool; each request has one block table per group. With a single window
// (every llama or qwen model) there is one group of all layers, and the layout
// is one slab of [block][slot] per layer. A model with local and global layers
// (Gemma 3: 15 windowed, 3 global) gets layers_per_block = the smaller count
// (3) and a group per 3 layers (1 global, 5 windowed), so a long request's
// windowed layers hold a window's worth of blocks instead of the whole context.
struct KVLayout {
  int32_t layers_per_block = 0;
  std::vector<int64_t> group_windows;  // per group: 0 for full attention, else the window
  std::vector<int32_t> layer_group;    // per layer: its group
  std::vector<int32_t> layer_slab;     // per layer: its place among its block's layers

  static KVLayout plan(const ModelConfig& config);
  int32_t num_groups() const { return static_cast<int32_t>(group_windows.size()); }
  // Blocks enough for one request of n_tokens in every group (an upper bound:
  // windowed groups give blocks back as the request grows).
  int64_t blocks_for_request(int64_t n_tokens, int64_t block_size) const {
    return num_groups() * ((n_tokens + block_size - 1) / block_size);
  }
};

class KVCache {
 public:
  // shareable: the keys and values live on shared memory (SharedBytes) that a
  // KV consumer on this host can map, when the system gives it (else, and by
  // default, on this process's own huge pages).
  KVCache(const ModelConfig& config, int64_t n_blocks, int64_t block_size, bool shareable = false);
  // The name of a shareable cache's memory objects (what a consumer checks).
  static constexpr const char* kSharedName = "inferd-kv";

  int64_t n_blocks() const { return n_blocks_; }
  int64_t block_size() const { return block_size_; }
  int64_t n_slots() const { return n_blocks_ * block_size_; }
  int64_t kv_dim() const { return kv_dim_; }
  size_t bytes() const { return 2 * n_elements_ * sizeof(uint16_t); }
  const KVLayout& layout() const { return layout_; }
  // Bytes one token takes across all layers (keys and values) where every
  // layer keeps it.
  static size_t bytes_per_token(const ModelConfig& c) {
    return static_cast<size_t>(2 * c.n_layer * c.kv_dim()) * sizeof(uint16_t);
  }
  // Bytes of one block (keys and values of its layers_per_block layers).
  static size_t block_bytes(const ModelConfig& c, int64_t block_size) {
    return static_cast<size_t>(2 * KVLayout::plan(c).layers_per_block * block_size * c.kv_dim()) *
           sizeof(uint16_t);
  }

  // A layer's slab: slot s of block b is at (b * block_size + s) * kv_dim.
  uint16_t* k(int64_t layer) { return reinterpret_cast<uint16_t*>(k_) + slab_offset(layer); }
  uint16_t* v(int64_t layer) { return reinterpret_cast<uint16_t*>(v_) + slab_offset(layer); }
  // Copies every layer's keys and values of block `src` into block `dst`
  // (copy on write of a block that forked sequences shared).
  void copy_block(int64_t src, int64_t dst);
  // A block's bytes whole: its layers' keys, then their values (offload tiers).
  size_t block_bytes() const { return 2 * static_cast<size_t>(layout_.layers_per_block * block_size_ * kv_dim_) * sizeof(uint16_t); }
  void read_block(int64_t block, std::byte* dst) const;
  void write_block(int64_t block, const std::byte* src);
  // The keys' and the values' arrays whole: layers_per_block slabs of
  // [block][slot][kv_dim] each (a KV transfer maps them and reads blocks
  // straight out of them).
  std::byte* keys_base() { return reinterpret_cast<std::byte*>(k_); }
  std::byte* values_base() { return reinterpret_cast<std::byte*>(v_); }
  // Their memfds when they are on shared memory, else -1.
  int keys_fd() const { return k_shared_ ? k_shared_.fd() : -1; }
  int values_fd() const { return v_shared_ ? v_shared_.fd() : -1; }
  // Why a shareable cache is not on shared memory (empty when it is, or was not asked to be).
  const std::string& shared_error() const { return shared_error_; }
  // The KV group whose block table (and slots) a layer reads.
  int32_t group(int64_t layer) const { return layout_.layer_group[layer]; }

 private:
  int64_t slab_offset(int64_t layer) const { return layout_.layer_slab[layer] * n_slots() * kv_dim_; }

  KVLayout layout_;
  int64_t n_blocks_, block_size_, kv_dim_;
  size_t n_elements_;
  // Left uninitialized: a slot is always written before it is read, and an
  // untouched page costs no memory, so a cache sized from a memory budget
  // neither takes seconds to zero nor commits pages it never uses. On huge
  // pages: a decode step writes each layer's new keys and values to fresh
  // memory, and on 4 KiB pages that was several page faults per token, taken
  // by whichever thread writes them while the others wait at the next barrier.
  AlignedBytes k_local_, v_local_;
  SharedBytes k_shared_, v_shared_;
  uint8_t* k_ = nullptr;  // whichever of the two holds the keys
  uint8_t* v_ = nullptr;
  std::string shared_error_;
};

}  // namespace inferd
