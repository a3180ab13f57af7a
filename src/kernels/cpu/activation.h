// Element-wise activations of the feed-forward block.
#pragma once
#include <cstdint>

#include "kernels/cpu/expf_poly.h"

namespace inferd::kernels {

// out[i] = silu(gate[i]) * up[i], silu(x) = x / (1 + e^-x) with expf_poly
// (GGML's SwiGLU to the bit). out may alias gate or up.
void swiglu(const float* gate, const float* up, float* out, int64_t n);

namespace detail {
void swiglu_scalar(const float* gate, const float* up, float* out, int64_t n);
void swiglu_fma(const float* gate, const float* up, float* out, int64_t n);  // AVX2 + FMA
void swiglu_avx512(const float* gate, const float* up, float* out, int64_t n);

// The element loop of every level but AVX-512 (compiled with and without FMA
// instructions; the same bits either way). Internal linkage, so each file keeps
// the copy built with its own instruction set.
namespace {
inline void swiglu_portable(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = gate[i];
    out[i] = x / (1.0f + expf_poly(0.0f - x)) * up[i];
  }
}
}  // namespace
}  // namespace detail

}  // namespace inferd::kernels
