// The fast tier's prefill attention at the AVX-512 levels: the AVX2 kernel
// (attention_fast_avx2.cpp) with its two integer products on 16 lanes with
// VNNI's vpdpwssd, which multiplies int16 pairs and adds them to int32 in one
// instruction, the query's or the weights' pair an embedded broadcast from
// memory; and the online softmax between them on 16 lanes. The products are
// integer sums followed by element-wise float steps, and the softmax keeps
// its lane sums in the 8-lane order, so the bits are the AVX2 kernel's.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/attention_fast.h"
#include "kernels/cpu/attention_fast_impl.h"
#include "kernels/cpu/expf_poly.h"
#include "kernels/cpu/lanes_avx512.h"

namespace inferd::kernels::detail {
namespace {

constexpr int64_t C = kFastAttentionChunk;
static_assert(C == 32, "the scores hold a chunk's keys in two vectors of 16");
constexpr int kScoreRows = 8;  // query rows a block holds: 16 accumulators
constexpr int kValueRows = 8;  // rows of weights a block holds, by 32 head elements: 16 accumulators

// s[r][0, 32) for the block's n rows: per pair of head elements, the chunk's
// 32 keys in two vectors and a broadcast query pair a row.
void scores_chunk_vnni(const int16_t* const* qc_rows, const float* qf, int64_t n, const int16_t* kc, const float* ks,
                       int64_t D, float* const* s) {
  const int16_t* qc[kScoreRows];
  block_rows<kScoreRows>(qc_rows, n, qc);
  __m512i acc0[kScoreRows], acc1[kScoreRows];  // (an array of 2 x 8 vectors GCC kept in memory)
#pragma GCC unroll 8
  for (int r = 0; r < kScoreRows; ++r) acc0[r] = acc1[r] = _mm512_setzero_si512();
  for (int64_t d = 0; d < D; d += 2) {
    const __m512i k0 = _mm512_loadu_si512(kc + d * C);
    const __m512i k1 = _mm512_loadu_si512(kc + d * C + 32);
  #pragma GCC unroll 8
  for (int r = 0; r < kScoreRows; ++r) {
      acc0[r] = dpwssd_broadcast(acc0[r], k0, qc[r] + d);
      acc1[r] = dpwssd_broadcast(acc1[r], k1, qc[r] + d);
    }
  }
  // The sums through memory at fixed places, then the float steps of the
  // block's own rows: indexed by n at run time, GCC kept every accumulator
  // in memory too, stored at each step.
  alignas(64) int32_t sums[kScoreRows][C];
#pragma GCC unroll 8
  for (int r = 0; r < kScoreRows; ++r) {
    _mm512_store_si512(sums[r], acc0[r]);
    _mm512_store_si512(sums[r] + 16, acc1[r]);
  }
  const __m512 ks0 = _mm512_loadu_ps(ks), ks1 = _mm512_loadu_ps(ks + 16);
  for (int64_t r = 0; r < n; ++r) {
    const __m512 f = _mm512_set1_ps(qf[r]);
    _mm512_storeu_ps(s[r], _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(sums[r])), _mm512_mul_ps(ks0, f)));
    _mm512_storeu_ps(s[r] + 16,
                     _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(sums[r] + 16)), _mm512_mul_ps(ks1, f)));
  }
}

// o[r][d] for the block's n rows over the chunk's 32 keys, 32 head elements
// at a time (a head size that is no multiple of 32 ends in masked lanes):
// per pair of keys, the head elements' value pairs in two vectors and a
// broadcast weight pair a row.
void values_chunk_vnni(const int16_t* const* pc_rows, const float* ps, const float* alpha, int64_t n,
                       const int16_t* vc, int64_t D, float* const* o) {
  const int16_t* pc[kValueRows];
  block_rows<kValueRows>(pc_rows, n, pc);
  for (int64_t d0 = 0; d0 < D; d0 += 32) {
    const int64_t left = D - d0;
    const __mmask16 m0 = first_lanes(left), m1 = first_lanes(left - 16);
    __m512i acc0[kValueRows], acc1[kValueRows];
#pragma GCC unroll 8
    for (int r = 0; r < kValueRows; ++r) acc0[r] = acc1[r] = _mm512_setzero_si512();
    for (int64_t j = 0; j < C; j += 2) {
      const int16_t* x = vc + j * D + 2 * d0;
      const __m512i x0 = _mm512_maskz_loadu_epi32(m0, x);
      const __m512i x1 = _mm512_maskz_loadu_epi32(m1, x + 32);
  #pragma GCC unroll 8
    for (int r = 0; r < kValueRows; ++r) {
        acc0[r] = dpwssd_broadcast(acc0[r], x0, pc[r] + j);
        acc1[r] = dpwssd_broadcast(acc1[r], x1, pc[r] + j);
      }
    }
    alignas(64) int32_t sums[kValueRows][32];  // (as in the scores)
#pragma GCC unroll 8
    for (int r = 0; r < kValueRows; ++r) {
      _mm512_store_si512(sums[r], acc0[r]);
      _mm512_store_si512(sums[r] + 16, acc1[r]);
    }
    for (int64_t r = 0; r < n; ++r) {
      const __m512 a = _mm512_set1_ps(alpha[r]), p = _mm512_set1_ps(ps[r]);
      float* at = o[r] + d0;
      const __m512 scaled0 = _mm512_mul_ps(_mm512_maskz_loadu_ps(m0, at), a);
      _mm512_mask_storeu_ps(at, m0, _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(sums[r])), p, scaled0));
      if (m1) {
        const __m512 scaled1 = _mm512_mul_ps(_mm512_maskz_loadu_ps(m1, at + 16), a);
        _mm512_mask_storeu_ps(at + 16, m1,
                              _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(sums[r] + 16)), p, scaled1));
      }
    }
  }
}

// Sixteen vectors' largest lanes, vector q's at lane q: a tree of shuffles
// and maxima over pairs (15 maxima for the 16, against 4 shuffles and 4
// maxima for each vector alone), then one permute that undoes the tree's
// lane order. Maxima are exact in any order, so each lane is what a vector's
// own reduction gives (for the finite values the softmax takes).
inline __m512 max_tree16(const __m512* v) {
  __m512 a[8], b[4], c[2];
#pragma GCC unroll 8
  for (int k = 0; k < 8; ++k)  // 128-bit lanes: 8 values of each of two vectors
    a[k] = _mm512_max_ps(_mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0x44),
                         _mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0xEE));
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k)  // 4 values of each of four vectors
    b[k] = _mm512_max_ps(_mm512_shuffle_f32x4(a[2 * k], a[2 * k + 1], 0x88),
                         _mm512_shuffle_f32x4(a[2 * k], a[2 * k + 1], 0xDD));
#pragma GCC unroll 2
  for (int k = 0; k < 2; ++k)  // 2 values of each of eight vectors
    c[k] = _mm512_max_ps(_mm512_shuffle_ps(b[2 * k], b[2 * k + 1], 0x44),
                         _mm512_shuffle_ps(b[2 * k], b[2 * k + 1], 0xEE));
  return _mm512_max_ps(_mm512_shuffle_ps(c[0], c[1], 0x88), _mm512_shuffle_ps(c[0], c[1], 0xDD));
}

// The permute that puts vector q's maximum at lane q: found once by running
// the tree on vectors holding their own index.
inline __m512i max_tree16_order() {
  static const __m512i order = [] {
    __m512 v[16];
    for (int q = 0; q < 16; ++q) v[q] = _mm512_set1_ps(static_cast<float>(q));
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, max_tree16(v));
    alignas(64) int32_t index[16];
    for (int l = 0; l < 16; ++l) index[static_cast<int>(lanes[l])] = l;
    return _mm512_load_si512(index);
  }();
  return order;
}

inline __m512 max_each16(const __m512* v, __m512i order) { return _mm512_permutexvar_ps(order, max_tree16(v)); }

// attention_fast.h's online softmax over one chunk (FastSoftmaxChunk) for a
// prompt tile, sixteen rows at a time, each row in two vectors of 16
// positions: the AVX2 kernel's steps, element-wise the same operations. The
// rows' maxima (of the scores, then of the weights) come out of one tree for
// the sixteen, and the steps between (the new maximum, the rescale factor,
// the weights' code step and its inverse) run on the sixteen rows' lanes:
// the same operations as the AVX2 kernel's per row, lane by lane. A row's
// lane sums are still formed in the 8-lane order ((p_l + p_l+8) + (p_l+16 +
// p_l+24)), so the bits are AVX2's.
void softmax_chunk_vnni(const FastSoftmaxChunk& c) {
  constexpr int kBatch = 16;
  const __m512 vs0 = _mm512_loadu_ps(c.value_steps), vs1 = _mm512_loadu_ps(c.value_steps + 16);
  const __m512 floor = _mm512_set1_ps(kFastAttentionExpFloor), minus_inf = _mm512_set1_ps(-INFINITY);
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512i hi = _mm512_set1_epi32(kFastAttentionWeightMax);
  const __m512i order = max_tree16_order();
  struct Row {
    float* s;
    int64_t r, a;  // tile row, active row
    __mmask16 valid0, valid1;
  };
  Row rows[kBatch];
  alignas(64) float m_old[kBatch], m_new[kBatch], alpha[kBatch], step[kBatch], inverse[kBatch];
  alignas(64) float w[kBatch][C];
  auto batch = [&](int n) {
    __m512 x[kBatch];
#pragma GCC unroll 16
    for (int q = 0; q < kBatch; ++q) {
      if (q >= n) {
        x[q] = minus_inf;
        m_old[q] = 0.0f;
        continue;
      }
      const Row& row = rows[q];
      x[q] = _mm512_max_ps(_mm512_mask_blend_ps(row.valid0, minus_inf, _mm512_loadu_ps(row.s)),
                           _mm512_mask_blend_ps(row.valid1, minus_inf, _mm512_loadu_ps(row.s + 16)));
      m_old[q] = c.m[row.r];
    }
    // m' = max(m, the chunk's maximum) (std::max's operand order, NaN
    // included); alpha = m == -inf ? 0 : m == m' ? 1 : e^(m - m').
    const __m512 mo = _mm512_load_ps(m_old), mn = _mm512_max_ps(max_each16(x, order), mo);
    __m512 al = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(mo, mn, _CMP_EQ_OQ), expf_poly16(_mm512_sub_ps(mo, mn)), one);
    al = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(mo, minus_inf, _CMP_EQ_OQ), al, _mm512_setzero_ps());
    _mm512_store_ps(m_new, mn);
    _mm512_store_ps(alpha, al);
    __m512 wmax[kBatch];
#pragma GCC unroll 16
    for (int q = 0; q < kBatch; ++q) {
      if (q >= n) {
        wmax[q] = _mm512_setzero_ps();
        continue;
      }
      const Row& row = rows[q];
      c.alpha[row.a] = alpha[q];
      c.m[row.r] = m_new[q];
      const __m512 mv = _mm512_set1_ps(m_new[q]);
      // Not below kFastAttentionExpFloor (e^x's quick path); 0 where invalid.
      const __m512 p0 = _mm512_maskz_mov_ps(
          row.valid0, expf_poly16(_mm512_maskz_max_ps(row.valid0, _mm512_sub_ps(_mm512_loadu_ps(row.s), mv), floor)));
      const __m512 p1 = _mm512_maskz_mov_ps(
          row.valid1,
          expf_poly16(_mm512_maskz_max_ps(row.valid1, _mm512_sub_ps(_mm512_loadu_ps(row.s + 16), mv), floor)));
      _mm512_storeu_ps(row.s, p0);
      _mm512_storeu_ps(row.s + 16, p1);
      float* lanes = c.lanes + row.r * 8;
      const __m256 sum4 =
          _mm256_add_ps(_mm256_add_ps(_mm512_castps512_ps256(p0), _mm512_extractf32x8_ps(p0, 1)),
                        _mm256_add_ps(_mm512_castps512_ps256(p1), _mm512_extractf32x8_ps(p1, 1)));
      _mm256_storeu_ps(lanes, _mm256_fmadd_ps(_mm256_loadu_ps(lanes), _mm256_set1_ps(alpha[q]), sum4));
      // The weights times their values' steps (0 where not read).
      const __m512 w0 = _mm512_maskz_mul_ps(row.valid0, p0, vs0), w1 = _mm512_maskz_mul_ps(row.valid1, p1, vs1);
      _mm512_store_ps(w[q], w0);
      _mm512_store_ps(w[q] + 16, w1);
      wmax[q] = _mm512_max_ps(w0, w1);
    }
    // The weights' code step over the chunk (code_step) and its inverse (code_inverse).
    const __m512 st = _mm512_div_ps(max_each16(wmax, order), _mm512_set1_ps(static_cast<float>(kFastAttentionWeightMax)));
    _mm512_store_ps(step, st);
    _mm512_store_ps(inverse, _mm512_maskz_div_ps(_mm512_cmp_ps_mask(st, _mm512_setzero_ps(), _CMP_NEQ_UQ), one, st));
    for (int q = 0; q < n; ++q) {
      c.weight_step[rows[q].a] = step[q];
      const __m512 id = _mm512_set1_ps(inverse[q]);
      const auto codes = [&](__m512 v) {
        return _mm512_cvtsepi32_epi16(_mm512_min_epi32(
            _mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v, id)), _mm512_setzero_si512()), hi));
      };
      int16_t* pc = c.pc + rows[q].a * C;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(pc), codes(_mm512_load_ps(w[q])));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(pc + 16), codes(_mm512_load_ps(w[q] + 16)));
    }
  };
  int n = 0;
  int64_t a = 0;
  for (int64_t k = 0; k < c.n_active; ++k) {
    const int64_t i = c.active[k];
    // Position c0 + j is valid when j is in [b - c0, e - c0).
    const int64_t j0 = std::clamp<int64_t>(c.pos_begin[i] - c.c0, 0, C), j1 = std::clamp<int64_t>(c.pos_end[i] - c.c0, 0, C);
    const uint32_t bits = (j1 >= 32 ? ~0u : (1u << j1) - 1) & ~(j0 >= 32 ? ~0u : (1u << j0) - 1);
    for (int64_t h = 0; h < c.n_heads; ++h, ++a) {
      rows[n++] = {c.s_rows[a], i * c.n_heads + h, a, static_cast<__mmask16>(bits), static_cast<__mmask16>(bits >> 16)};
      if (n == kBatch) batch(n), n = 0;
    }
  }
  if (n > 0) batch(n);
}

constexpr FastAttentionIntProducts kVnniProducts{scores_chunk_vnni, kScoreRows, values_chunk_vnni, kValueRows,
                                                 softmax_chunk_vnni};

}  // namespace

void attend_heads_tile_fast_avx512(const AttentionTile& tile, int64_t n_heads, const PagedKV& kv, int64_t head_offset,
                                   int64_t D, float scale, const float* sinks, const FastAttentionState* parts) {
  attend_heads_tile_fast_with(kVnniProducts, tile, n_heads, kv, head_offset, D, scale, sinks, parts);
}

}  // namespace inferd::kernels::detail
