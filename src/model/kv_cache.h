// Storage for the key/value cache: a pool of fixed-size blocks of slots, one
// slot per token, holding keys and values in the element type the groups'
// specs name (kv/kv_cache_spec.h, which alone knows the bytes per element).
// Which blocks belong to which sequence is decided elsewhere (the block
// tables passed in a ForwardBatch); this class only owns the memory and says
// which layers share a block.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/aligned_bytes.h"
#include "core/shared_bytes.h"
#include "kv/kv_cache_spec.h"
#include "model/config.h"

namespace inferd {

// Which layers' keys and values a KV block holds (vLLM v1's KV cache groups).
// Layers with the same attention window form groups, each of as many layers
// as a block's bytes hold, so a block of any group is the same size and all
// groups share one pool; each request has one block table per group. With a
// single window (every llama or qwen model) there is one group of all layers.
// A model with local and global layers (Gemma 3: 15 windowed, 3 global) gets
// blocks of the smaller count's layers (3) and a group per 3 layers (1 global,
// 5 windowed), so a long request's windowed layers hold a window's worth of
// blocks instead of the whole context. Each group has a spec
// (kv::KVCacheSpec: kind, window, dtype, heads, block size); groups may differ
// in dtype (--kv-cache-dtype-skip-layers sliding_window keeps windowed layers
// f16), and then a group of smaller slots puts more layers in a block, or
// leaves part of it unused (KVLayout::plan says which).
//
// A block's bytes are contiguous in each store (keys, values): its group's
// layers one after another, each block_size slots (layer_slab * the group's
// segment_bytes into the block).
struct KVLayout {
  int32_t layers_per_block = 0;  // the most layers any group puts in a block
  size_t block_store_bytes = 0;  // one block's bytes in one store (keys, or values)
  std::vector<int64_t> group_windows;  // per group: 0 for full attention, else the window (its spec's)
  std::vector<int32_t> layer_group;    // per layer: its group
  std::vector<int32_t> layer_slab;     // per layer: its place among its block's layers
  std::vector<kv::KVCacheSpec> group_specs;  // per group: what each of its layers keeps
  // A hybrid model's recurrent layers (LayerConfig::recurrent) join no group
  // (their layer_group is -1): each keeps one state per sequence instead, of
  // state_spec (kRecurrentState), in the sequence's state slot. layer_state:
  // per layer, its place among the recurrent layers, else -1.
  std::vector<int32_t> layer_state;
  kv::KVCacheSpec state_spec;
  int32_t n_state_layers = 0;
  // Bytes of one state slot: every recurrent layer's state.
  size_t state_slot_bytes() const { return static_cast<size_t>(n_state_layers) * state_spec.state_bytes(); }

  // The groups of a model's layers, their specs with block_size tokens a
  // block of dtype elements; sliding-window layers of f16 instead with
  // skip_sliding_window (vLLM's --kv-cache-dtype-skip-layers sliding_window).
  // (The defaults are the engine's; what only needs the grouping may leave
  // them.)
  static KVLayout plan(const ModelConfig& config, int32_t block_size = 16,
                       DType dtype = kv::kDefaultKVCacheDType, bool skip_sliding_window = false);
  int32_t num_groups() const { return static_cast<int32_t>(group_windows.size()); }
  // What a pipeline stage running layers [begin, end) keeps of this layout:
  // the same groups (so the same block tables and block count), each block
  // holding only the places those layers use. The other layers' slab is -1.
  KVLayout for_layers(int64_t begin, int64_t end) const;
  // The first group's spec: the kind, block size, heads and the dtype asked
  // for (all groups share kind class and block size; only windowed groups
  // skipped to f16 differ in dtype).
  const kv::KVCacheSpec& storage_spec() const { return group_specs.front(); }
  // Whether the groups keep more than one dtype.
  bool mixed_dtypes() const {
    for (const kv::KVCacheSpec& g : group_specs)
      if (g.dtype != storage_spec().dtype) return true;
    return false;
  }
  // Bytes of one block: keys and values (a latent cache: keys only).
  size_t block_bytes() const { return storage_spec().n_stores() * block_store_bytes; }
  // Bytes one token takes across the per-token layers, keys and values, each
  // layer in its group's dtype.
  size_t bytes_per_token() const;
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
  // A cache of a planned layout (its specs give the block size and dtype).
  // n_state_slots: the state slots of a layout with recurrent layers (one per
  // request that can run at once; kv::StateSlotPool hands them out).
  KVCache(KVLayout layout, int64_t n_blocks, bool shareable = false, int32_t n_state_slots = 0);
  // The name of a shareable cache's memory objects (what a consumer checks).
  static constexpr const char* kSharedName = "inferd-kv";

  int64_t n_blocks() const { return n_blocks_; }
  int64_t block_size() const { return block_size_; }
  int64_t n_slots() const { return n_blocks_ * block_size_; }
  size_t bytes() const { return storage_spec().n_stores() * store_bytes_; }
  const KVLayout& layout() const { return layout_; }
  // The spec of a group, of a layer's group, and what every slab holds.
  const kv::KVCacheSpec& spec(int32_t group) const { return layout_.group_specs[group]; }
  const kv::KVCacheSpec& layer_spec(int64_t layer) const { return spec(group(layer)); }
  const kv::KVCacheSpec& storage_spec() const { return layout_.storage_spec(); }
  // Bytes one token takes across all layers (keys and values) where every
  // layer keeps it.
  static size_t bytes_per_token(const ModelConfig& c, DType dtype = kv::kDefaultKVCacheDType,
                                bool skip_sliding_window = false) {
    return KVLayout::plan(c, 1, dtype, skip_sliding_window).bytes_per_token();
  }
  // Bytes of one block (keys and values of its groups' layers).
  static size_t block_bytes(const ModelConfig& c, int64_t block_size, DType dtype = kv::kDefaultKVCacheDType,
                            bool skip_sliding_window = false) {
    return KVLayout::plan(c, static_cast<int32_t>(block_size), dtype, skip_sliding_window).block_bytes();
  }

  // A layer's keys (values) in block 0: head h of slot s of block b is at
  // b * block_stride() + layer_spec(layer).head_offset_in_segment(h, s) from
  // here (head_offset).
  std::byte* k(int64_t layer) { return reinterpret_cast<std::byte*>(k_) + layer_offset(layer); }
  std::byte* v(int64_t layer) {  // null for a latent cache (keys only)
    return v_ ? reinterpret_cast<std::byte*>(v_) + layer_offset(layer) : nullptr;
  }
  // Bytes between consecutive blocks in a store.
  size_t block_stride() const { return layout_.block_store_bytes; }
  // Where head `head` of slot `slot` (block * block_size + offset) of a layer
  // is, from k(layer) or v(layer).
  size_t head_offset(int64_t layer, int64_t slot, int64_t head) const {
    return static_cast<size_t>(slot / block_size_) * layout_.block_store_bytes +
           layer_spec(layer).head_offset_in_segment(head, slot % block_size_);
  }
  // Copies every layer's keys and values of block `src` into block `dst`
  // (copy on write of a block that forked sequences shared).
  void copy_block(int64_t src, int64_t dst);
  // A block's bytes whole: its layers' keys, then their values (offload tiers).
  size_t block_bytes() const { return layout_.block_bytes(); }
  void read_block(int64_t block, std::byte* dst) const;
  void write_block(int64_t block, const std::byte* src);
  // The keys' and the values' arrays whole: n_blocks blocks of
  // block_stride() bytes each (a KV transfer maps them and reads blocks
  // straight out of them).
  std::byte* keys_base() { return reinterpret_cast<std::byte*>(k_); }
  std::byte* values_base() { return reinterpret_cast<std::byte*>(v_); }  // null for a latent cache (keys only)
  // Their memfds when they are on shared memory, else -1.
  int keys_fd() const { return k_shared_ ? k_shared_.fd() : -1; }
  int values_fd() const { return v_shared_ ? v_shared_.fd() : -1; }
  // Why a shareable cache is not on shared memory (empty when it is, or was not asked to be).
  const std::string& shared_error() const { return shared_error_; }
  // A recurrent layer's state in a state slot (layout().layer_state >= 0):
  // its convolution window, then its recurrent matrices (f32, as the state
  // spec says). Slot -1 is one more slot, for a sequence that holds none (a
  // warm-up pass, a lone sequence): zeroed by whoever starts a sequence in it.
  int32_t n_state_slots() const { return n_state_slots_; }
  float* conv_state(int64_t layer, int32_t slot) { return state_at(layer, slot); }
  float* recurrent_state(int64_t layer, int32_t slot) {
    return state_at(layer, slot) + layout_.state_spec.conv_elements;
  }
  // Bytes of every state slot together.
  size_t state_bytes() const { return states_.size(); }

  // The KV group whose block table (and slots) a layer reads.
  int32_t group(int64_t layer) const { return layout_.layer_group[layer]; }

 private:
  // The keys' array, and the values' where the spec has values.
  std::vector<uint8_t*> stores() const;
  float* state_at(int64_t layer, int32_t slot) {
    const size_t s = slot < 0 ? static_cast<size_t>(n_state_slots_) : static_cast<size_t>(slot);
    const size_t index = s * static_cast<size_t>(layout_.n_state_layers) + static_cast<size_t>(layout_.layer_state[layer]);
    return reinterpret_cast<float*>(states_.data() + index * layout_.state_spec.state_bytes());
  }
  size_t layer_offset(int64_t layer) const {
    return static_cast<size_t>(layout_.layer_slab[layer]) * layer_spec(layer).segment_bytes();
  }

  KVLayout layout_;
  int64_t n_blocks_, block_size_;
  size_t store_bytes_;  // every block's keys (or values)
  // Left uninitialized: a slot is always written before it is read, and an
  // untouched page costs no memory, so a cache sized from a memory budget
  // neither takes seconds to zero nor commits pages it never uses. On huge
  // pages: a decode step writes each layer's new keys and values to fresh
  // memory, and on 4 KiB pages that was several page faults per token, taken
  // by whichever thread writes them while the others wait at the next barrier.
  AlignedBytes k_local_, v_local_;
  SharedBytes k_shared_, v_shared_;
  int32_t n_state_slots_ = 0;
  AlignedBytes states_;  // (n_state_slots + 1) slots of layout_.state_slot_bytes()
  uint8_t* k_ = nullptr;  // whichever of the two holds the keys
  uint8_t* v_ = nullptr;
  std::string shared_error_;
};

}  // namespace inferd
