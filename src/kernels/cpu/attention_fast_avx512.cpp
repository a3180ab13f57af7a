// The fast tier's prefill attention at the AVX-512 levels: the AVX2 kernel
// (attention_fast_avx2.cpp) with its two integer products on 16 lanes with
// VNNI's vpdpwssd, which multiplies int16 pairs and adds them to int32 in one
// instruction, the query's or the weights' pair an embedded broadcast from
// memory. The products are integer sums followed by element-wise float steps,
// so the bits are the AVX2 kernel's; the online softmax between them stays
// AVX2's, whose lane sums and maxima are in its 8-lane order.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/attention_fast.h"
#include "kernels/cpu/attention_fast_impl.h"
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

constexpr FastAttentionIntProducts kVnniProducts{scores_chunk_vnni, kScoreRows, values_chunk_vnni, kValueRows};

}  // namespace

void attend_heads_tile_fast_avx512(const AttentionTile& tile, int64_t n_heads, const PagedKV& kv, int64_t head_offset,
                                   int64_t D, float scale, const float* sinks, const FastAttentionState* parts) {
  attend_heads_tile_fast_with(kVnniProducts, tile, n_heads, kv, head_offset, D, scale, sinks, parts);
}

}  // namespace inferd::kernels::detail
