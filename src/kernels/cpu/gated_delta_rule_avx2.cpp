// gated_delta_rule with AVX2 and FMA: GGML's AVX2 build's vectors as it runs
// them; the AVX-512 build's order in portable code (compiled here with FMA
// instructions, the same bits).
#include <immintrin.h>

#include <cmath>

#include "kernels/cpu/gated_delta_rule_impl.h"

namespace inferd::kernels::detail {

namespace {

struct Avx2Order {
  static float dot(const float* a, const float* b, int64_t n) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
      for (int j = 0; j < 4; ++j)
        acc[j] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8 * j), _mm256_loadu_ps(b + i + 8 * j), acc[j]);
    const __m256 v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3]));
    const __m128 t0 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 t1 = _mm_hadd_ps(t0, t0);
    float sum = _mm_cvtss_f32(_mm_hadd_ps(t1, t1));  // (t0 + t1) + (t2 + t3)
    for (; i < n; ++i) {
      const float product = rounded_product(a[i], b[i]);
      sum += product;
    }
    return sum;
  }
  static void mad(float* y, const float* x, float v, int64_t n) {
    const __m256 vv = _mm256_set1_ps(v);
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
      for (int j = 0; j < 4; ++j)
        _mm256_storeu_ps(y + i + 8 * j,
                         _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8 * j), vv, _mm256_loadu_ps(y + i + 8 * j)));
    for (; i < n; ++i) y[i] = std::fma(x[i], v, y[i]);  // GGML's tail loop, vectorized and contracted
  }
};

}  // namespace

void gated_delta_rule_avx2_avx512_order(const GatedDeltaArgs& a, int64_t h0, int64_t h1) {
  gated_delta_rule_of<PortableAvx512Order>(a, h0, h1);
}
void gated_delta_rule_avx2_avx2_order(const GatedDeltaArgs& a, int64_t h0, int64_t h1) {
  gated_delta_rule_of<Avx2Order>(a, h0, h1);
}

}  // namespace inferd::kernels::detail
