// selective_scan with AVX2 and FMA: GGML's AVX2 build's vectors as it runs
// them; the AVX-512 build's order in portable code (the same bits).
#include <immintrin.h>

#include "kernels/cpu/selective_scan_impl.h"

namespace inferd::kernels::detail {

namespace {

struct Avx2Order {
  static RowSum row(float* s, const float* B, const float* C, float dA, float xdt, int64_t n) {
    const __m256 vdA = _mm256_set1_ps(dA), vxdt = _mm256_set1_ps(xdt);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t k = 0;
    for (; k + 32 <= n; k += 32) {
      for (int j = 0; j < 4; ++j) {
        const int64_t e = k + 8 * j;
        const __m256 v = _mm256_fmadd_ps(_mm256_loadu_ps(s + e), vdA, _mm256_mul_ps(_mm256_loadu_ps(B + e), vxdt));
        acc[j] = _mm256_fmadd_ps(v, _mm256_loadu_ps(C + e), acc[j]);
        _mm256_storeu_ps(s + e, v);
      }
    }
    const __m256 v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3]));
    const __m128 t0 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 t1 = _mm_hadd_ps(t0, t0);
    return {_mm_cvtss_f32(_mm_hadd_ps(t1, t1)), k};
  }
};

}  // namespace

void selective_scan_avx2_avx512_order(const SelectiveScanArgs& a, int64_t h0, int64_t h1) {
  selective_scan_of<PortableAvx512Order>(a, h0, h1);
}
void selective_scan_avx2_avx2_order(const SelectiveScanArgs& a, int64_t h0, int64_t h1) {
  selective_scan_of<Avx2Order>(a, h0, h1);
}

}  // namespace inferd::kernels::detail
