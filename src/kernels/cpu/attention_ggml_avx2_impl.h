// Attention in the order of GGML's AVX2 build (GgmlFlavour::kAvx2), portable:
// compiled in attention.cpp for any x86-64 CPU (std::fma a library call) and
// in attention_avx2.cpp with FMA instructions; both give the same bits, and
// so does the AVX2 kernel there (attend_heads_ggml_avx2).
//
// Where that build differs from the AVX-512 one (attention_portable_impl.h):
// - q.k for a one-token step (ggml_vec_dot_f16): four accumulators of 8
//   lanes over 32-element steps, folded (0+2)+(1+3), then the lanes summed as
//   GGML_F32x8_REDUCE ends: halves, then two horizontal adds (reduce8_hadd);
//   elements past the last whole step added in double;
// - q.k for two tokens or more (tinyBLAS, 8 lanes): one accumulator, summed
//   as its hsum does: halves, then movehl, then movehdup (reduce8_movehl);
// - the softmax: e^x by expf_poly_avx2 and the double sum taken over
//   8-position chunks, each chunk summed as reduce8_movehl;
// - the weighted values: per output one dot product over the positions, so
//   32 position sets for a one-token step (set p % 32, folded and reduced as
//   ggml_vec_dot_f16) and 8 for several tokens (set p % 8, tinyBLAS's hsum).
#pragma once
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/expf_poly.h"
#include "kernels/cpu/quants.h"

namespace inferd::kernels::detail {

// Internal linkage: this header is compiled with different instruction sets in
// different files, and one shared out-of-line copy could carry the wrong ones.
namespace {
namespace ggml_avx2 {

inline int64_t slot_of(const PagedKV& kv, int64_t p) {
  return int64_t{kv.block_table[p / kv.block_size]} * kv.block_size + p % kv.block_size;
}

inline float round_f16(float x) { return f16_to_f32(f32_to_f16(x)); }

// The end of GGML_F32x8_REDUCE: low half plus high half, then two hadds.
inline float reduce8_hadd(const float* y) {
  float t[4];
  for (int i = 0; i < 4; ++i) t[i] = y[i] + y[i + 4];
  return (t[0] + t[1]) + (t[2] + t[3]);
}

// tinyBLAS's hsum(__m256), also the softmax's chunk sum: low half plus high
// half, then movehl (lanes 0+2, 1+3), then movehdup.
inline float reduce8_movehl(const float* a) {
  float t[4];
  for (int i = 0; i < 4; ++i) t[i] = a[i] + a[i + 4];
  return (t[0] + t[2]) + (t[1] + t[3]);
}

// q.k as ggml_vec_dot_f16 on AVX2.
inline float dot_decode(const float* q, const uint16_t* k, int64_t D) {
  const int64_t np = D & ~int64_t{31};
  float sum[4][8] = {};
  for (int64_t i = 0; i < np; i += 32)
    for (int j = 0; j < 4; ++j)
      for (int l = 0; l < 8; ++l) sum[j][l] = std::fma(f16_to_f32(k[i + 8 * j + l]), q[i + 8 * j + l], sum[j][l]);
  float y[8];
  for (int l = 0; l < 8; ++l) y[l] = (sum[0][l] + sum[2][l]) + (sum[1][l] + sum[3][l]);
  double s = reduce8_hadd(y);
  for (int64_t i = np; i < D; ++i) s += static_cast<double>(f16_to_f32(k[i]) * q[i]);
  return static_cast<float>(s);
}

// q.k as tinyBLAS<8> (D % 8 == 0).
inline float dot_prefill(const float* q, const uint16_t* k, int64_t D) {
  float c[8] = {};
  for (int64_t i = 0; i < D; i += 8)
    for (int l = 0; l < 8; ++l) c[l] = std::fma(f16_to_f32(k[i + l]), q[i + l], c[l]);
  return reduce8_movehl(c);
}

// Scores w[0, n) (n a multiple of 8, positions outside the range -inf) into
// softmax weights, as ggml_soft_max_f32 on AVX2 (with `max` their maximum).
inline void softmax(float* w, int64_t n, float max) {
  double sum = 0;
  for (int64_t i = 0; i < n; i += 8) {
    for (int l = 0; l < 8; ++l) w[i + l] = expf_poly_avx2(w[i + l] - max);
    sum += static_cast<double>(reduce8_movehl(w + i));
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) w[i] *= inv;
}

// The same, rounded to f16 as the weights enter the product with the values.
inline void softmax_to_f16(float* w, int64_t n, float max) {
  softmax(w, n, max);
  for (int64_t i = 0; i < n; ++i) w[i] = round_f16(w[i]);
}

// Which of GGML's kernels computes each product (see above): tinyBLAS needs
// whole 8-lane vectors along the reduction and rows in fours.
inline bool prefill_scores(AttentionPass pass, int64_t D) { return pass == AttentionPass::kPrefill && D % 8 == 0; }
inline bool prefill_values(AttentionPass pass, int64_t D) { return pass == AttentionPass::kPrefill && D % 4 == 0; }

inline void attend_one_head_portable(const float* q_in, const PagedKV& kv, int64_t head_offset, int64_t D,
                                     int64_t pos_begin, int64_t pos_end, float scale, AttentionPass pass,
                                     float* out) {
  thread_local std::vector<float> q, weights, acc;
  q.resize(static_cast<size_t>(D));
  for (int64_t d = 0; d < D; ++d) q[d] = round_f16(q_in[d]);
  const bool by_tinyblas = prefill_scores(pass, D);

  // Scores over whole 8-position chunks (GGML's chunks start at position 0).
  const int64_t c0 = pos_begin - pos_begin % 8;
  const int64_t n = (pos_end - c0 + 7) / 8 * 8;
  weights.assign(static_cast<size_t>(n), -std::numeric_limits<float>::infinity());
  float max = -std::numeric_limits<float>::infinity();
  for (int64_t p = pos_begin; p < pos_end; ++p) {
    const uint16_t* k = kv.k + slot_of(kv, p) * kv.slot_stride + head_offset;
    const float s = (by_tinyblas ? dot_prefill(q.data(), k, D) : dot_decode(q.data(), k, D)) * scale;
    weights[p - c0] = s;
    max = std::max(max, s);
  }
  softmax_to_f16(weights.data(), n, max);

  // Weighted values: one partial sum per position set, folded as GGML does.
  const bool prefill = prefill_values(pass, D);
  const int64_t n_sets = prefill ? 8 : 32;
  acc.assign(static_cast<size_t>(n_sets * D), 0.0f);
  for (int64_t p = pos_begin; p < pos_end; ++p) {
    const uint16_t* v = kv.v + slot_of(kv, p) * kv.slot_stride + head_offset;
    float* a = &acc[(p % n_sets) * D];
    const float w = weights[p - c0];
    for (int64_t d = 0; d < D; ++d) a[d] = std::fma(f16_to_f32(v[d]), w, a[d]);
  }
  for (int64_t d = 0; d < D; ++d) {
    float y[8];
    if (prefill) {
      for (int l = 0; l < 8; ++l) y[l] = acc[l * D + d];
      out[d] = reduce8_movehl(y);
    } else {
      for (int l = 0; l < 8; ++l)
        y[l] = (acc[l * D + d] + acc[(16 + l) * D + d]) + (acc[(8 + l) * D + d] + acc[(24 + l) * D + d]);
      out[d] = reduce8_hadd(y);
    }
  }
}

}  // namespace ggml_avx2
}  // namespace

}  // namespace inferd::kernels::detail
