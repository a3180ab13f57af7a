// Attention over keys and values held in a paged KV cache of Q8_0 or Q4_0
// (GGML's 32-element blocks: an f16 scale d and 32 quants; a head of D
// elements is D/32 blocks), or of BF16 or fp8 e4m3 (fp8.h) elements, read as
// 32-element blocks whose scale is 1; read in place: a block is widened to floats in
// registers and its scale applied once per block, so no dequantized copy of
// the context is ever made.
//
// The arithmetic, the same for AttentionPass::kDecode and kPrefill (the pass
// is ignored) and for any number of grouped heads:
//   s_p   = scale * sum_b d_kb * (q_b . qk_b)      per position, blocks in order
//           (for Q8_0 and Q4_0 keys q is the query quantized to Q8_0 blocks,
//           as llama.cpp dots these caches: q_b = d_qb * (32 integers); the
//           AVX-512 level dots the integers exactly, d_kb * d_qb after)
//   m     = max(max_p s_p, sink)
//   w_p   = e^(s_p - m) (expf_poly),  S = sum_p w_p (+ e^(sink - m))
//   out   = (1 / S) * sum_p sum_b (w_p * d_vb) qv_b  positions in ascending order
//           (AVX-512: each chunk of 16 positions from pos_begin summed in
//           registers, then added to the total)
// A token's result therefore depends only on its query, its positions'
// keys and values and pos_begin, never on the chunk or batch it came in
// (docs/design.md, "Quantized KV"). Each SIMD level has its own lane order
// (no GGML kernel to reproduce here), so levels agree within a tolerance,
// not to the bit; within a level the bits are fixed.
//
// Internal to kernels/cpu: callers go through attend_heads (attention.h),
// which dispatches on PagedKV::dtype.
#pragma once
#include <cstdint>

#include "kernels/cpu/attention.h"

namespace inferd::kernels {

namespace detail {
// Each reads kv.dtype (Q8_0, Q4_0, BF16 or F8_E4M3) and otherwise takes attend_heads'
// arguments; `pass` is ignored (one order for both).
void attend_heads_quant_scalar(const float* q, int64_t n_heads, const PagedKV& kv, int64_t head_offset, int64_t D,
                               int64_t pos_begin, int64_t pos_end, float scale, AttentionPass pass, float* out,
                               const float* sinks);
void attend_heads_quant_avx2(const float* q, int64_t n_heads, const PagedKV& kv, int64_t head_offset, int64_t D,
                             int64_t pos_begin, int64_t pos_end, float scale, AttentionPass pass, float* out,
                             const float* sinks);  // AVX2 + FMA + F16C
void attend_heads_quant_avx512(const float* q, int64_t n_heads, const PagedKV& kv, int64_t head_offset, int64_t D,
                               int64_t pos_begin, int64_t pos_end, float scale, AttentionPass pass, float* out,
                               const float* sinks);

// Latent attention (attend_latent_heads) over a latent cache of Q8_0, Q4_0,
// BF16 or F8_E4M3: the same arithmetic with keys of Dk elements and values
// that are the first Dv of them (Dk and Dv multiples of 32), no sinks; `pass`
// is ignored. Each level's bits are its attend_heads_quant_*'s for Dk == Dv.
void attend_latent_heads_quant_scalar(const float* q, int64_t n_heads, const PagedKV& kv, int64_t Dk, int64_t Dv,
                                      int64_t pos_begin, int64_t pos_end, float scale, AttentionPass pass,
                                      float* out);
void attend_latent_heads_quant_avx2(const float* q, int64_t n_heads, const PagedKV& kv, int64_t Dk, int64_t Dv,
                                    int64_t pos_begin, int64_t pos_end, float scale, AttentionPass pass, float* out);
void attend_latent_heads_quant_avx512(const float* q, int64_t n_heads, const PagedKV& kv, int64_t Dk, int64_t Dv,
                                      int64_t pos_begin, int64_t pos_end, float scale, AttentionPass pass,
                                      float* out);
}  // namespace detail

}  // namespace inferd::kernels
