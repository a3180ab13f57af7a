// What float_matmul.cpp and float_matmul_avx512.cpp share: the tail of
// GGML's ggml_vec_dot_f32 and the loop over tokens and rows. Included by
// files compiled for different instruction sets, hence internal linkage.
#pragma once
#include <cmath>

#include "kernels/cpu/float_matmul.h"

namespace inferd::kernels {
namespace {

// The elements [i, n) after the last whole 64-element step, as GCC compiled
// GGML's loop `sumf += x[i]*y[i]`: products of whole 8- and 4-element vectors
// rounded, then added one by one; the last n % 4 fused into the sum.
inline float f32_dot_tail(const float* a, const float* b, int64_t i, int64_t n, float sum) {
  for (const int64_t rounded_end = i + (n - i) / 4 * 4; i < rounded_end; ++i) {
    volatile float product = a[i] * b[i];  // volatile: the compiler must not fuse it into the add
    sum += product;
  }
  for (; i < n; ++i) sum = std::fma(a[i], b[i], sum);
  return sum;
}

// y[t * rows + r] for rows [r0, r1), each token in vec_dot's or tinyBLAS's order.
template <float (*VecDot)(const float*, const float*, int64_t), float (*TinyBlas)(const float*, const float*, int64_t)>
void f32_rows_of(const float* W, int64_t rows, int64_t cols, const float* x, int64_t n_tokens,
                 const TokenPlace* places, float* y, int64_t r0, int64_t r1) {
  for (int64_t t = 0; t < n_tokens; ++t) {
    const bool tinyblas = f32_tinyblas_avx512(rows, cols, places[t]);
    for (int64_t r = r0; r < r1; ++r)
      y[t * rows + r] = tinyblas ? TinyBlas(W + r * cols, x + t * cols, cols) : VecDot(W + r * cols, x + t * cols, cols);
  }
}

}  // namespace
}  // namespace inferd::kernels
