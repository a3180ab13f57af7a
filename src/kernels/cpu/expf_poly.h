// e^x in single precision by the polynomial GGML uses on AVX-512
// (ggml_v_expf): x = n ln2 + b with n = round(x / ln2), e^b by a degree-5
// polynomial in b, then scaled by 2^n; |n| > 192 saturates to 0 or infinity.
// Why this one and not libm: the SiLU and softmax results feed the int8
// re-quantization of the next projection, where a last-bit difference from
// llama.cpp grows layer by layer (docs/design.md, "Logit tolerance"). The
// scalar and AVX-512 forms below give the same bits: every step is one IEEE
// operation, fused where GGML fuses.
#pragma once
#include <cmath>

namespace inferd::kernels {

// Internal linkage: this header is compiled with different instruction sets in
// different files, and one shared out-of-line copy could carry the wrong ones.
namespace {

namespace expf_poly_constants {
constexpr float kShift = 0x1.8p23f;         // adding it rounds to an integer
constexpr float kLog2e = 0x1.715476p+0f;
constexpr float kLn2Hi = 0x1.62e4p-1f;
constexpr float kLn2Lo = 0x1.7f7d1cp-20f;
constexpr float kC1 = 0x1.ffffecp-1f, kC2 = 0x1.fffdb6p-2f, kC3 = 0x1.555e66p-3f;
constexpr float kC4 = 0x1.573e2ep-5f, kC5 = 0x1.0e4020p-7f;
}  // namespace expf_poly_constants

inline float expf_poly(float x) {
  using namespace expf_poly_constants;
  const float n = std::fma(x, kLog2e, kShift) - kShift;
  const float b = std::fma(-n, kLn2Lo, std::fma(-n, kLn2Hi, x));
  const float u = b * b;
  const float j = std::fma(std::fma(std::fma(kC5, b, kC4), u, std::fma(kC3, b, kC2)), u, std::fma(kC1, b, 1.0f));
  if (std::fabs(n) > 192.0f) return n <= 0.0f ? 0.0f : INFINITY;
  return std::ldexp(j, static_cast<int>(n));
}

}  // namespace
}  // namespace inferd::kernels

#ifdef __AVX512F__
#include <immintrin.h>

namespace inferd::kernels {
namespace {

inline __m512 expf_poly16(__m512 x) {
  using namespace expf_poly_constants;
  const __m512 shift = _mm512_set1_ps(kShift);
  const __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(kLog2e), shift), shift);
  const __m512 b = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x));
  const __m512 u = _mm512_mul_ps(b, b);
  const __m512 j = _mm512_fmadd_ps(
      _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_set1_ps(kC5), b, _mm512_set1_ps(kC4)), u,
                      _mm512_fmadd_ps(_mm512_set1_ps(kC3), b, _mm512_set1_ps(kC2))),
      u, _mm512_fmadd_ps(_mm512_set1_ps(kC1), b, _mm512_set1_ps(1.0f)));
  const __m512 res = _mm512_scalef_ps(j, n);
  const __mmask16 out_of_range = _mm512_cmp_ps_mask(_mm512_abs_ps(n), _mm512_set1_ps(192.0f), _CMP_GT_OQ);
  if (out_of_range == 0) return res;
  const __m512 saturated = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(n, _mm512_setzero_ps(), _CMP_LE_OQ),
                                                _mm512_set1_ps(INFINITY), _mm512_setzero_ps());
  return _mm512_mask_blend_ps(out_of_range, res, saturated);
}

}  // namespace
}  // namespace inferd::kernels
#endif
