// The activations with AVX2, FMA and F16C (compiled with -mavx2 -mfma -mf16c).
#include <immintrin.h>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/expf_poly.h"

namespace inferd::kernels::detail {

void swiglu_fma(const float* gate, const float* up, float* out, int64_t n) { swiglu_portable(gate, up, out, n); }

// GGML's AVX2 build: silu by the 8-lane e^x over whole blocks of 8, then the
// remainder by libm (swiglu_ggml_avx2_portable).
void swiglu_ggml_avx2_fma(const float* gate, const float* up, float* out, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(gate + i);
    const __m256 silu = _mm256_div_ps(x, _mm256_add_ps(one, expf_poly8(_mm256_sub_ps(_mm256_setzero_ps(), x))));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
  }
  swiglu_ggml_avx2_portable(gate + i, up + i, out + i, n - i);
}

// GGML's AVX2 build's silu: 8 lanes by the vector e^x, the rest by libm.
void silu_avx2_avx2_order(const float* x, float* out, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    _mm256_storeu_ps(out + i, _mm256_div_ps(v, _mm256_add_ps(one, expf_poly8(_mm256_sub_ps(_mm256_setzero_ps(), v)))));
  }
  silu_portable<8>(x + i, out + i, n - i);
}

// geglu_scalar with the f16 conversions in hardware (F16C rounds to nearest
// even, as GGML's conversion does).
void geglu_f16c(const float* gate, const float* up, float* out, int64_t n) {
  geglu_portable(gate, up, out, n, [](float x) { return _cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT); },
                 [](uint16_t h) { return _cvtsh_ss(h); });
}

void gelu_f16c(const float* x, float* out, int64_t n) {
  gelu_portable(x, out, n, [](float v) { return _cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT); },
                [](uint16_t h) { return _cvtsh_ss(h); });
}

}  // namespace inferd::kernels::detail
