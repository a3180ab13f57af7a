// The fast numerics tier's prefill attention (kernels::Numerics::kFast): a
// tile of a sequence's prompt tokens over a paged f16 KV cache, as register-
// blocked matrix products (docs/design.md, "Fast prefill attention").
//
// The exact tier's tiled kernels (attention.h) keep GGML's arithmetic: the
// query and the softmax weights rounded to f16, an exact softmax over the
// whole range, each dot product in GGML's lane order. Here nothing is owed to
// GGML, so the arithmetic is chosen for matrix products: the keys of a chunk
// of kFastAttentionChunk positions are turned to f32 and transposed once for
// the tile, every (query row, key) score is one fused multiply-add chain over
// the head's elements, and the softmax is online over the chunks (a running
// maximum, the earlier sums and outputs rescaled when it grows).
//
// Per query row (token t, head h; positions [b, e) of the tile's ranges), in
// this order, each step one IEEE operation (fused where written fma):
//   m = sinks ? sinks[h] : -inf;  lanes[8] = {sinks ? 1 : 0, 0, ...};  o[D] = 0
//   for each chunk c (positions [32c, 32c + 32)) that meets [b, e), in order:
//     s_j = fma-chain_d(q[d] * k_j[d]) * scale for the chunk's j in [b, e)
//     m' = max(m, max_j s_j);  alpha = m == -inf ? 0 : expf_poly(m - m')
//     p_j = j in [b, e) ? expf_poly(max(s_j - m', kFastAttentionExpFloor)) : 0
//     lanes[l] = fma(lanes[l], alpha, (p_l + p_{l+8}) + (p_{l+16} + p_{l+24}))
//     o[d] = o[d] * alpha, then o[d] = fma(p_j, v_j[d], o[d]) for the chunk's j in [b, e), in order
//     m = m'
//   sum = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]))
//   out[d] = o[d] * (1 / sum)
// Chunks are aligned to absolute positions, so a token's result depends on its
// own query and range only, not on the tile it came in: batch invariant
// (a prompt's tokens give the same bits whether it is chunked or not, alone or
// beside others). The scalar and AVX2 kernels give the same bits.
#pragma once
#include <cstdint>

#include "kernels/cpu/attention.h"

namespace inferd::kernels {

// Positions a chunk of keys and values holds (and the softmax steps by).
constexpr int64_t kFastAttentionChunk = 32;
// The least exponent a softmax weight is taken at: e^-87 (1.6e-38, a normal
// float) adds nothing next to the chunk's largest weight, 1, and keeps the
// vector e^x on its quick path (no subnormal results).
constexpr float kFastAttentionExpFloor = -87.0f;
// Tokens an executor gives attend_heads_tile_fast at a time: each chunk of
// keys is turned to f32 once for this many tokens' query heads.
constexpr int64_t kFastAttentionTileTokens = 16;

// Whether attend_heads_tile_fast reads this cache and head size: f16 keys and
// values, heads of whole 8-element vectors.
constexpr bool fast_attention_reads(DType dtype, int64_t D) { return dtype == DType::F16 && D % 8 == 0; }

// The arithmetic above for each token of the tile (n_heads query heads over
// the key/value head at head_offset; sinks null or n_heads logits).
void attend_heads_tile_fast(const AttentionTile& tile, int64_t n_heads, const PagedKV& kv, int64_t head_offset,
                            int64_t D, float scale, const float* sinks);

namespace detail {
// The reference, row by row; and the AVX2 + FMA + F16C kernel (the same bits).
void attend_heads_tile_fast_scalar(const AttentionTile& tile, int64_t n_heads, const PagedKV& kv,
                                   int64_t head_offset, int64_t D, float scale, const float* sinks);
void attend_heads_tile_fast_avx2(const AttentionTile& tile, int64_t n_heads, const PagedKV& kv, int64_t head_offset,
                                 int64_t D, float scale, const float* sinks);
}  // namespace detail

}  // namespace inferd::kernels
