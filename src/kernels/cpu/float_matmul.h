// F32 weights (a mixture-of-experts router, in the common files) in the
// order of GGML's AVX-512 build (GgmlFlavour::kAvx512). The kernel table's
// float kernels follow its AVX2 build; the two differ in vector width:
// - ggml_vec_dot_f32 (one-token steps, and wherever tinyBLAS declines): four
//   accumulators of 16 lanes over 64-element steps, fused multiply-adds,
//   folded (0+2) + (1+3), then (02 + 13), summed as _mm512_reduce_add_ps;
//   elements past the last whole step added one by one in float, their
//   products rounded except for the last n % 4, which are fused (GCC's
//   vectorization of GGML's tail loop);
// - llamafile's tinyBLAS (steps of two tokens or more, rows % 4 == 0 and
//   cols % 16 == 0): one accumulator of 16 lanes, summed the same way.
#pragma once
#include <cstdint>

#include "kernels/cpu/matmul.h"

namespace inferd::kernels {

// y[t * rows + r] for weight rows [r0, r1) of W (rows x cols F32) and the
// activation rows x (n_tokens x cols F32), places[t] choosing each token's order.
void f32_rows_ggml_avx512_order(const float* W, int64_t rows, int64_t cols, const float* x, int64_t n_tokens,
                                const TokenPlace* places, float* y, int64_t r0, int64_t r1);

// The same in portable code (any CPU, slower), and with AVX-512 (tests compare them).
void f32_rows_ggml_avx512_order_portable(const float* W, int64_t rows, int64_t cols, const float* x, int64_t n_tokens,
                                         const TokenPlace* places, float* y, int64_t r0, int64_t r1);
void f32_rows_ggml_avx512_order_avx512(const float* W, int64_t rows, int64_t cols, const float* x, int64_t n_tokens,
                                       const TokenPlace* places, float* y, int64_t r0, int64_t r1);

// Whether GGML's AVX-512 build runs tinyBLAS for such a matmul and token.
inline bool f32_tinyblas_avx512(int64_t rows, int64_t cols, TokenPlace place) {
  return place.chunk >= 2 && rows % 4 == 0 && cols % 16 == 0;
}

}  // namespace inferd::kernels
