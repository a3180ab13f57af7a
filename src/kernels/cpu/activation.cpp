#include "kernels/cpu/activation.h"

#include <cstring>

#include "kernels/cpu/expf_poly.h"
#include "kernels/cpu/quants.h"

namespace inferd::kernels {

namespace detail {

void swiglu_scalar(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = gate[i];
    out[i] = x / (1.0f + expf_poly(0.0f - x)) * up[i];
  }
}

}  // namespace detail

void swiglu(const float* gate, const float* up, float* out, int64_t n) {
  static const bool avx512 = std::strcmp(simd_level(), "avx512vnni") == 0;
  if (avx512) {
    detail::swiglu_avx512(gate, up, out, n);
  } else {
    detail::swiglu_scalar(gate, up, out, n);
  }
}

}  // namespace inferd::kernels
