// Lane helpers shared by the AVX2 kernels (included only by *_avx2.cpp files,
// which are compiled with AVX2 enabled).
#pragma once
#include <immintrin.h>

namespace inferd::kernels::detail {

// Internal linkage: each including file carries its own copy.
namespace {

// The sum of eight lanes: halves, then pairs, then the last two
// ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)).
inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

inline float hmax8(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}

}  // namespace
}  // namespace inferd::kernels::detail
