// The gated delta rule of a Gated DeltaNet layer, as GGML's fused
// GGML_OP_GATED_DELTA_NET computes it on the CPU (llama.cpp builds that op for
// prompts and for one-token steps alike), to the bit for the chosen build.
//
// Per value head h, with its key head h % n_k_heads (GGML broadcasts the key
// heads by index modulo), a state S of size x size (kept transposed, as GGML
// keeps it: M[j][i] = S[i][j], so each row of M is contiguous), and per token:
//   M *= e^g                       (g <= 0: the decay; libm's expf)
//   delta[j] = (v[j] - M[j] . k) * beta
//   M[j] += delta[j] * k           (row by row)
//   out[j] = (M[j] . q) / sqrt(size)
// q and k arrive L2-normalized. The dot products are ggml_vec_dot_f32's, whose
// summation order is the build's (flavour.h); the row updates are
// ggml_vec_mad_f32's (every element fused, its tail loop included: GCC
// vectorizes and contracts it). Every level gives the same bits for a flavour.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/flavour.h"

namespace inferd::kernels {

struct GatedDeltaArgs {
  const float* q = nullptr;  // per token: n_k_heads rows of `size`, q_stride floats between tokens
  const float* k = nullptr;  // likewise, k_stride
  const float* v = nullptr;  // per token: n_v_heads rows of `size`, v_stride
  size_t q_stride = 0, k_stride = 0, v_stride = 0;
  const float* g = nullptr;     // per token: n_v_heads decays (log space), gb_stride floats between tokens
  const float* beta = nullptr;  // per token: n_v_heads write strengths, gb_stride
  size_t gb_stride = 0;
  int64_t n_tokens = 0;
  int64_t n_k_heads = 0;
  int64_t n_v_heads = 0;  // a multiple of n_k_heads
  int64_t size = 0;       // head size (keys and values alike)
  float* state = nullptr;  // n_v_heads matrices of size * size (M above); read and updated
  float* out = nullptr;    // per token: n_v_heads rows of `size`, out_stride floats between tokens
  size_t out_stride = 0;
};

// Value heads [h0, h1) over all of a's tokens (threads that split the heads
// share nothing). out must not alias the inputs or the state.
void gated_delta_rule(const GatedDeltaArgs& a, int64_t h0, int64_t h1, GgmlFlavour flavour);

namespace detail {
using GatedDeltaFn = void (*)(const GatedDeltaArgs& a, int64_t h0, int64_t h1);
// [flavour] at each level.
void gated_delta_rule_scalar_avx512_order(const GatedDeltaArgs& a, int64_t h0, int64_t h1);
void gated_delta_rule_scalar_avx2_order(const GatedDeltaArgs& a, int64_t h0, int64_t h1);
void gated_delta_rule_avx2_avx512_order(const GatedDeltaArgs& a, int64_t h0, int64_t h1);
void gated_delta_rule_avx2_avx2_order(const GatedDeltaArgs& a, int64_t h0, int64_t h1);
void gated_delta_rule_avx512_avx512_order(const GatedDeltaArgs& a, int64_t h0, int64_t h1);
void gated_delta_rule_avx512_avx2_order(const GatedDeltaArgs& a, int64_t h0, int64_t h1);
}  // namespace detail

}  // namespace inferd::kernels
