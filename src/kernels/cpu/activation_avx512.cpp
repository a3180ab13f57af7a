#include <immintrin.h>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/expf_poly.h"

namespace inferd::kernels::detail {

void swiglu_avx512(const float* gate, const float* up, float* out, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(gate + i);
    const __m512 silu = _mm512_div_ps(x, _mm512_add_ps(one, expf_poly16(_mm512_sub_ps(_mm512_setzero_ps(), x))));
    _mm512_storeu_ps(out + i, _mm512_mul_ps(silu, _mm512_loadu_ps(up + i)));
  }
  swiglu_scalar(gate + i, up + i, out + i, n - i);
}

// GGML's AVX-512 build's silu: 16 lanes by the vector e^x, the rest by libm.
void silu_avx512_avx512_order(const float* x, float* out, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    _mm512_storeu_ps(out + i, _mm512_div_ps(v, _mm512_add_ps(one, expf_poly16(_mm512_sub_ps(_mm512_setzero_ps(), v)))));
  }
  silu_portable<16>(x + i, out + i, n - i);
}

}  // namespace inferd::kernels::detail
