// The fast tier's BF16 product with AVX-512 (bf16_gemm.h): a group's 16 rows
// are the 16 lanes of every vector. Where the CPU has AVX-512 BF16, dpbf16ps
// adds a pair of products per lane in one instruction; elsewhere two fused
// multiply-adds per pair do the same arithmetic (bf16_layout.h).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/kernel_table.h"

namespace inferd::kernels {
namespace {

// Rounds 16 floats to BF16 as f32_to_bf16_rne does, as 16-bit lanes.
inline __m256i round_to_bf16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i exp = _mm512_and_si512(u, _mm512_set1_epi32(0x7F800000));
  const __m512i mag = _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF));
  const __mmask16 tiny = _mm512_cmpeq_epi32_mask(exp, _mm512_setzero_si512());
  const __mmask16 nan = _mm512_cmpgt_epi32_mask(mag, _mm512_set1_epi32(0x7F800000));
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
  r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x0040)));
  r = _mm512_mask_mov_epi32(r, tiny, _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x8000)));
  return _mm512_cvtepi32_epi16(r);
}

void convert_avx512(const float* x, int64_t n_pairs, uint32_t* out) {
  int64_t p = 0;
  for (; p + 8 <= n_pairs; p += 8)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + p), round_to_bf16(_mm512_loadu_ps(x + 2 * p)));
  if (p < n_pairs) {
    const __mmask16 m = static_cast<__mmask16>((1u << (2 * (n_pairs - p))) - 1);
    const __m256i r = round_to_bf16(_mm512_maskz_loadu_ps(m, x + 2 * p));
    _mm256_mask_storeu_epi16(out + p, m, r);
  }
}

inline void store_rows(float* y, __m512 v, int rows) {
  if (rows == kBf16Rows) {
    _mm512_storeu_ps(y, v);
  } else {
    _mm512_mask_storeu_ps(y, static_cast<__mmask16>((1u << rows) - 1), v);
  }
}

// acc += a_hi * w_hi, then acc += a_lo * w_lo, per lane.
struct NativePair {
  static inline __m512 step(__m512 acc, uint32_t a, __m512i w) {
    return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_set1_epi32(static_cast<int>(a)), (__m512bh)w);
  }
};
struct FmaPair {
  static inline __m512 step(__m512 acc, uint32_t a, __m512i w) {
    const __m512 w_hi = _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
    const __m512 w_lo = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
    acc = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(a & 0xFFFF0000u))), w_hi, acc);
    return _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(a << 16))), w_lo, acc);
  }
};

// NT tokens from t against NG groups from g: NT x NG accumulators of 16 rows.
template <class Pair, int NT, int NG>
void tile(const Bf16WeightsView& w, const Bf16ActsView& a, int64_t t, int64_t g, float* y, size_t y_stride) {
  const int64_t pairs = w.pairs();
  __m512 acc[NT][NG];
  for (int i = 0; i < NT; ++i)
    for (int j = 0; j < NG; ++j) acc[i][j] = _mm512_setzero_ps();
  const uint32_t* x = a.pairs + t * pairs;
  const uint32_t* wg = w.group(g);
  const int64_t group_dwords = pairs * kBf16Rows;
  for (int64_t p = 0; p < pairs; ++p) {
    __m512i wv[NG];
    for (int j = 0; j < NG; ++j) wv[j] = _mm512_loadu_si512(wg + j * group_dwords + p * kBf16Rows);
    for (int i = 0; i < NT; ++i) {
      const uint32_t av = x[i * pairs + p];
      for (int j = 0; j < NG; ++j) acc[i][j] = Pair::step(acc[i][j], av, wv[j]);
    }
  }
  for (int j = 0; j < NG; ++j) {
    const int rows = static_cast<int>(std::min<int64_t>(kBf16Rows, w.rows - (g + j) * kBf16Rows));
    for (int i = 0; i < NT; ++i) store_rows(y + i * y_stride + (g + j) * kBf16Rows, acc[i][j], rows);
  }
}

template <class Pair, int NG>
void tokens(const Bf16WeightsView& w, const Bf16ActsView& a, int64_t t0, int64_t nt, int64_t g, float* y,
            size_t y_stride) {
  constexpr int kTile = 8;
  int64_t i = 0;
  for (; i + kTile <= nt; i += kTile) tile<Pair, kTile, NG>(w, a, t0 + i, g, y + i * y_stride, y_stride);
  float* yi = y + i * y_stride;
  switch (nt - i) {
    case 7: return tile<Pair, 7, NG>(w, a, t0 + i, g, yi, y_stride);
    case 6: return tile<Pair, 6, NG>(w, a, t0 + i, g, yi, y_stride);
    case 5: return tile<Pair, 5, NG>(w, a, t0 + i, g, yi, y_stride);
    case 4: return tile<Pair, 4, NG>(w, a, t0 + i, g, yi, y_stride);
    case 3: return tile<Pair, 3, NG>(w, a, t0 + i, g, yi, y_stride);
    case 2: return tile<Pair, 2, NG>(w, a, t0 + i, g, yi, y_stride);
    case 1: return tile<Pair, 1, NG>(w, a, t0 + i, g, yi, y_stride);
    default: return;
  }
}

// Three groups (48 rows) at a time: 8 x 3 accumulators, 3 weight vectors.
template <class Pair>
void groups(const Bf16WeightsView& w, const Bf16ActsView& a, int64_t t0, int64_t nt, int64_t g0, int64_t g1, float* y,
            size_t y_stride) {
  int64_t g = g0;
  for (; g + 3 <= g1; g += 3) tokens<Pair, 3>(w, a, t0, nt, g, y, y_stride);
  if (g1 - g == 2) tokens<Pair, 2>(w, a, t0, nt, g, y, y_stride);
  if (g1 - g == 1) tokens<Pair, 1>(w, a, t0, nt, g, y, y_stride);
}

}  // namespace

Bf16ConvertFn bf16_convert_avx512() { return convert_avx512; }

Bf16GroupsFn bf16_groups_avx512(bool dpbf16) { return dpbf16 ? groups<NativePair> : groups<FmaPair>; }

bool cpu_has_avx512_bf16() { return __builtin_cpu_supports("avx512bf16"); }

}  // namespace inferd::kernels
