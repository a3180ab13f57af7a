// What one layer of a KV group keeps per token and per block, and in which
// element type: the KV cache's format, in one place (vLLM v1's
// kv_cache_interface.py: FullAttentionSpec, SlidingWindowSpec).
//
// Every size of the KV cache comes from here: the block pool's block size in
// bytes (model/kv_cache.h: KVLayout, KVCache), the executor's slot strides,
// the offload tiers' fingerprint and the KV transfer's descriptor. Nothing
// else knows how many bytes an element takes, so another dtype (q8_0, q4_0,
// fp8) or another kind (latent attention, recurrent state) changes this file
// and whichever executor learns to read it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/result.h"

namespace inferd::kv {

// How a group's layers use their slots.
enum class KVCacheKind : uint8_t {
  kFullAttention = 0,  // every position is kept
  kSlidingWindow = 1,  // only the last `sliding_window` positions are read
  // Multi-head latent attention (DeepSeek's MLA): every position is kept, as
  // one "head" of keys only, the compressed latent then the RoPE key
  // (head_size = kv_lora_rank + qk_rope); the values are read from the keys'
  // latent, so a slot has no values (has_values()).
  kLatent = 2,
  // A recurrent layer (Gated DeltaNet; Mamba would fit): no per-token slots
  // at all but one fixed state per sequence, a short-convolution window and
  // the recurrent matrices, in f32 as llama.cpp keeps them. Such layers take
  // no blocks: their states live in state slots (state_slot_pool.h), one per
  // running request, sized by state_bytes().
  kRecurrentState = 3,
};
const char* kv_cache_kind_name(KVCacheKind kind);

// The KV element type when none is asked for (and the only one the CPU
// attention kernels read today).
inline constexpr DType kDefaultKVCacheDType = DType::F16;

// One layer's keys and values in a KV group. A block of a group holds, for
// each of its layers, block_size slots of keys and as many of values; a slot
// is num_kv_heads heads of head_size elements of dtype. Within a block the
// slots are laid out head by head (head_offset_in_segment): one head's keys
// of a block are one contiguous run, which is how decode attention reads
// them (a thread reads its key/value heads over every position; with the
// heads of a slot together it read a quarter of every 2 KiB slot of
// Qwen3.5-4B, and cold attention ran a third slower: docs/benchmarks.md).
struct KVCacheSpec {
  KVCacheKind kind = KVCacheKind::kFullAttention;
  DType dtype = kDefaultKVCacheDType;
  int32_t num_kv_heads = 0;
  int32_t head_size = 0;
  int32_t block_size = 0;      // tokens per block
  int64_t sliding_window = 0;  // kSlidingWindow: positions read; else 0
  // kRecurrentState, per layer and sequence: the convolution window's
  // elements ((taps - 1) x channels) and the recurrent state's (heads x
  // size x size); else 0.
  int64_t conv_elements = 0;
  int64_t recurrent_elements = 0;

  static KVCacheSpec full_attention(DType dtype, int32_t num_kv_heads, int32_t head_size, int32_t block_size) {
    return {KVCacheKind::kFullAttention, dtype, num_kv_heads, head_size, block_size, 0, 0, 0};
  }
  static KVCacheSpec sliding(DType dtype, int32_t num_kv_heads, int32_t head_size, int32_t block_size,
                             int64_t window) {
    return {KVCacheKind::kSlidingWindow, dtype, num_kv_heads, head_size, block_size, window, 0, 0};
  }
  // One latent head of `width` elements (the latent and the RoPE key) per
  // token. In any dtype but f16 the head is padded with zeros to whole
  // 32-element blocks (latent_head_size), which the quantized kernels read:
  // a 64-wide RoPE key (DeepSeek) needs none, the tiny test models' 16-wide
  // one half a block.
  static KVCacheSpec latent(DType dtype, int32_t width, int32_t block_size) {
    return {KVCacheKind::kLatent, dtype, 1, latent_head_size(dtype, width), block_size, 0, 0, 0};
  }
  static int32_t latent_head_size(DType dtype, int32_t width) {
    return dtype == DType::F16 ? width : (width + 31) / 32 * 32;
  }
  // A recurrent layer's state per sequence (f32: llama.cpp's
  // llama-memory-recurrent keeps both parts in f32, whatever the KV dtype).
  static KVCacheSpec recurrent_state(int64_t conv_elements, int64_t recurrent_elements) {
    return {KVCacheKind::kRecurrentState, DType::F32, 0, 0, 0, 0, conv_elements, recurrent_elements};
  }
  // A layer attending within `window` positions (0: full attention).
  static KVCacheSpec for_window(DType dtype, int32_t num_kv_heads, int32_t head_size, int32_t block_size,
                                int64_t window) {
    return window > 0 ? sliding(dtype, num_kv_heads, head_size, block_size, window)
                      : full_attention(dtype, num_kv_heads, head_size, block_size);
  }

  // Elements of one token's keys (or values) in one layer.
  int64_t slot_elements() const { return int64_t{num_kv_heads} * head_size; }
  // Bytes from the start of a layer's segment of a block (segment_bytes) to
  // head `head` of the slot `offset` places into the block: the heads' runs
  // of block_size slots one after another.
  size_t head_offset_in_segment(int64_t head, int64_t offset) const {
    return static_cast<size_t>(head * block_size + offset) * head_bytes();
  }
  // Bytes of one head's keys (or values) of one token.
  size_t head_bytes() const { return row_bytes(dtype, head_size); }
  // Whether a slot has values beside its keys (all kinds but latent attention).
  bool has_values() const { return kind != KVCacheKind::kLatent && kind != KVCacheKind::kRecurrentState; }
  // Whether the layer keeps anything per token (all kinds but recurrent state,
  // whose slot and page sizes are 0: it takes no blocks).
  bool per_token() const { return kind != KVCacheKind::kRecurrentState; }
  // kRecurrentState: bytes of one sequence's state in one layer, conv window
  // first, then the recurrent matrices; 0 for the other kinds.
  size_t conv_state_bytes() const { return row_bytes(dtype, conv_elements); }
  size_t recurrent_state_bytes() const { return row_bytes(dtype, recurrent_elements); }
  size_t state_bytes() const { return conv_state_bytes() + recurrent_state_bytes(); }
  // The stores a layer's slots take: keys, and values where it has them.
  int32_t n_stores() const { return has_values() ? 2 : 1; }
  // Bytes of one token's keys (or values) in one layer (all its heads).
  size_t slot_bytes() const { return static_cast<size_t>(num_kv_heads) * head_bytes(); }
  // Quantized keys and values are stored rotated by a Walsh-Hadamard matrix
  // (kernels/cpu/hadamard.h) in chunks of these many elements, as
  // llama.cpp's cache does when the head is whole multiples of 64: keys (and
  // the queries that read them) by the largest power of two from 64 up that
  // divides the head, values by 64 (rotated back after attention). 0: not
  // rotated (f16, bf16, or a head that is not a multiple of 64; fp8_e4m3 as
  // measured: docs/design.md; a latent cache, whose values are its keys'
  // first kv_lora_rank elements, as llama.cpp's K-only MLA cache is not).
  int64_t key_rotation() const;
  int64_t value_rotation() const;
  // Bytes of one layer's keys (or values) of one block: the contiguous run a
  // block is in each slab (what a KV transfer reads per layer, per side).
  size_t segment_bytes() const { return static_cast<size_t>(block_size) * slot_bytes(); }
  // Bytes one token takes in one layer, keys and values (a latent: its keys alone).
  size_t bytes_per_token() const { return n_stores() * slot_bytes(); }
  // Bytes of one layer's block, keys and values (vLLM's page_size_bytes).
  size_t page_bytes() const { return n_stores() * segment_bytes(); }

  // Why this spec cannot describe a cache (unknown dtype, a head that is not
  // whole quantization blocks, a window on a full-attention spec, ...); ok
  // when it can.
  Status validate() const;
  // "sliding window 512, F16, 1 KV heads x 256, 16 tokens a block".
  std::string describe() const;
  // The format of a block's bytes as one number, for fingerprints: each dtype
  // and kind gets a number of its own. 1 was f16 attention with a block's
  // slots one after another (the format before specs); attention's numbers
  // changed when blocks were laid out head by head, so stores written before
  // are refused, not misread.
  int64_t storage_format() const;

  bool operator==(const KVCacheSpec&) const = default;
};

// The first spec that differs between two groups' lists, named with both
// sides ("KV group 1 differs (here ..., peer ...)"); nullopt when equal.
std::optional<std::string> spec_mismatch(const std::vector<KVCacheSpec>& mine,
                                         const std::vector<KVCacheSpec>& theirs);

}  // namespace inferd::kv
