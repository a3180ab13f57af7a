// The portable attention kernel, compiled twice: in attention.cpp for any
// x86-64 CPU (std::fma a library call) and in attention_avx2.cpp with FMA
// instructions. Both give the AVX-512 kernel's bits (attention.h).
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

inline int64_t slot_of(const PagedKV& kv, int64_t p) {
  return int64_t{kv.block_table[p / kv.block_size]} * kv.block_size + p % kv.block_size;
}

inline float round_f16(float x) { return f16_to_f32(f32_to_f16(x)); }

// Sum of 16 lanes in the order of GCC's _mm512_reduce_add_ps (halves, then
// quarters, then pairs), which GGML's AVX-512 kernels end with.
inline float reduce16(const float* a) {
  float t3[8], t6[4];
  for (int i = 0; i < 8; ++i) t3[i] = a[i + 8] + a[i];
  for (int i = 0; i < 4; ++i) t6[i] = t3[i + 4] + t3[i];
  return (t6[0] + t6[2]) + (t6[1] + t6[3]);
}

// q.k as ggml_vec_dot_f16: four accumulators of 16 lanes over 64-element
// steps, folded (0+2)+(1+3), reduced; the tail added in double.
inline float dot_decode(const float* q, const uint16_t* k, int64_t D) {
  const int64_t np = D & ~int64_t{63};
  float sum[4][16] = {};
  for (int64_t i = 0; i < np; i += 64)
    for (int j = 0; j < 4; ++j)
      for (int l = 0; l < 16; ++l) sum[j][l] = std::fma(f16_to_f32(k[i + 16 * j + l]), q[i + 16 * j + l], sum[j][l]);
  for (int l = 0; l < 16; ++l) sum[0][l] = (sum[0][l] + sum[2][l]) + (sum[1][l] + sum[3][l]);
  double s = reduce16(sum[0]);
  for (int64_t i = np; i < D; ++i) s += static_cast<double>(f16_to_f32(k[i]) * q[i]);
  return static_cast<float>(s);
}

// q.k as tinyBLAS: one accumulator of 16 lanes, then reduced (D % 16 == 0).
inline float dot_prefill(const float* q, const uint16_t* k, int64_t D) {
  float c[16] = {};
  for (int64_t i = 0; i < D; i += 16)
    for (int l = 0; l < 16; ++l) c[l] = std::fma(f16_to_f32(k[i + l]), q[i + l], c[l]);
  return reduce16(c);
}


inline void attend_one_head_portable(const float* q_in, const PagedKV& kv, int64_t head_offset, int64_t D, int64_t pos_begin,
                            int64_t pos_end, float scale, AttentionPass pass, float* out) {
  thread_local std::vector<float> q, weights, acc;
  q.resize(static_cast<size_t>(D));
  for (int64_t d = 0; d < D; ++d) q[d] = round_f16(q_in[d]);
  const bool prefill = pass == AttentionPass::kPrefill;
  const bool prefill_scores = prefill && D % 16 == 0;  // tinyBLAS takes only whole vectors

  // Scores over whole 16-position chunks; positions outside the range are masked.
  const int64_t c0 = pos_begin - pos_begin % 16;
  const int64_t n = (pos_end - c0 + 15) / 16 * 16;
  weights.assign(static_cast<size_t>(n), -std::numeric_limits<float>::infinity());
  float max = -std::numeric_limits<float>::infinity();
  for (int64_t p = pos_begin; p < pos_end; ++p) {
    const uint16_t* k = kv.k + slot_of(kv, p) * kv.slot_stride + head_offset;
    const float s = (prefill_scores ? dot_prefill(q.data(), k, D) : dot_decode(q.data(), k, D)) * scale;
    weights[p - c0] = s;
    max = std::max(max, s);
  }
  double sum = 0;
  for (int64_t i = 0; i < n; i += 16) {
    for (int l = 0; l < 16; ++l) weights[i + l] = expf_poly(weights[i + l] - max);
    sum += static_cast<double>(reduce16(&weights[i]));
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) weights[i] = round_f16(weights[i] * inv);

  // Weighted values: one partial sum per lane (position mod 16) and, for a
  // decode pass, per accumulator ((position / 16) mod 4), folded as GGML does.
  const int64_t n_sets = prefill ? 16 : 64;
  acc.assign(static_cast<size_t>(n_sets * D), 0.0f);
  for (int64_t p = pos_begin; p < pos_end; ++p) {
    const uint16_t* v = kv.v + slot_of(kv, p) * kv.slot_stride + head_offset;
    float* a = &acc[(p % n_sets) * D];
    const float w = weights[p - c0];
    for (int64_t d = 0; d < D; ++d) a[d] = std::fma(f16_to_f32(v[d]), w, a[d]);
  }
  for (int64_t d = 0; d < D; ++d) {
    float y[16];
    for (int l = 0; l < 16; ++l) {
      y[l] = prefill ? acc[l * D + d]
                     : (acc[l * D + d] + acc[(32 + l) * D + d]) + (acc[(16 + l) * D + d] + acc[(48 + l) * D + d]);
    }
    out[d] = reduce16(y);
  }
}

}  // namespace

}  // namespace inferd::kernels::detail
