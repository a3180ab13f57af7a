#include "kernels/cpu/rope.h"

#include <cstring>

#include "kernels/cpu/quants.h"
#include "kernels/cpu/rope_impl.h"

namespace inferd::kernels {

namespace detail {
void rope_head_scalar(float* x, int64_t rope_dim, RopePairs pairs, const float* cos_t, const float* sin_t) {
  rope_head_body(x, rope_dim, pairs, cos_t, sin_t);
}
}  // namespace detail

void rope_head(float* x, int64_t rope_dim, RopePairs pairs, const float* cos_t, const float* sin_t) {
  static const bool fma = std::strcmp(simd_level(), "scalar") != 0;  // AVX2 and above have FMA
  if (fma) {
    detail::rope_head_fma(x, rope_dim, pairs, cos_t, sin_t);
  } else {
    detail::rope_head_scalar(x, rope_dim, pairs, cos_t, sin_t);
  }
}

}  // namespace inferd::kernels
