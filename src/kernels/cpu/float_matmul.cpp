#include "kernels/cpu/float_matmul_impl.h"

#include "kernels/cpu/attention_portable_impl.h"

namespace inferd::kernels {

namespace {

float dot_vec_dot_order(const float* a, const float* b, int64_t n) {
  float acc[4][16] = {};
  int64_t i = 0;
  for (; i + 64 <= n; i += 64)
    for (int j = 0; j < 4; ++j)
      for (int l = 0; l < 16; ++l) acc[j][l] = std::fma(a[i + 16 * j + l], b[i + 16 * j + l], acc[j][l]);
  float v[16];
  for (int l = 0; l < 16; ++l) v[l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
  float sum = detail::reduce16(v);
  return f32_dot_tail(a, b, i, n, sum);
}

float dot_tinyblas_order(const float* a, const float* b, int64_t n) {
  float acc[16] = {};
  for (int64_t i = 0; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; ++l) acc[l] = std::fma(a[i + l], b[i + l], acc[l]);
  return detail::reduce16(acc);
}

}  // namespace

void f32_rows_ggml_avx512_order_portable(const float* W, int64_t rows, int64_t cols, const float* x, int64_t n_tokens,
                                         const TokenPlace* places, float* y, int64_t r0, int64_t r1) {
  f32_rows_of<dot_vec_dot_order, dot_tinyblas_order>(W, rows, cols, x, n_tokens, places, y, r0, r1);
}

void f32_rows_ggml_avx512_order(const float* W, int64_t rows, int64_t cols, const float* x, int64_t n_tokens,
                                const TokenPlace* places, float* y, int64_t r0, int64_t r1) {
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  if (avx512) {
    f32_rows_ggml_avx512_order_avx512(W, rows, cols, x, n_tokens, places, y, r0, r1);
  } else {
    f32_rows_ggml_avx512_order_portable(W, rows, cols, x, n_tokens, places, y, r0, r1);
  }
}

}  // namespace inferd::kernels
