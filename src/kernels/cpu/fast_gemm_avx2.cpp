// The fast tier's product with AVX2 (fast_gemm.h): a group's 16 rows as two
// halves of 8 lanes. maddubs multiplies codes by activation bytes and adds
// pairs in int16 (no saturation for codes below 128: 2 x 127 x 128 < 2^15),
// madd adds the pairs into one int32 per row; codes of 128 and more (Q8_0's)
// are split into their top bit and the rest, each product exact.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/kernel_table.h"

namespace inferd::kernels {
namespace {

// Codes up to 255: only the 32-column byte formats (Q5_0/1, Q5_K, Q8_0, MXFP4)
// can have them; the split costs those formats two more steps a vector.
template <int B, bool kNibbles>
constexpr bool kWideCodes = B == 32 && !kNibbles;

template <int B, bool kNibbles, int NT>
void half_tokens(const FastWeightsView& w, const FastActsView& a, int64_t g, int h, int64_t t, float* y,
                 size_t y_stride, int rows) {
  const int64_t nb32 = a.cols / 32;
  const __m256i ones = _mm256_set1_epi16(1), sign_weight = _mm256_set1_epi16(128);
  const __m256i low_nibble = _mm256_set1_epi8(0x0F), low7 = _mm256_set1_epi8(0x7F);
  __m256 acc[NT];
  for (int j = 0; j < NT; ++j) acc[j] = _mm256_setzero_ps();
  for (int64_t b = 0; b < w.blocks(); ++b) {
    const uint8_t* blk = w.block_at(g, b);
    const auto* sm = reinterpret_cast<const float*>(blk + w.quant_bytes());
    const __m256 scale = _mm256_loadu_ps(sm + 8 * h), min = _mm256_loadu_ps(sm + kFastRows + 8 * h);
    __m256i codes[B / 4];
    if constexpr (kNibbles) {
      for (int i = 0; i < B / 8; ++i) {
        const __m256i p = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * i + 32 * h));
        codes[i] = _mm256_and_si256(p, low_nibble);
        codes[i + B / 8] = _mm256_and_si256(_mm256_srli_epi16(p, 4), low_nibble);
      }
    } else {
      for (int i = 0; i < B / 4; ++i)
        codes[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * i + 32 * h));
    }
    for (int j = 0; j < NT; ++j) {
      const int8_t* q = a.q + (t + j) * a.cols + b * B;
      __m256i isum = _mm256_setzero_si256();
      for (int i = 0; i < B / 4; ++i) {
        int32_t four;
        std::memcpy(&four, q + 4 * i, 4);
        const __m256i x = _mm256_set1_epi32(four);
        if constexpr (kWideCodes<B, kNibbles>) {
          const __m256i top = _mm256_srli_epi16(_mm256_andnot_si256(low7, codes[i]), 7);
          const __m256i rest = _mm256_and_si256(codes[i], low7);
          isum = _mm256_add_epi32(isum, _mm256_madd_epi16(_mm256_maddubs_epi16(rest, x), ones));
          isum = _mm256_add_epi32(isum, _mm256_madd_epi16(_mm256_maddubs_epi16(top, x), sign_weight));
        } else {
          isum = _mm256_add_epi32(isum, _mm256_madd_epi16(_mm256_maddubs_epi16(codes[i], x), ones));
        }
      }
      const int64_t tt = t + j;
      const float d = a.d[tt * nb32 + b * B / 32];
      const float dsum = B == 32 ? a.dsum32[tt * nb32 + b] : a.dsum16[tt * 2 * nb32 + b];
      acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(scale, _mm256_set1_ps(d)), acc[j]);
      acc[j] = _mm256_fmadd_ps(min, _mm256_set1_ps(dsum), acc[j]);
    }
  }
  const int n = std::clamp(rows - 8 * h, 0, 8);
  for (int j = 0; j < NT; ++j) {
    float* out = y + j * y_stride + 8 * h;
    if (n == 8) {
      _mm256_storeu_ps(out, acc[j]);
    } else {
      alignas(32) float tmp[8];
      _mm256_store_ps(tmp, acc[j]);
      std::memcpy(out, tmp, sizeof(float) * n);
    }
  }
}

constexpr int kTokens = 4;

// Tokens whose activation rows stay in cache while every group passes over them.
constexpr int64_t kChunkTokens = 32;

template <int B, bool kNibbles>
void chunk(const FastWeightsView& w, const FastActsView& a, int64_t t0, int64_t nt, int64_t g0, int64_t g1, float* y,
           size_t y_stride) {
  for (int64_t g = g0; g < g1; ++g) {
    const int rows = static_cast<int>(std::min<int64_t>(kFastRows, w.rows - g * kFastRows));
    float* yg = y + g * kFastRows;
    for (int h = 0; h < 2 && 8 * h < rows; ++h) {
      int64_t i = 0;
      for (; i + kTokens <= nt; i += kTokens)
        half_tokens<B, kNibbles, kTokens>(w, a, g, h, t0 + i, yg + i * y_stride, y_stride, rows);
      for (; i < nt; ++i) half_tokens<B, kNibbles, 1>(w, a, g, h, t0 + i, yg + i * y_stride, y_stride, rows);
    }
  }
}

template <int B, bool kNibbles>
void groups(const FastWeightsView& w, const FastActsView& a, int64_t t0, int64_t nt, int64_t g0, int64_t g1, float* y,
            size_t y_stride) {
  for (int64_t i = 0; i < nt; i += kChunkTokens)
    chunk<B, kNibbles>(w, a, t0 + i, std::min(kChunkTokens, nt - i), g0, g1, y + i * y_stride, y_stride);
}

void fast_groups_avx2_impl(const FastWeightsView& w, const FastActsView& a, int64_t t0, int64_t nt, int64_t g0,
                           int64_t g1, float* y, size_t y_stride) {
  if (w.block == 32) {
    (w.nibbles ? groups<32, true> : groups<32, false>)(w, a, t0, nt, g0, g1, y, y_stride);
  } else {
    (w.nibbles ? groups<16, true> : groups<16, false>)(w, a, t0, nt, g0, g1, y, y_stride);
  }
}

}  // namespace

FastGroupsFn fast_groups_avx2() { return fast_groups_avx2_impl; }

}  // namespace inferd::kernels
