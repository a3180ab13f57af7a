// Element-wise activations of the feed-forward block.
#pragma once
#include <cstdint>

namespace inferd::kernels {

// out[i] = silu(gate[i]) * up[i], silu(x) = x / (1 + e^-x) with expf_poly
// (GGML's SwiGLU to the bit). out may alias gate or up.
void swiglu(const float* gate, const float* up, float* out, int64_t n);

namespace detail {
void swiglu_scalar(const float* gate, const float* up, float* out, int64_t n);
void swiglu_avx512(const float* gate, const float* up, float* out, int64_t n);
}  // namespace detail

}  // namespace inferd::kernels
