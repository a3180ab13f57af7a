// short_conv with 16 channels per vector, the last partial vector masked:
// a multiply and an add per tap, never fused, so the scalar reference's bits.
#include <immintrin.h>

#include "kernels/cpu/short_conv.h"

namespace inferd::kernels::detail {

void short_conv_avx512(const ShortConvArgs& a, int64_t c0, int64_t c1) {
  short_conv_tokens(a, c0, c1, [&](int64_t t, float* out, int64_t lo, int64_t hi) {
    for (int64_t c = lo; c < hi; c += 16) {
      const __mmask16 m = hi - c >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (hi - c)) - 1);
      __m512 sum = _mm512_setzero_ps();
      const int64_t rounded = rounded_taps(a.taps);
      for (int64_t i = 0; i < rounded; ++i) {
        __m512 product = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, short_conv_window_row(a, t + i) + c),
                                       _mm512_maskz_loadu_ps(m, a.weight + i * a.channels + c));
        __asm__("" : "+v"(product));  // not contracted into an fma with the add
        sum = _mm512_add_ps(sum, product);
      }
      for (int64_t i = rounded; i < a.taps; ++i)
        sum = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, short_conv_window_row(a, t + i) + c),
                              _mm512_maskz_loadu_ps(m, a.weight + i * a.channels + c), sum);
      _mm512_mask_storeu_ps(out + c, m, sum);
    }
  });
}

}  // namespace inferd::kernels::detail
