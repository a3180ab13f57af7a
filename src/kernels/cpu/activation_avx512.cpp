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

// gelu_portable's table lookup for 16 lanes: F16C's rounding (nearest even,
// as the scalar levels'), a 32-bit gather of each entry (the table has room
// past its end), the cut-offs as masks.
void gelu_avx512(const float* x, float* out, int64_t n) {
  const auto* table = reinterpret_cast<const int*>(gelu_f16_table());
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    const __m512i h = _mm512_cvtepu16_epi32(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    const __m512i entry = _mm512_i32gather_epi32(h, table, 2);
    __m512 g = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(entry));  // the low 16 bits: the entry
    g = _mm512_mask_mov_ps(g, _mm512_cmp_ps_mask(v, _mm512_set1_ps(10.0f), _CMP_GE_OQ), v);
    g = _mm512_mask_mov_ps(g, _mm512_cmp_ps_mask(v, _mm512_set1_ps(-10.0f), _CMP_LE_OQ), _mm512_setzero_ps());
    _mm512_storeu_ps(out + i, g);
  }
  gelu_portable(x + i, out + i, n - i, [](float v) { return _cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT); },
                [](uint16_t h) { return _cvtsh_ss(h); });
}

}  // namespace inferd::kernels::detail
