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
#include "kernels/cpu/attention_portable_impl.h"

namespace inferd::kernels::detail {

// Internal linkage: this header is compiled with different instruction sets in
// different files, and one shared out-of-line copy could carry the wrong ones.
namespace {
namespace ggml_avx2 {

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

// The AVX2 build for attend_one_head_of (attention_portable_impl.h).
struct Build {
  static constexpr int kLanes = 8;
  static float expf(float x) { return expf_poly_avx2(x); }
  static float reduce_decode(const float* y) { return reduce8_hadd(y); }
  static float reduce_prefill(const float* y) { return reduce8_movehl(y); }
  // tinyBLAS needs rows in fours for the values.
  static bool prefill_values(AttentionPass pass, int64_t D) { return pass == AttentionPass::kPrefill && D % 4 == 0; }
};

// Scores w[0, n) (n a multiple of 8, positions outside the range -inf) into
// softmax weights, as ggml_soft_max_f32 on AVX2 (with `max` their maximum).
inline void softmax(float* w, int64_t n, float max) { softmax_of<Build, false>(w, n, max); }

inline void attend_one_head_portable(const float* q_in, const PagedKV& kv, int64_t head_offset, int64_t D,
                                     int64_t pos_begin, int64_t pos_end, float scale, AttentionPass pass,
                                     float* out, const float* sinks) {
  attend_one_head_of<Build>(q_in, kv, head_offset, D, pos_begin, pos_end, scale, pass, out, sinks);
}

}  // namespace ggml_avx2

// Latent attention (attend_latent_heads) head by head with either build's
// order: the portable kernel with keys of Dk and values of their first Dv.
template <class Build>
inline void attend_latent_heads_of(const float* q, int64_t n_heads, const PagedKV& kv, int64_t Dk, int64_t Dv,
                                   int64_t pos_begin, int64_t pos_end, float scale, AttentionPass pass, float* out) {
  for (int64_t h = 0; h < n_heads; ++h)
    attend_one_head_kv_of<Build>(q + h * Dk, kv, 0, Dk, Dv, pos_begin, pos_end, scale, pass, out + h * Dv, nullptr);
}

}  // namespace

}  // namespace inferd::kernels::detail
