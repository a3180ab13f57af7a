// The fast numerics tier's attention (kernels::Numerics::kFast): a tile of a
// sequence's prompt tokens over a paged f16 KV cache, as register-blocked
// matrix products, and a decode token's range in parts the threads share
// (below; docs/design.md, "Fast prefill attention").
//
// The exact tier's tiled kernels (attention.h) keep GGML's arithmetic: the
// query and the softmax weights rounded to f16, an exact softmax over the
// whole range, each dot product in GGML's lane order. Here nothing is owed to
// GGML, so the arithmetic is chosen for matrix products: a prompt tile's two
// products run on 16-bit integers (AVX2's madd does twice the multiply-adds
// of an f32 fma a cycle, and integer sums are exact in any order), the
// softmax in f32, online over chunks of 32 positions (a running maximum, the
// earlier sums and outputs rescaled when it grows).
//
// Integer codes (every level the same bits): code(x, id, lo, hi) =
// clamp(rne(x * id), lo, hi), rne as cvtps2dq (round to nearest even; NaN and
// out of range give INT32_MIN, then clamped); for a vector with largest |x|
// amax and codes up to cmax: step = amax / cmax, id = step != 0 ? 1 / step : 0.
//   query row (token t, head h): codes qc[d] up to KQ = fast_attention_key_max(D)
//     (D KQ^2 < 2^31: a score's integer sum cannot overflow), qf = step * scale
//   key j: codes kc_j[d] up to KQ, its step ks_j; value j: codes vc_j[d] up to
//     kFastAttentionValueMax, its step vs_j (the keys and values of a chunk
//     coded once for the tile; a position no row of the tile reads is zeros)
//
// Per query row (positions [b, e) of the tile's ranges), in this order, each
// step one IEEE operation (fused where written fma):
//   m = sinks ? sinks[h] : -inf;  lanes[8] = {sinks ? 1 : 0, 0, ...};  o[D] = 0
//   for each chunk c (positions [32c, 32c + 32)) that meets [b, e), in order:
//     s_j = float(sum_d qc[d] kc_j[d]) * (ks_j * qf) for the chunk's j in [b, e)
//     m' = max(m, max_j s_j);  alpha = m == -inf ? 0 : expf_poly(m - m')
//     p_j = j in [b, e) ? expf_poly(max(s_j - m', kFastAttentionExpFloor)) : 0
//     lanes[l] = fma(lanes[l], alpha, (p_l + p_{l+8}) + (p_{l+16} + p_{l+24}))
//     w_j = j in [b, e) ? p_j * vs_j : 0; the w_j coded up to kFastAttentionWeightMax
//       (pc_j; step ps over the chunk's 32)
//     o[d] = fma(float(sum_j pc_j vc_j[d]), ps, o[d] * alpha)   (32 * 4095 * 16383 < 2^31)
//     m = m'
//   sum = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]))
//   out[d] = o[d] * (1 / sum)
// A decode step's parts (below) read their keys and values once, from memory,
// where coding them would cost more than the products save: there the score
// is the f32 chain s_j = fma-chain_d(q[d] * k_j[d]) * scale and the output
// o[d] = o[d] * alpha, then o[d] = fma(p_j, v_j[d], o[d]) for the chunk's j
// in [b, e), in order, with the same softmax steps.
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
// Tokens an executor gives attend_heads_tile_fast at a time: each chunk's
// keys and values are coded once for this many tokens' query heads (64: the
// coding's share falls to where the products bound the kernel; 16 kept it
// about as fast as f32 products, docs/benchmarks.md).
constexpr int64_t kFastAttentionTileTokens = 64;
// The largest value and softmax weight codes: a chunk's 32 products of the two
// sum below 2^31 in int32.
constexpr int32_t kFastAttentionValueMax = 4095;
constexpr int32_t kFastAttentionWeightMax = 16383;
static_assert(int64_t{32} * kFastAttentionValueMax * kFastAttentionWeightMax < (int64_t{1} << 31));
// The largest query and key code for a head of D elements: D of their
// products sum below 2^31 (4095 at D = 128, 5792 at 64, 2896 at 256).
constexpr int32_t fast_attention_key_max(int64_t D) {
  int64_t lo = 1, hi = 32767;  // the largest m with D m^2 < 2^31
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (D * mid * mid < (int64_t{1} << 31)) lo = mid; else hi = mid - 1;
  }
  return static_cast<int32_t>(lo);
}
static_assert(fast_attention_key_max(128) == 4095 && fast_attention_key_max(64) == 5792);

// Whether attend_heads_tile_fast reads this cache and head size: f16 keys and
// values, heads of whole 8-element vectors.
constexpr bool fast_attention_reads(DType dtype, int64_t D) { return dtype == DType::F16 && D % 8 == 0; }

// The arithmetic above for each token of the tile (n_heads query heads over
// the key/value head at head_offset; sinks null or n_heads logits).
void attend_heads_tile_fast(const AttentionTile& tile, int64_t n_heads, const PagedKV& kv, int64_t head_offset,
                            int64_t D, float scale, const float* sinks);

// Decode split over the context (flash-decoding). A one-token step's range is
// cut at multiples of kFastDecodeSplit absolute positions into parts that
// threads take apart; each part's softmax state (the steps above, from
// m = -inf and zero lanes, up to but not including the final sum and division)
// is kept, and the parts are joined in order:
//   M = max(sinks ? sinks[h] : -inf, m_0, ..., m_last)
//   sum = 0; o[D] = 0
//   for each part p, in order: w = m_p == M ? 1 : m_p == -inf ? 0 : expf_poly(m_p - M)
//     sum = fma(lane_sum_p, w, sum)  (lane_sum_p: its eight lanes summed as above)
//     o[d] = fma(w, o_p[d], o[d])
//   sum = sinks ? sum + expf_poly(sinks[h] - M) : sum
//   out[d] = o[d] * (1 / sum)
// The parts depend on the range alone, so a token's result does not depend on
// the batch or on the threads. Each part runs the f32 products above (a
// decode step's), so its states are not a prompt tile's.
constexpr int64_t kFastDecodeSplit = 2 * kFastAttentionChunk;
static_assert(kFastDecodeSplit % kFastAttentionChunk == 0, "parts of whole chunks");

// How many parts the range [pos_begin, pos_end) has: k from pos_begin / S to
// (pos_end - 1) / S, part k being [max(pos_begin, S k), min(pos_end, S k + S)), S = kFastDecodeSplit.
constexpr int64_t fast_decode_parts(int64_t pos_begin, int64_t pos_end) {
  return pos_end <= pos_begin ? 0 : (pos_end - 1) / kFastDecodeSplit - pos_begin / kFastDecodeSplit + 1;
}

// Softmax states of rows: row r's maximum at m[r], its eight lane sums at
// lanes[8 r] and its unnormalized output at o[D r].
struct FastAttentionState {
  float* m = nullptr;
  float* lanes = nullptr;
  float* o = nullptr;
};

// One query's n_heads heads (q: their D-vectors one after another) over the
// positions [pos_begin, pos_end): the states of its parts, in order, part k's
// heads at rows k n_heads .. k n_heads + n_heads - 1 of `parts`. A thread
// gives the sub-range of the parts it takes; the parts are the whole range's.
void attend_heads_fast_parts(const float* q, int64_t n_heads, const PagedKV& kv, int64_t head_offset, int64_t D,
                             int64_t pos_begin, int64_t pos_end, float scale, const FastAttentionState& parts);

// The n_heads heads' results from their n_parts parts' states (laid out as
// attend_heads_fast_parts writes them), joined as above into out.
void join_fast_attention_states(const FastAttentionState& parts, int64_t n_parts, int64_t n_heads, int64_t D,
                                const float* sinks, float* out);

namespace detail {
// The reference, row by row; and the AVX2 + FMA + F16C kernel (the same bits).
// With `parts` (a tile of one token, no sinks): its parts' states instead
// of its result, as attend_heads_fast_parts writes them.
void attend_heads_tile_fast_scalar(const AttentionTile& tile, int64_t n_heads, const PagedKV& kv,
                                   int64_t head_offset, int64_t D, float scale, const float* sinks,
                                   const FastAttentionState* parts);
void attend_heads_tile_fast_avx2(const AttentionTile& tile, int64_t n_heads, const PagedKV& kv, int64_t head_offset,
                                 int64_t D, float scale, const float* sinks, const FastAttentionState* parts);
// A prompt tile's integer products over one chunk (kFastAttentionChunk keys),
// for n query rows at once (n <= the level's rows): the scores
//   s[r][j] = float(sum_d qc[r][d] kc_j[d]) * (ks[j] * qf[r])
// and the weighted values
//   o[r][d] = fma(float(sum_j pc[r][j] vc_j[d]), ps[r], o[r][d] * alpha[r])
// with the codes laid out as attention_fast_avx2.cpp's load_chunk_codes makes
// them. Integer sums, then element-wise float steps: every vector width
// gives the same bits, so a level may swap in wider products.
// The online softmax over one chunk between them, row by row (the steps
// above, from the scores in s_rows to the weights' codes in pc), is
// element-wise too but for a row's maximum and lane sums, which a level keeps
// in the 8-lane order: FastSoftmaxChunk holds its operands.
struct FastSoftmaxChunk {
  const int64_t* active = nullptr;  // the tile's tokens whose range meets the chunk, n_active of them
  int64_t n_active = 0, n_heads = 0, c0 = 0;
  const int64_t *pos_begin = nullptr, *pos_end = nullptr;  // the tile's ranges, by token
  // By active row a (token active[a / n_heads], head a % n_heads): its scores
  // (weights out), rescale factor, weight codes (C a row) and their step.
  float* const* s_rows = nullptr;
  float* alpha = nullptr;
  int16_t* pc = nullptr;
  float* weight_step = nullptr;
  // By tile row r (token i, head h: i n_heads + h): maximum, and 8 lane sums.
  float* m = nullptr;
  float* lanes = nullptr;
  const float* value_steps = nullptr;  // the chunk's C value steps
};
struct FastAttentionIntProducts {
  void (*scores)(const int16_t* const* qc_rows, const float* qf, int64_t n, const int16_t* kc, const float* ks,
                 int64_t D, float* const* s);
  int score_rows;
  void (*values)(const int16_t* const* pc_rows, const float* ps, const float* alpha, int64_t n, const int16_t* vc,
                 int64_t D, float* const* o);
  int value_rows;
  void (*softmax)(const FastSoftmaxChunk& chunk);
};
// The AVX2 kernel with a level's integer products (AVX-512's: VNNI's vpdpwssd on 16 lanes).
void attend_heads_tile_fast_with(const FastAttentionIntProducts& products, const AttentionTile& tile,
                                 int64_t n_heads, const PagedKV& kv, int64_t head_offset, int64_t D, float scale,
                                 const float* sinks, const FastAttentionState* parts);
void attend_heads_tile_fast_avx512(const AttentionTile& tile, int64_t n_heads, const PagedKV& kv, int64_t head_offset,
                                   int64_t D, float scale, const float* sinks, const FastAttentionState* parts);
void join_fast_attention_states_scalar(const FastAttentionState& parts, int64_t n_parts, int64_t n_heads, int64_t D,
                                       const float* sinks, float* out);
void join_fast_attention_states_avx2(const FastAttentionState& parts, int64_t n_parts, int64_t n_heads, int64_t D,
                                     const float* sinks, float* out);
}  // namespace detail

}  // namespace inferd::kernels
