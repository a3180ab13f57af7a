// e^x in single precision by the polynomial GGML uses on AVX-512
// (ggml_v_expf): x = n ln2 + b with n = round(x / ln2), e^b by a degree-5
// polynomial in b, then scaled by 2^n; |n| > 192 saturates to 0 or infinity.
// Why this one and not libm: the SiLU and softmax results feed the int8
// re-quantization of the next projection, where a last-bit difference from
// llama.cpp grows layer by layer (docs/design.md, "Logit tolerance"). The
// scalar, AVX-512 and 8-lane (expf_poly_x8) forms below give the same bits: every step is one IEEE
// operation, fused where GGML fuses. GGML's AVX2 build computes e^x a little
// differently: expf_poly_avx2 (and its 8-lane form) follows that one.
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>

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

// e^x as GGML's AVX2 build computes it (its 8-lane ggml_v_expf): the same
// reduction and polynomial, but the constant term is left out of the
// polynomial (j = p(b) - 1) and added while scaling, 2^n (k, built from the
// exponent bits of the rounded x / ln2) times (1 + j) in one fma; for |n| > 126
// the scale is split in two factors (s1, s2) so that the result can go
// subnormal, and |n| > 192 saturates to s1 * s1 (0 or infinity). Rounds
// differently from expf_poly in the last bit for some x, so the AVX2 flavour
// (GgmlFlavour::kAvx2) uses this one everywhere GGML's AVX2 build runs
// ggml_v_expf.
inline float expf_poly_avx2(float x) {
  using namespace expf_poly_constants;
  const float z = std::fma(x, kLog2e, kShift);
  const float n = z - kShift;
  const float b = std::fma(-n, kLn2Lo, std::fma(-n, kLn2Hi, x));
  const uint32_t e = std::bit_cast<uint32_t>(z) << 23;
  const float k = std::bit_cast<float>(e + 0x3f800000u);
  const float u = b * b;
  const float j = std::fma(std::fma(std::fma(kC5, b, kC4), u, std::fma(kC3, b, kC2)), u, kC1 * b);
  if (!(std::fabs(n) > 126.0f)) return std::fma(j, k, k);
  const uint32_t g = n <= 0.0f ? 0x82000000u : 0u;
  const float s1 = std::bit_cast<float>(g + 0x7f000000u);
  if (std::fabs(n) > 192.0f) return s1 * s1;
  const float s2 = std::bit_cast<float>(e - g);
  return std::fma(s2, j, s2) * s1;
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

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

namespace inferd::kernels {
namespace {

// The part both 8-lane forms share: z = x log2e + shift (n's integer in the
// low mantissa bits), n = round(x / ln2), b = x - n ln2 in two steps; returns
// the polynomial in b, with its constant term 1 (kWithOne: expf_poly) or
// without it (expf_poly_avx2).
template <bool kWithOne>
[[gnu::always_inline]] inline __m256 expf_reduce_poly8(__m256 x, __m256& z, __m256& n) {
  using namespace expf_poly_constants;
  const __m256 shift = _mm256_set1_ps(kShift);
  z = _mm256_fmadd_ps(x, _mm256_set1_ps(kLog2e), shift);
  n = _mm256_sub_ps(z, shift);
  const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x));
  const __m256 u = _mm256_mul_ps(b, b);
  const __m256 c1b = kWithOne ? _mm256_fmadd_ps(_mm256_set1_ps(kC1), b, _mm256_set1_ps(1.0f))
                              : _mm256_mul_ps(_mm256_set1_ps(kC1), b);
  return _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(kC5), b, _mm256_set1_ps(kC4)), u,
                                         _mm256_fmadd_ps(_mm256_set1_ps(kC3), b, _mm256_set1_ps(kC2))),
                         u, c1b);
}

// expf_poly_avx2 on eight lanes, to the bit.
inline __m256 expf_poly8(__m256 x) {
  __m256 z, n;
  const __m256 j = expf_reduce_poly8<false>(x, z, n);
  const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
  const __m256 k = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_set1_epi32(0x3f800000)));
  const __m256 abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), n);
  const __m256 big = _mm256_cmp_ps(abs_n, _mm256_set1_ps(126.0f), _CMP_GT_OQ);
  const __m256 res = _mm256_fmadd_ps(j, k, k);
  if (_mm256_movemask_ps(big) == 0) return res;
  const __m256i g = _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ)),
                                     _mm256_set1_epi32(static_cast<int>(0x82000000u)));
  const __m256 s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f000000)));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
  const __m256 huge = _mm256_cmp_ps(abs_n, _mm256_set1_ps(192.0f), _CMP_GT_OQ);
  const __m256 scaled = _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1);
  return _mm256_blendv_ps(_mm256_blendv_ps(res, scaled, big), _mm256_mul_ps(s1, s1), huge);
}

// expf_poly on eight lanes, to the bit (the AVX-512 build's e^x on AVX2, not
// expf_poly8). ldexp(j, n) is j * 2^n rounded once; for |n| > 126, where 2^n
// is no normal float, it is j * 2^(n -+ 100) (exact: normal) times
// 2^(+-100), again one rounding.
inline __m256 expf_poly_x8(__m256 x) {
  __m256 z, n;
  const __m256 j = expf_reduce_poly8<true>(x, z, n);
  const __m256i ni = _mm256_cvtps_epi32(n);  // n is a whole number
  const __m256 abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), n);
  const __m256 big = _mm256_cmp_ps(abs_n, _mm256_set1_ps(126.0f), _CMP_GT_OQ);
  auto pow2 = [](__m256i e) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(127)), 23)); };
  if (_mm256_movemask_ps(big) == 0) return _mm256_mul_ps(j, pow2(ni));
  const __m256 neg = _mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ);
  const __m256i shift_by = _mm256_and_si256(_mm256_castps_si256(big),  // 100 (n < -126) or -100 (n > 126)
                                            _mm256_blendv_epi8(_mm256_set1_epi32(-100), _mm256_set1_epi32(100),
                                                               _mm256_castps_si256(neg)));
  const __m256 back = _mm256_blendv_ps(_mm256_set1_ps(1.0f),
                                       _mm256_blendv_ps(_mm256_set1_ps(0x1p100f), _mm256_set1_ps(0x1p-100f), neg), big);
  const __m256 res = _mm256_mul_ps(_mm256_mul_ps(j, pow2(_mm256_add_epi32(ni, shift_by))), back);
  const __m256 huge = _mm256_cmp_ps(abs_n, _mm256_set1_ps(192.0f), _CMP_GT_OQ);
  return _mm256_blendv_ps(res, _mm256_blendv_ps(_mm256_set1_ps(INFINITY), _mm256_setzero_ps(), neg), huge);
}

}  // namespace
}  // namespace inferd::kernels
#endif
