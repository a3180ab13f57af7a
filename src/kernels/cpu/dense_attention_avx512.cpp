// dense_attention with AVX-512: the keys transposed per call so that sixteen
// keys' scores build up in one vector, e^x by expf_poly16 (expf_poly's bits),
// and the output's D columns in vectors (dense_attention.h's arithmetic).
// Queries go four at a time through the score and output loops: each query's
// sums keep their order, and the four chains of fused multiply-adds overlap.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/dense_attention.h"
#include "kernels/cpu/expf_poly.h"
#include "kernels/cpu/lanes_avx512.h"

namespace inferd::kernels::detail {

namespace {

// Queries [i, i + NQ): their weights e (row per query, n16 wide) and output rows.
template <int NQ>
void queries(const DenseAttentionArgs& a, int64_t i, const float* kt, int64_t n16, float* e) {
  int64_t m[NQ];
  for (int r = 0; r < NQ; ++r) m[r] = a.causal ? i + r + 1 : a.n;
  const int64_t m_max = m[NQ - 1];
  const __m512 scale = _mm512_set1_ps(a.scale);
  __m512 max_v[NQ];
  for (int r = 0; r < NQ; ++r) max_v[r] = _mm512_set1_ps(-INFINITY);
  for (int64_t j = 0; j < m_max; j += 16) {
    __m512 dot[NQ];
    for (int r = 0; r < NQ; ++r) dot[r] = _mm512_setzero_ps();
    for (int64_t d = 0; d < a.D; ++d) {
      const __m512 k = _mm512_loadu_ps(kt + d * n16 + j);
      for (int r = 0; r < NQ; ++r) dot[r] = _mm512_fmadd_ps(_mm512_set1_ps(a.q[(i + r) * a.q_stride + d]), k, dot[r]);
    }
    for (int r = 0; r < NQ; ++r) {
      const __m512 s = _mm512_mul_ps(scale, dot[r]);
      _mm512_storeu_ps(e + r * n16 + j, s);
      max_v[r] = _mm512_mask_max_ps(max_v[r], first_lanes(m[r] - j), max_v[r], s);
    }
  }
  float inv[NQ];
  for (int r = 0; r < NQ; ++r) {
    const __m512 max_s = _mm512_set1_ps(_mm512_reduce_max_ps(max_v[r]));
    __m512 lanes = _mm512_setzero_ps();
    float* er = e + r * n16;
    for (int64_t j = 0; j < m[r]; j += 16) {
      const __m512 x = _mm512_maskz_mov_ps(first_lanes(m[r] - j), expf_poly16(_mm512_sub_ps(_mm512_loadu_ps(er + j), max_s)));
      _mm512_storeu_ps(er + j, x);
      lanes = _mm512_add_ps(lanes, x);
    }
    alignas(64) float lane_sums[16];
    _mm512_store_ps(lane_sums, lanes);
    float sum = 0.0f;
    for (float l : lane_sums) sum += l;
    inv[r] = 1.0f / sum;
  }
  for (int64_t d0 = 0; d0 < a.D; d0 += 16) {
    const __mmask16 cols = first_lanes(a.D - d0);
    __m512 acc[NQ];
    for (int r = 0; r < NQ; ++r) acc[r] = _mm512_setzero_ps();
    const int64_t m_min = m[0];
    for (int64_t j = 0; j < m_min; ++j) {
      const __m512 v = _mm512_maskz_loadu_ps(cols, a.v + j * a.kv_stride + d0);
      for (int r = 0; r < NQ; ++r) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(e[r * n16 + j] * inv[r]), v, acc[r]);
    }
    for (int r = 1; r < NQ; ++r)  // causal: the later queries' last keys
      for (int64_t j = m_min; j < m[r]; ++j)
        acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(e[r * n16 + j] * inv[r]),
                                 _mm512_maskz_loadu_ps(cols, a.v + j * a.kv_stride + d0), acc[r]);
    for (int r = 0; r < NQ; ++r) _mm512_mask_storeu_ps(a.out + (i + r) * a.out_stride + d0, cols, acc[r]);
  }
}

}  // namespace

void dense_attention_avx512(const DenseAttentionArgs& a) {
  constexpr int kQueries = 4;
  const int64_t n16 = (a.n + 15) / 16 * 16;
  thread_local std::vector<float> kt, e;
  kt.resize(static_cast<size_t>(a.D * n16));
  e.resize(static_cast<size_t>(kQueries * n16));
  // kt[d][j] = k_j[d], zero past n.
  for (int64_t d = 0; d < a.D; ++d) {
    float* row = kt.data() + d * n16;
    for (int64_t j = 0; j < a.n; ++j) row[j] = a.k[j * a.kv_stride + d];
    std::fill(row + a.n, row + n16, 0.0f);
  }
  int64_t i = 0;
  for (; i + kQueries <= a.n; i += kQueries) queries<kQueries>(a, i, kt.data(), n16, e.data());
  for (; i < a.n; ++i) queries<1>(a, i, kt.data(), n16, e.data());
}

}  // namespace inferd::kernels::detail
