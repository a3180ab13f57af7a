#include "kernels/cpu/activation.h"

#include <cstring>

#include "kernels/cpu/expf_poly.h"
#include "kernels/cpu/quants.h"

namespace inferd::kernels {

namespace detail {

void swiglu_scalar(const float* gate, const float* up, float* out, int64_t n) { swiglu_portable(gate, up, out, n); }

}  // namespace detail

void swiglu(const float* gate, const float* up, float* out, int64_t n) {
  using Fn = void (*)(const float*, const float*, float*, int64_t);
  static const Fn fn = std::strcmp(simd_level(), "avx512vnni") == 0 ? detail::swiglu_avx512
                       : std::strcmp(simd_level(), "avx2") == 0     ? detail::swiglu_fma
                                                                    : detail::swiglu_scalar;
  fn(gate, up, out, n);
}

}  // namespace inferd::kernels
