// The fast tier's BF16 product with AVX2 (bf16_gemm.h): two fused
// multiply-adds per pair of columns, in dpbf16ps's order (bf16_layout.h), a
// group's 16 rows in two vectors of 8.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/kernel_table.h"

namespace inferd::kernels {
namespace {

template <int NT>
void tile(const Bf16WeightsView& w, const Bf16ActsView& a, int64_t t, int64_t g, float* y, size_t y_stride) {
  const int64_t pairs = w.pairs();
  __m256 acc[NT][2];
  for (int i = 0; i < NT; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  const uint32_t* x = a.pairs + t * pairs;
  const uint32_t* wg = w.group(g);
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int64_t p = 0; p < pairs; ++p) {
    __m256 w_hi[2], w_lo[2];
    for (int h = 0; h < 2; ++h) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + p * kBf16Rows + 8 * h));
      w_hi[h] = _mm256_castsi256_ps(_mm256_and_si256(v, high));
      w_lo[h] = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    }
    for (int i = 0; i < NT; ++i) {
      const uint32_t av = x[i * pairs + p];
      const __m256 a_hi = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(av & 0xFFFF0000u)));
      const __m256 a_lo = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(av << 16)));
      for (int h = 0; h < 2; ++h) acc[i][h] = _mm256_fmadd_ps(a_lo, w_lo[h], _mm256_fmadd_ps(a_hi, w_hi[h], acc[i][h]));
    }
  }
  const int rows = static_cast<int>(std::min<int64_t>(kBf16Rows, w.rows - g * kBf16Rows));
  for (int i = 0; i < NT; ++i) {
    float* yi = y + i * y_stride + g * kBf16Rows;
    if (rows == kBf16Rows) {
      _mm256_storeu_ps(yi, acc[i][0]);
      _mm256_storeu_ps(yi + 8, acc[i][1]);
    } else {
      alignas(32) float tmp[kBf16Rows];
      _mm256_store_ps(tmp, acc[i][0]);
      _mm256_store_ps(tmp + 8, acc[i][1]);
      std::copy(tmp, tmp + rows, yi);
    }
  }
}

void groups_avx2(const Bf16WeightsView& w, const Bf16ActsView& a, int64_t t0, int64_t nt, int64_t g0, int64_t g1,
                 float* y, size_t y_stride) {
  constexpr int kTile = 4;
  for (int64_t g = g0; g < g1; ++g) {
    int64_t i = 0;
    for (; i + kTile <= nt; i += kTile) tile<kTile>(w, a, t0 + i, g, y + i * y_stride, y_stride);
    float* yi = y + i * y_stride;
    switch (nt - i) {
      case 3: tile<3>(w, a, t0 + i, g, yi, y_stride); break;
      case 2: tile<2>(w, a, t0 + i, g, yi, y_stride); break;
      case 1: tile<1>(w, a, t0 + i, g, yi, y_stride); break;
      default: break;
    }
  }
}

}  // namespace

Bf16GroupsFn bf16_groups_avx2() { return groups_avx2; }

}  // namespace inferd::kernels
