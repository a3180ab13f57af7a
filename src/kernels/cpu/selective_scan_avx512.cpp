// selective_scan with AVX-512: GGML's AVX-512 build's vectors as it runs
// them; the AVX2 build's order in portable code (the same bits).
#include <immintrin.h>

#include "kernels/cpu/selective_scan_impl.h"

namespace inferd::kernels::detail {

namespace {

struct Avx512Order {
  static RowSum row(float* s, const float* B, const float* C, float dA, float xdt, int64_t n) {
    const __m512 vdA = _mm512_set1_ps(dA), vxdt = _mm512_set1_ps(xdt);
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    int64_t k = 0;
    for (; k + 64 <= n; k += 64) {
      for (int j = 0; j < 4; ++j) {
        const int64_t e = k + 16 * j;
        const __m512 v = _mm512_fmadd_ps(_mm512_loadu_ps(s + e), vdA, _mm512_mul_ps(_mm512_loadu_ps(B + e), vxdt));
        acc[j] = _mm512_fmadd_ps(v, _mm512_loadu_ps(C + e), acc[j]);
        _mm512_storeu_ps(s + e, v);
      }
    }
    const __m512 v = _mm512_add_ps(_mm512_add_ps(acc[0], acc[2]), _mm512_add_ps(acc[1], acc[3]));
    return {_mm512_reduce_add_ps(v), k};
  }
};

}  // namespace

void selective_scan_avx512_avx512_order(const SelectiveScanArgs& a, int64_t h0, int64_t h1) {
  selective_scan_of<Avx512Order>(a, h0, h1);
}
void selective_scan_avx512_avx2_order(const SelectiveScanArgs& a, int64_t h0, int64_t h1) {
  selective_scan_of<PortableAvx2Order>(a, h0, h1);
}

}  // namespace inferd::kernels::detail
