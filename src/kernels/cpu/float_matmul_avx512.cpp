// float_matmul.h's kernels with AVX-512: the instructions GGML's AVX-512 build
// runs, in its order (so the bits are the portable code's).
#include <immintrin.h>

#include "kernels/cpu/float_matmul_impl.h"

namespace inferd::kernels {

namespace {

float dot_vec_dot_order(const float* a, const float* b, int64_t n) {
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  int64_t i = 0;
  for (; i + 64 <= n; i += 64)
    for (int j = 0; j < 4; ++j)
      acc[j] = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16 * j), _mm512_loadu_ps(b + i + 16 * j), acc[j]);
  const __m512 v = _mm512_add_ps(_mm512_add_ps(acc[0], acc[2]), _mm512_add_ps(acc[1], acc[3]));
  float sum = _mm512_reduce_add_ps(v);
  return f32_dot_tail(a, b, i, n, sum);
}

float dot_tinyblas_order(const float* a, const float* b, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i + 16 <= n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
  return _mm512_reduce_add_ps(acc);
}

}  // namespace

void f32_rows_ggml_avx512_order_avx512(const float* W, int64_t rows, int64_t cols, const float* x, int64_t n_tokens,
                                       const TokenPlace* places, float* y, int64_t r0, int64_t r1) {
  f32_rows_of<dot_vec_dot_order, dot_tinyblas_order>(W, rows, cols, x, n_tokens, places, y, r0, r1);
}

}  // namespace inferd::kernels
