// Rotary position embedding of one head, in place, with GGML's arithmetic.
#pragma once
#include <cstdint>

namespace inferd::kernels {

// Which elements rotate together: (2i, 2i+1) for llama-style RoPE, (i, i + n/2)
// for neox-style.
enum class RopePairs { kAdjacent, kHalves };

// Rotates the first rope_dim elements of x by the angles whose cosines and
// sines are cos_t[0..rope_dim/2), sin_t[...]. Each rotated value is one fused
// multiply-add of two products, as GCC compiles GGML's rotate_pairs: that last
// bit matters (docs/design.md, "Logit tolerance").
void rope_head(float* x, int64_t rope_dim, RopePairs pairs, const float* cos_t, const float* sin_t);

namespace detail {
void rope_head_scalar(float* x, int64_t rope_dim, RopePairs pairs, const float* cos_t, const float* sin_t);
void rope_head_fma(float* x, int64_t rope_dim, RopePairs pairs, const float* cos_t, const float* sin_t);
}  // namespace detail

}  // namespace inferd::kernels
