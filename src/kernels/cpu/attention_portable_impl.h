// The portable attention kernel, compiled twice: in attention.cpp for any
// x86-64 CPU (std::fma a library call) and in attention_avx2.cpp with FMA
// instructions. Both give the AVX-512 kernel's bits (attention.h).
//
// attend_one_head_of<K> is written once for both GGML builds, K naming what
// differs: the lanes of GGML's vectors (kLanes), its e^x, its lane sums, and
// which value products tinyBLAS takes. Avx512Build below is that build's (the
// kernel of attend_one_head_portable); ggml_avx2::Build the AVX2 one's
// (attention_ggml_avx2_impl.h).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/expf_poly.h"
#include "kernels/cpu/quants.h"

namespace inferd::kernels::detail {

// Internal linkage: this header is compiled with different instruction sets in
// different files, and one shared out-of-line copy could carry the wrong ones.
namespace {

inline int64_t slot_of(const PagedKV& kv, int64_t p) { return kv.f16_slot(p); }

// n floats of scratch in v starting on a cache line: the vector kernels'
// partial sums are whole-line rows, and a row split across two lines costs
// every load and store of it (a vector's heap block is only 16-byte aligned).
inline float* line_aligned(std::vector<float>& v, size_t n) {
  v.resize(n + 16);
  const auto at = reinterpret_cast<uintptr_t>(v.data());
  return v.data() + ((64 - at % 64) % 64) / sizeof(float);
}

inline float round_f16(float x) { return f16_to_f32(f32_to_f16(x)); }

// An attention sink in GGML's soft_max: it joins the maximum as MAX(max, sink)
// does, and e^(sink - max), by libm's expf, is added after the positions' sum.
inline float max_with_sink(float max, const float* sink) { return sink && !(max > *sink) ? *sink : max; }
inline double add_sink(double sum, const float* sink, float max) {
  return sink ? sum + static_cast<double>(std::exp(*sink - max)) : sum;
}

// Sum of 16 lanes in the order of GCC's _mm512_reduce_add_ps (halves, then
// quarters, then pairs), which GGML's AVX-512 kernels end with.
inline float reduce16(const float* a) {
  float t3[8], t6[4];
  for (int i = 0; i < 8; ++i) t3[i] = a[i + 8] + a[i];
  for (int i = 0; i < 4; ++i) t6[i] = t3[i + 4] + t3[i];
  return (t6[0] + t6[2]) + (t6[1] + t6[3]);
}

// q.k as ggml_vec_dot_f16: four accumulators of L lanes over 4L-element
// steps, folded (0+2)+(1+3), reduced (K::reduce_decode); the tail added in
// double.
template <class K>
inline float dot_decode(const float* q, const uint16_t* k, int64_t D) {
  constexpr int L = K::kLanes;
  const int64_t np = D & ~int64_t{4 * L - 1};
  float sum[4][L] = {};
  for (int64_t i = 0; i < np; i += 4 * L)
    for (int j = 0; j < 4; ++j)
      for (int l = 0; l < L; ++l) sum[j][l] = std::fma(f16_to_f32(k[i + L * j + l]), q[i + L * j + l], sum[j][l]);
  float y[L];
  for (int l = 0; l < L; ++l) y[l] = (sum[0][l] + sum[2][l]) + (sum[1][l] + sum[3][l]);
  double s = K::reduce_decode(y);
  for (int64_t i = np; i < D; ++i) s += static_cast<double>(f16_to_f32(k[i]) * q[i]);
  return static_cast<float>(s);
}

// q.k as tinyBLAS: one accumulator of L lanes, then reduced
// (K::reduce_prefill; D % L == 0).
template <class K>
inline float dot_prefill(const float* q, const uint16_t* k, int64_t D) {
  constexpr int L = K::kLanes;
  float c[L] = {};
  for (int64_t i = 0; i < D; i += L)
    for (int l = 0; l < L; ++l) c[l] = std::fma(f16_to_f32(k[i + l]), q[i + l], c[l]);
  return K::reduce_prefill(c);
}

// Scores w[0, n) (n a multiple of L, positions outside the range -inf) into
// softmax weights, as ggml_soft_max_f32 (with `max` their maximum, and a sink
// when given): e^x by K::expf, the double sum taken over L-position chunks,
// each chunk summed as K::reduce_prefill; rounded to f16 (kRound) as the
// weights enter the product with the values.
template <class K, bool kRound>
inline void softmax_of(float* w, int64_t n, float max, const float* sink = nullptr) {
  constexpr int L = K::kLanes;
  max = max_with_sink(max, sink);
  double sum = 0;
  for (int64_t i = 0; i < n; i += L) {
    for (int l = 0; l < L; ++l) w[i + l] = K::expf(w[i + l] - max);
    sum += static_cast<double>(K::reduce_prefill(w + i));
  }
  sum = add_sink(sum, sink, max);
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) w[i] = kRound ? round_f16(w[i] * inv) : w[i] * inv;
}

// Keys of D elements and values of Dv (<= D) at the same head offset: Dv == D
// for attention, Dv < D for latent attention (the values are the keys' first
// Dv elements, attend_latent_heads).
template <class K>
inline void attend_one_head_kv_of(const float* q_in, const PagedKV& kv, int64_t head_offset, int64_t D, int64_t Dv,
                                  int64_t pos_begin, int64_t pos_end, float scale, AttentionPass pass, float* out,
                                  const float* sinks) {
  constexpr int L = K::kLanes;
  thread_local std::vector<float> q, weights, acc;
  q.resize(static_cast<size_t>(D));
  for (int64_t d = 0; d < D; ++d) q[d] = round_f16(q_in[d]);
  const bool prefill_scores = pass == AttentionPass::kPrefill && D % L == 0;  // tinyBLAS takes only whole vectors

  // Scores over whole L-position chunks (GGML's chunks start at position 0);
  // positions outside the range are masked.
  const int64_t c0 = pos_begin - pos_begin % L;
  const int64_t n = (pos_end - c0 + L - 1) / L * L;
  weights.assign(static_cast<size_t>(n), -std::numeric_limits<float>::infinity());
  float max = -std::numeric_limits<float>::infinity();
  for (int64_t p = pos_begin; p < pos_end; ++p) {
    const uint16_t* k = kv.k_f16() + slot_of(kv, p) + head_offset;
    const float s = (prefill_scores ? dot_prefill<K>(q.data(), k, D) : dot_decode<K>(q.data(), k, D)) * scale;
    weights[p - c0] = s;
    max = std::max(max, s);
  }
  softmax_of<K, true>(weights.data(), n, max, sinks);

  // Weighted values: one partial sum per lane (position mod L) and, for a
  // decode pass, per accumulator ((position / L) mod 4), folded as GGML does.
  const bool prefill = K::prefill_values(pass, Dv);
  const int64_t n_sets = prefill ? L : 4 * L;
  acc.assign(static_cast<size_t>(n_sets * Dv), 0.0f);
  for (int64_t p = pos_begin; p < pos_end; ++p) {
    const uint16_t* v = kv.v_f16() + slot_of(kv, p) + head_offset;
    float* a = &acc[(p % n_sets) * Dv];
    const float w = weights[p - c0];
    for (int64_t d = 0; d < Dv; ++d) a[d] = std::fma(f16_to_f32(v[d]), w, a[d]);
  }
  for (int64_t d = 0; d < Dv; ++d) {
    float y[L];
    if (prefill) {
      for (int l = 0; l < L; ++l) y[l] = acc[l * Dv + d];
      out[d] = K::reduce_prefill(y);
    } else {
      for (int l = 0; l < L; ++l)
        y[l] = (acc[l * Dv + d] + acc[(2 * L + l) * Dv + d]) + (acc[(L + l) * Dv + d] + acc[(3 * L + l) * Dv + d]);
      out[d] = K::reduce_decode(y);
    }
  }
}

template <class K>
inline void attend_one_head_of(const float* q_in, const PagedKV& kv, int64_t head_offset, int64_t D,
                               int64_t pos_begin, int64_t pos_end, float scale, AttentionPass pass, float* out, const float* sinks) {
  attend_one_head_kv_of<K>(q_in, kv, head_offset, D, D, pos_begin, pos_end, scale, pass, out, sinks);
}

// GGML's AVX-512 build: 16 lanes, e^x by expf_poly, every lane sum reduce16,
// tinyBLAS for the values of any head size.
struct Avx512Build {
  static constexpr int kLanes = 16;
  static float expf(float x) { return expf_poly(x); }
  static float reduce_decode(const float* y) { return reduce16(y); }
  static float reduce_prefill(const float* y) { return reduce16(y); }
  static bool prefill_values(AttentionPass pass, int64_t /*D*/) { return pass == AttentionPass::kPrefill; }
};

inline void attend_one_head_portable(const float* q_in, const PagedKV& kv, int64_t head_offset, int64_t D, int64_t pos_begin,
                            int64_t pos_end, float scale, AttentionPass pass, float* out, const float* sinks) {
  attend_one_head_of<Avx512Build>(q_in, kv, head_offset, D, pos_begin, pos_end, scale, pass, out, sinks);
}

}  // namespace

}  // namespace inferd::kernels::detail
