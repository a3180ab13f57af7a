// short_conv with 8 channels per vector (compiled with -mavx2 -mfma): a
// multiply and an add per tap, never fused, so the scalar reference's bits.
#include <immintrin.h>

#include <cmath>

#include "kernels/cpu/short_conv.h"

namespace inferd::kernels::detail {

void short_conv_avx2(const ShortConvArgs& a, int64_t c0, int64_t c1) {
  short_conv_tokens(a, c0, c1, [&](int64_t t, float* out, int64_t lo, int64_t hi) {
    int64_t c = lo;
    for (; c + 8 <= hi; c += 8) {
      __m256 sum = _mm256_setzero_ps();
      const int64_t rounded = rounded_taps(a.taps);
      for (int64_t i = 0; i < rounded; ++i) {
        __m256 product = _mm256_mul_ps(_mm256_loadu_ps(short_conv_window_row(a, t + i) + c),
                                       _mm256_loadu_ps(a.weight + i * a.channels + c));
        __asm__("" : "+x"(product));  // not contracted into an fma with the add
        sum = _mm256_add_ps(sum, product);
      }
      for (int64_t i = rounded; i < a.taps; ++i)
        sum = _mm256_fmadd_ps(_mm256_loadu_ps(short_conv_window_row(a, t + i) + c),
                              _mm256_loadu_ps(a.weight + i * a.channels + c), sum);
      _mm256_storeu_ps(out + c, sum);
    }
    for (; c < hi; ++c) {
      float sum = 0.0f;
      const int64_t rounded = rounded_taps(a.taps);
      for (int64_t i = 0; i < rounded; ++i)
        sum += rounded_product(short_conv_window_row(a, t + i)[c], a.weight[i * a.channels + c]);
      for (int64_t i = rounded; i < a.taps; ++i)
        sum = std::fma(short_conv_window_row(a, t + i)[c], a.weight[i * a.channels + c], sum);
      out[c] = sum;
    }
  });
}

}  // namespace inferd::kernels::detail
