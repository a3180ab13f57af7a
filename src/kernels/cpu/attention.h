// Attention of one query head over keys and values held in a paged f16 KV
// cache: the block table maps a position to its cache slot, so a sequence's
// keys are never copied into a contiguous buffer.
//
// The arithmetic is GGML's (llama.cpp without flash attention), to the bit:
// the query and the softmax weights are rounded to f16 like the keys and
// values, the softmax is exact (not online) with e^x by expf_poly and its sum
// in double over 16-position chunks, and the dot products run in the order of
// the GGML kernel llama.cpp picks for the pass (AttentionPass). Why bit for
// bit: see docs/design.md, "Logit tolerance".
//
// GGML's AVX-512 and AVX2 builds sum in different orders (16 lanes or 8) and
// compute e^x differently; `flavour` picks which build to reproduce, on any
// CPU (attention_ggml_avx2_impl.h lists the AVX2 build's orders).
#pragma once
#include <cstdint>

#include "core/dtype.h"
#include "kernels/cpu/flavour.h"

namespace inferd::kernels {

// Whether these kernels read keys and values of this element type: F16 (the
// GGML-exact kernels below) and Q8_0, Q4_0, BF16, F8_E4M3 (attention_quant.h,
// read in place; heads of whole 32-element blocks).
// An executor checks its cache's spec against this before it runs
// (Executor::supports_kv_cache).
constexpr bool attention_reads_kv(DType dtype) {
  return dtype == DType::F16 || dtype == DType::Q8_0 || dtype == DType::Q4_0 || dtype == DType::BF16 ||
         dtype == DType::F8_E4M3;
}

// What the kernels read: keys and values of `dtype` (one attention_reads_kv
// accepts; the kernels do not check it again per call): blocks of
// block_size slots of slot_stride elements, block_stride bytes apart. A head
// at `head_offset` elements into the block: the KV cache lays a block out
// head by head (kv::KVCacheSpec), so there slot_stride is one head and
// head_offset a multiple of block_size heads; slot by slot (several heads a
// slot, the head at its offset within a slot) reads as well.
// The bytes are untyped so one view serves every dtype; offsets within a block
// are counted in elements (a quantized dtype's slot stride and head offset are
// whole blocks of it) and turned into bytes by the kernel that knows the dtype.
struct PagedKV {
  const void* k = nullptr;      // block 0's first slot
  const void* v = nullptr;
  int64_t slot_stride = 0;      // elements between consecutive slots
  int64_t block_size = 0;
  const int32_t* block_table = nullptr;
  DType dtype = DType::F16;
  // Bytes between consecutive blocks: a cache's block holds several layers
  // (model/kv_cache.h), so more than this layer's block_size slots; 0: just
  // those slots, packed.
  int64_t block_stride = 0;

  int64_t block_bytes() const {
    return block_stride > 0 ? block_stride : block_size * static_cast<int64_t>(row_bytes(dtype, slot_stride));
  }
  // Elements (2-byte: F16) from k or v to position p's slot.
  int64_t f16_slot(int64_t p) const {
    return int64_t{block_table[p / block_size]} * (block_bytes() / 2) + p % block_size * slot_stride;
  }
  // f16_slot(p) for p in [pos_begin, pos_end) into slots[p - pos_begin],
  // stepping through the blocks: no division per position (prefill runs this
  // for every key of every token).
  void f16_slots(int64_t pos_begin, int64_t pos_end, int64_t* slots) const {
    const int64_t block_elements = block_bytes() / 2;
    for (int64_t p = pos_begin, block = p / block_size, offset = p % block_size; p < pos_end; ++p) {
      slots[p - pos_begin] = int64_t{block_table[block]} * block_elements + offset * slot_stride;
      if (++offset == block_size) offset = 0, ++block;
    }
  }

  const uint16_t* k_f16() const { return static_cast<const uint16_t*>(k); }
  const uint16_t* v_f16() const { return static_cast<const uint16_t*>(v); }
};

// llama.cpp computes attention with two different summation orders: a
// one-token step through ggml_vec_dot_f16 (four 16-lane accumulators; 8-lane
// on the AVX2 build), a step of two tokens or more through tinyBLAS (one
// 16-lane accumulator per output; 8-lane on the AVX2 build). A sequence that feeds one token in a step is a kDecode pass, one
// that feeds several a kPrefill pass, whatever else shares the step.
enum class AttentionPass { kDecode, kPrefill };

// F16 keys and values run the GGML-exact kernels (flavour and pass pick the
// order); Q8_0, Q4_0, BF16 and F8_E4M3 run attention_quant.h's, which have one order for
// every pass and ignore flavour (GGML has no such kernel to match).
//
// out[0..D) = sum_p softmax_p(scale * q . k_p) v_p for positions
// p in [pos_begin, pos_end), reading head `head_offset` (element offset within
// a slot). Lanes are assigned by absolute position, so the result does not
// depend on the batch.
// `sinks` (gpt-oss's attention sinks; null: none): per query head, a logit
// that joins the softmax's maximum and sum but has no value, as GGML's
// soft_max with sinks adds it (e^(sink - max) by libm's expf, after the
// positions' sum).
void attend_one_head(const float* q, const PagedKV& kv, int64_t head_offset, int64_t D, int64_t pos_begin,
                     int64_t pos_end, float scale, AttentionPass pass, float* out,
                     GgmlFlavour flavour = GgmlFlavour::kAvx512, const float* sinks = nullptr);

// The same for n_heads query heads that read one key/value head (grouped-
// query attention); q and out hold the heads' D-vectors one after another.
// Each head's result is attend_one_head's to the bit; the keys and values are
// read once for the group.
void attend_heads(const float* q, int64_t n_heads, const PagedKV& kv, int64_t head_offset, int64_t D,
                  int64_t pos_begin, int64_t pos_end, float scale, AttentionPass pass, float* out,
                  GgmlFlavour flavour = GgmlFlavour::kAvx512, const float* sinks = nullptr);

// A tile of query tokens of one sequence in a kPrefill pass: token i
// (i < n_tokens) has its query heads at q + i * q_stride, attends to positions
// [pos_begin[i], pos_end[i]) and writes its heads' results at out + i *
// out_stride. Consecutive tokens of a causal prefill have ranges that end one
// apart (pos + 1); a sliding window moves their beginnings too.
struct AttentionTile {
  const float* q = nullptr;
  int64_t q_stride = 0;
  float* out = nullptr;
  int64_t out_stride = 0;
  int64_t n_tokens = 0;
  const int64_t* pos_begin = nullptr;
  const int64_t* pos_end = nullptr;
};

// Tokens an executor gives attend_heads_tile at a time (more are taken in
// tiles of this many): the tiled kernels read each key and value once per
// this many tokens instead of once per token.
constexpr int64_t kAttentionTileTokens = 8;

// attend_heads (kPrefill) for each token of the tile: each token's result is
// attend_heads(tile.q + i * q_stride, n_heads, kv, head_offset, D,
// pos_begin[i], pos_end[i], scale, AttentionPass::kPrefill, ...)'s to the bit,
// at every level and flavour and for any tile (the arithmetic of a token does
// not depend on the others: docs/design.md, "Prefill attention in tiles").
// F16 caches at AVX-512 (its flavour) and at AVX2 (both), head sizes of the
// grouped kernels, go through tiled kernels, which read each chunk of keys and
// each block of values once for the tile; the other levels, head sizes and
// dtypes run the per-token kernel token by token.
void attend_heads_tile(const AttentionTile& tile, int64_t n_heads, const PagedKV& kv, int64_t head_offset, int64_t D,
                       float scale, GgmlFlavour flavour = GgmlFlavour::kAvx512, const float* sinks = nullptr);

// Multi-head latent attention in llama.cpp's absorbed form (DeepSeek V2/V3):
// n_heads query heads of Dk elements over one latent head per slot (kv.k ==
// kv.v, slot_stride >= Dk), whose first Dv elements are also the values
// (llama.cpp's K-only MLA cache reads V as a view of K). F16: each head's
// out[0, Dv) has attend_one_head's arithmetic (GGML's without flash
// attention, of `flavour`) with keys of Dk and values of Dv. Q8_0, Q4_0,
// BF16, F8_E4M3 (Dk and Dv whole 32-element blocks): attention_quant.h's
// arithmetic, read in place. q and out hold the heads one after another (Dk
// and Dv apart).
void attend_latent_heads(const float* q, int64_t n_heads, const PagedKV& kv, int64_t Dk, int64_t Dv,
                         int64_t pos_begin, int64_t pos_end, float scale, AttentionPass pass, float* out,
                         GgmlFlavour flavour = GgmlFlavour::kAvx512);

namespace detail {
// attend_latent_heads in `flavour`'s order, compiled for any x86-64 CPU and
// with FMA instructions (attention_avx2.cpp): the same bits.
template <GgmlFlavour flavour>
void attend_latent_heads_scalar(const float* q, int64_t n_heads, const PagedKV& kv, int64_t Dk, int64_t Dv,
                                int64_t pos_begin, int64_t pos_end, float scale, AttentionPass pass, float* out);
// The AVX-512 build's order with AVX-512 instructions (the same bits again).
void attend_latent_heads_avx512(const float* q, int64_t n_heads, const PagedKV& kv, int64_t Dk, int64_t Dv,
                                int64_t pos_begin, int64_t pos_end, float scale, AttentionPass pass, float* out);
template <GgmlFlavour flavour>
void attend_latent_heads_fma(const float* q, int64_t n_heads, const PagedKV& kv, int64_t Dk, int64_t Dv,
                             int64_t pos_begin, int64_t pos_end, float scale, AttentionPass pass, float* out);
void attend_one_head_scalar(const float* q, const PagedKV& kv, int64_t head_offset, int64_t D, int64_t pos_begin,
                            int64_t pos_end, float scale, AttentionPass pass, float* out, const float* sinks);
void attend_one_head_fma(const float* q, const PagedKV& kv, int64_t head_offset, int64_t D, int64_t pos_begin,
                         int64_t pos_end, float scale, AttentionPass pass, float* out, const float* sinks);  // AVX2 + FMA
void attend_one_head_avx512(const float* q, const PagedKV& kv, int64_t head_offset, int64_t D, int64_t pos_begin,
                            int64_t pos_end, float scale, AttentionPass pass, float* out, const float* sinks);
void attend_heads_avx512(const float* q, int64_t n_heads, const PagedKV& kv, int64_t head_offset, int64_t D,
                         int64_t pos_begin, int64_t pos_end, float scale, AttentionPass pass, float* out, const float* sinks);
// attend_heads_tile's AVX-512 kernel (F16, the AVX-512 flavour); head sizes
// without a grouped kernel go token by token through attend_heads_avx512.
void attend_heads_tile_avx512(const AttentionTile& tile, int64_t n_heads, const PagedKV& kv, int64_t head_offset,
                              int64_t D, float scale, const float* sinks);
// The AVX-512 kernel's bits with AVX2, FMA and F16C (each 16-lane vector as
// two 8-lane halves), query heads that share a key/value head together; and
// its softmax before the f16 rounding, for tests: w[0, n) in place, n a
// multiple of 16.
void attend_heads_avx2(const float* q, int64_t n_heads, const PagedKV& kv, int64_t head_offset, int64_t D,
                       int64_t pos_begin, int64_t pos_end, float scale, AttentionPass pass, float* out, const float* sinks);
void softmax_avx2(float* w, int64_t n);
// attend_heads_tile's kernel for GgmlFlavour::kAvx512 on AVX2: each token's
// bits attend_heads_avx2's (kPrefill); head sizes without a grouped kernel go
// token by token through it.
void attend_heads_tile_avx2(const AttentionTile& tile, int64_t n_heads, const PagedKV& kv, int64_t head_offset,
                            int64_t D, float scale, const float* sinks);

// GgmlFlavour::kAvx2: the portable kernel compiled without and with FMA
// instructions, and the AVX2 kernel (AVX2 + FMA + F16C) for query heads that
// share a key/value head. All three give the same bits.
void attend_one_head_ggml_avx2_scalar(const float* q, const PagedKV& kv, int64_t head_offset, int64_t D,
                                      int64_t pos_begin, int64_t pos_end, float scale, AttentionPass pass,
                                      float* out, const float* sinks);
void attend_one_head_ggml_avx2_fma(const float* q, const PagedKV& kv, int64_t head_offset, int64_t D,
                                   int64_t pos_begin, int64_t pos_end, float scale, AttentionPass pass, float* out, const float* sinks);
void attend_heads_ggml_avx2(const float* q, int64_t n_heads, const PagedKV& kv, int64_t head_offset, int64_t D,
                            int64_t pos_begin, int64_t pos_end, float scale, AttentionPass pass, float* out, const float* sinks);
// Their softmax before the f16 rounding (for tests: the rounding hides most
// last-bit differences of e^x): w[0, n) in place, n a multiple of 8.
void softmax_ggml_avx2_scalar(float* w, int64_t n);
void softmax_ggml_avx2(float* w, int64_t n);  // AVX2 + FMA
// attend_heads_tile's kernel for GgmlFlavour::kAvx2 (AVX2 + FMA + F16C): each
// token's bits attend_heads_ggml_avx2's (kPrefill); head sizes without a
// grouped kernel go token by token through it.
void attend_heads_tile_ggml_avx2(const AttentionTile& tile, int64_t n_heads, const PagedKV& kv, int64_t head_offset,
                                 int64_t D, float scale, const float* sinks);
}  // namespace detail

}  // namespace inferd::kernels
