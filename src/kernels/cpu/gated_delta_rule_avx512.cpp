// gated_delta_rule with AVX-512: GGML's AVX-512 build's vectors as it runs
// them; the AVX2 build's order in portable code (the same bits).
#include <immintrin.h>

#include <cmath>

#include "kernels/cpu/gated_delta_rule_impl.h"

namespace inferd::kernels::detail {

namespace {

struct Avx512Order {
  static float dot(const float* a, const float* b, int64_t n) {
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    int64_t i = 0;
    for (; i + 64 <= n; i += 64)
      for (int j = 0; j < 4; ++j)
        acc[j] = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16 * j), _mm512_loadu_ps(b + i + 16 * j), acc[j]);
    const __m512 v = _mm512_add_ps(_mm512_add_ps(acc[0], acc[2]), _mm512_add_ps(acc[1], acc[3]));
    return f32_dot_tail(a, b, i, n, _mm512_reduce_add_ps(v));
  }
  static void mad(float* y, const float* x, float v, int64_t n) {
    const __m512 vv = _mm512_set1_ps(v);
    int64_t i = 0;
    for (; i + 64 <= n; i += 64)
      for (int j = 0; j < 4; ++j)
        _mm512_storeu_ps(y + i + 16 * j,
                         _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16 * j), vv, _mm512_loadu_ps(y + i + 16 * j)));
    for (; i < n; ++i) y[i] = std::fma(x[i], v, y[i]);  // GGML's tail loop, vectorized and contracted
  }
};

}  // namespace

void gated_delta_rule_avx512_avx512_order(const GatedDeltaArgs& a, int64_t h0, int64_t h1) {
  gated_delta_rule_of<Avx512Order>(a, h0, h1);
}
void gated_delta_rule_avx512_avx2_order(const GatedDeltaArgs& a, int64_t h0, int64_t h1) {
  gated_delta_rule_of<PortableAvx2Order>(a, h0, h1);
}

}  // namespace inferd::kernels::detail
