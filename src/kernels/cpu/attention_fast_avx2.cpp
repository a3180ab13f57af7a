// The fast tier's prefill attention with AVX2, FMA and F16C: attention_fast.h's
// arithmetic, to the bit, as register-blocked products. A prompt tile, per
// chunk of 32 positions: the keys and values coded as 16-bit integers straight
// from the cache's f16 rows, in pairs for madd (two head elements of a key
// side by side, two keys' values of a head element side by side); then scores
// for five query rows by sixteen keys at a time (each key vector loaded once
// for five broadcast query pairs), the online softmax row by row with its
// weights coded, and the weighted values for four rows by sixteen head
// elements. A decode step's parts keep f32 products: the keys turned to f32
// and transposed, the values to f32, six rows by sixteen at a time.
#include <immintrin.h>


#include <algorithm>
#include <cassert>
#include <cmath>
#include <vector>

#include "kernels/cpu/attention_fast.h"
#include "kernels/cpu/attention_fast_impl.h"
#include "kernels/cpu/expf_poly.h"
#include "kernels/cpu/lanes_avx2.h"

namespace inferd::kernels::detail {

namespace {

constexpr int64_t C = kFastAttentionChunk;
constexpr int kRows = 6;  // query rows a register block holds

inline __m256 load_f16(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Rows a..h of an 8 x 8 block turned into its columns.
inline void transpose8(__m256& a, __m256& b, __m256& c, __m256& d, __m256& e, __m256& f, __m256& g, __m256& h) {
  const __m256 t0 = _mm256_unpacklo_ps(a, b), t1 = _mm256_unpackhi_ps(a, b);
  const __m256 t2 = _mm256_unpacklo_ps(c, d), t3 = _mm256_unpackhi_ps(c, d);
  const __m256 t4 = _mm256_unpacklo_ps(e, f), t5 = _mm256_unpackhi_ps(e, f);
  const __m256 t6 = _mm256_unpacklo_ps(g, h), t7 = _mm256_unpackhi_ps(g, h);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 u1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 u3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 u5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 u7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
  a = _mm256_permute2f128_ps(u0, u4, 0x20);
  b = _mm256_permute2f128_ps(u1, u5, 0x20);
  c = _mm256_permute2f128_ps(u2, u6, 0x20);
  d = _mm256_permute2f128_ps(u3, u7, 0x20);
  e = _mm256_permute2f128_ps(u0, u4, 0x31);
  f = _mm256_permute2f128_ps(u1, u5, 0x31);
  g = _mm256_permute2f128_ps(u2, u6, 0x31);
  h = _mm256_permute2f128_ps(u3, u7, 0x31);
}

// Every cache line of a head's row (D f16 values) on its way to L1.
inline void prefetch_row(const uint16_t* row, int64_t D) {
  for (int64_t b = 0; b < 2 * D; b += 64) _mm_prefetch(reinterpret_cast<const char*>(row) + b, _MM_HINT_T0);
}

// The chunk's keys as kt[d * C + j] and values as vs[j * D + d], f32; zeros
// where `key[j]` is null (a position no row of the tile reads). With `ahead`
// (the next chunk's keys, then its values; null where not read), their rows
// are prefetched as this chunk's are read: a decode step's keys and values
// come from memory, and a chunk's hundred prefetches at once would stall on
// the core's few outstanding misses.
void load_chunk(const uint16_t* const* key, const uint16_t* const* value, int64_t D, float* kt, float* vs,
                const uint16_t* const* ahead) {
  const __m256 zero = _mm256_setzero_ps();
  for (int64_t j0 = 0; j0 < C; j0 += 8) {
    if (ahead)
      for (int64_t j = j0; j < j0 + 8; ++j)
        if (ahead[j]) prefetch_row(ahead[j], D), prefetch_row(ahead[C + j], D);
    for (int64_t d0 = 0; d0 < D; d0 += 8) {
      __m256 r[8];
      for (int i = 0; i < 8; ++i) r[i] = key[j0 + i] ? load_f16(key[j0 + i] + d0) : zero;
      transpose8(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7]);
      for (int i = 0; i < 8; ++i) _mm256_storeu_ps(kt + (d0 + i) * C + j0, r[i]);
    }
  }
  for (int64_t j = 0; j < C; ++j)
    for (int64_t d = 0; d < D; d += 8)
      _mm256_storeu_ps(vs + j * D + d, value[j] ? load_f16(value[j] + d) : zero);
}


// The int32 word at p (two int16 codes) in every lane, by a load-port broadcast.
inline __m256i broadcast_pair(const int16_t* p) {
  return _mm256_castps_si256(_mm256_broadcast_ss(reinterpret_cast<const float*>(p)));
}

// int32 lanes a and b as the int16 pairs (a_i, b_i) (both within int16).
inline __m256i pair16(__m256i a, __m256i b) {
  return _mm256_or_si256(_mm256_and_si256(a, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(b, 16));
}

// code_of on eight lanes: cvtps2dq (round to nearest even; NaN and out of
// range give INT32_MIN), clamped to [lo, hi].
inline __m256i codes8(__m256 x, __m256 id, __m256i lo, __m256i hi) {
  return _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(x, id)), lo), hi);
}

// The largest |x| of a row of n f16 values (n a multiple of 8), as a float:
// an f16's magnitude orders as its bits without the sign do.
inline float f16_amax(const uint16_t* row, int64_t n) {
  const __m128i magnitude = _mm_set1_epi16(0x7FFF);
  __m128i m = _mm_setzero_si128();
  for (int64_t d = 0; d < n; d += 8)
    m = _mm_max_epu16(m, _mm_and_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + d)), magnitude));
  m = _mm_max_epu16(m, _mm_srli_si128(m, 8));
  m = _mm_max_epu16(m, _mm_srli_si128(m, 4));
  m = _mm_max_epu16(m, _mm_srli_si128(m, 2));
  return _mm_cvtss_f32(_mm_cvtph_ps(m));
}

// An f16 row's step for codes up to cmax (0 for a row not read) at *step,
// and its inverse in every lane.
inline __m256 row_step(const uint16_t* row, int64_t D, int32_t cmax, float* step) {
  *step = row ? code_step(f16_amax(row, D), cmax) : 0.0f;
  return _mm256_set1_ps(code_inverse(*step));
}

// The chunk's keys and values coded straight from the cache's f16 rows
// (zeros where `key[j]` is null): key j's step at ks[j] and its codes as
// pairs of head elements, kc[(d / 2) * 2C + 2j + d % 2] (8 keys by 8 pairs
// turned with one 8 x 8 transpose of their 32-bit pairs); value j's step at
// vs_step[j] and its codes as pairs of keys, vc[(j / 2) * 2D + 2d + j % 2].
void load_chunk_codes(const uint16_t* const* key, const uint16_t* const* value, int64_t D, int32_t KQ, int16_t* kc,
                      float* ks, int16_t* vc, float* vs_step) {
  const __m256i klo = _mm256_set1_epi32(-KQ), khi = _mm256_set1_epi32(KQ);
  const __m256 zero = _mm256_setzero_ps();
  for (int64_t j0 = 0; j0 < C; j0 += 8) {
    __m256 id[8];
    for (int i = 0; i < 8; ++i) id[i] = row_step(key[j0 + i], D, KQ, ks + j0 + i);
    for (int64_t d0 = 0; d0 < D; d0 += 16) {
      // Row i: key j0 + i's elements d0..d0 + 15 as 8 pairs of codes.
      __m256 r[8];
      for (int i = 0; i < 8; ++i) {
        if (!key[j0 + i]) {
          r[i] = zero;
          continue;
        }
        const __m256i a = codes8(load_f16(key[j0 + i] + d0), id[i], klo, khi);
        const __m256i b = d0 + 8 < D ? codes8(load_f16(key[j0 + i] + d0 + 8), id[i], klo, khi) : _mm256_setzero_si256();
        // int32 lanes to int16, in order: elements d0..d0 + 15, two to a 32-bit pair.
        r[i] = _mm256_castsi256_ps(_mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8));
      }
      transpose8(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7]);
      for (int p = 0; p < 8 && d0 + 2 * p < D; ++p)
        _mm256_storeu_ps(reinterpret_cast<float*>(kc + (d0 + 2 * p) * C + 2 * j0), r[p]);
    }
  }
  const __m256i vlo = _mm256_set1_epi32(-kFastAttentionValueMax), vhi = _mm256_set1_epi32(kFastAttentionValueMax);
  for (int64_t j = 0; j < C; j += 2) {
    __m256 id[2];
    for (int k = 0; k < 2; ++k) id[k] = row_step(value[j + k], D, kFastAttentionValueMax, vs_step + j + k);
    for (int64_t d = 0; d < D; d += 8) {
      const __m256i a = value[j] ? codes8(load_f16(value[j] + d), id[0], vlo, vhi) : _mm256_setzero_si256();
      const __m256i b = value[j + 1] ? codes8(load_f16(value[j + 1] + d), id[1], vlo, vhi) : _mm256_setzero_si256();
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(vc + j * D + 2 * d), pair16(a, b));
    }
  }
}

// A query row's codes (D of them, up to KQ) and its step, as code_of gives them.
float code_query(const float* q, int64_t D, int32_t KQ, int16_t* qc) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 amax = _mm256_setzero_ps();
  for (int64_t d = 0; d < D; d += 8) amax = _mm256_max_ps(amax, _mm256_and_ps(_mm256_loadu_ps(q + d), abs_mask));
  const float step = code_step(hmax8(amax), KQ);
  const __m256 id = _mm256_set1_ps(code_inverse(step));
  const __m256i lo = _mm256_set1_epi32(-KQ), hi = _mm256_set1_epi32(KQ);
  for (int64_t d = 0; d < D; d += 8) {
    const __m256i c = codes8(_mm256_loadu_ps(q + d), id, lo, hi);
    // int32 lanes to int16, in order.
    const __m128i packed = _mm_packs_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qc + d), packed);
  }
  return step;
}

// Integer products run in blocks of kIntRows rows, each accumulator a named
// variable: with arrays of integer vectors GCC kept a copy of every
// accumulator on the stack, stored at each step. A block narrower than
// kIntRows repeats its last row (the repeat's sums are not stored).
constexpr int kIntRows = 5;
constexpr int kIntValueRows = 4;  // (five spilled one accumulator, a store-to-load chain every step)

// s[r][j0, j0 + 16) = float(sum_d qc[r][d] kc_j[d]) * (ks_j * qf[r]) for the
// block's n rows, 16 keys: one pair of key vectors (two head elements each) a
// step for five broadcast query pairs.
[[gnu::noinline]] void scores_block_int(const int16_t* const* qc_rows, const float* qf, int64_t n,
                                       const int16_t* kc, const float* ks, int64_t D, int64_t j0, float* const* s) {
  const int16_t* qc[kIntRows];
  block_rows<kIntRows>(qc_rows, n, qc);
  __m256i a00 = _mm256_setzero_si256(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00, a31 = a00,
          a40 = a00, a41 = a00;
  for (int64_t d = 0; d < D; d += 2) {
    const __m256i k0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kc + d * C + 2 * j0));
    const __m256i k1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kc + d * C + 2 * j0 + 16));
#define INFERD_SCORE_ROW(r)                                       \
  {                                                               \
    const __m256i x = broadcast_pair(qc[r] + d);                  \
    a##r##0 = _mm256_add_epi32(a##r##0, _mm256_madd_epi16(x, k0)); \
    a##r##1 = _mm256_add_epi32(a##r##1, _mm256_madd_epi16(x, k1)); \
  }
    INFERD_SCORE_ROW(0) INFERD_SCORE_ROW(1) INFERD_SCORE_ROW(2) INFERD_SCORE_ROW(3) INFERD_SCORE_ROW(4)
#undef INFERD_SCORE_ROW
  }
  const __m256i acc[kIntRows][2] = {{a00, a01}, {a10, a11}, {a20, a21}, {a30, a31}, {a40, a41}};
  const __m256 ks0 = _mm256_loadu_ps(ks + j0), ks1 = _mm256_loadu_ps(ks + j0 + 8);
  for (int64_t r = 0; r < n; ++r) {
    const __m256 f = _mm256_set1_ps(qf[r]);
    _mm256_storeu_ps(s[r] + j0, _mm256_mul_ps(_mm256_cvtepi32_ps(acc[r][0]), _mm256_mul_ps(ks0, f)));
    _mm256_storeu_ps(s[r] + j0 + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(acc[r][1]), _mm256_mul_ps(ks1, f)));
  }
}

// o[r][d] = fma(float(sum_j pc[r][j] vc_j[d]), ps[r], o * alpha[r]) over the
// chunk's 32 keys for the block's n rows, 16 head elements at a time: a pair
// of keys a step (a row's weight codes are 0 where it reads no value).
[[gnu::noinline]] void values_block_int(const int16_t* const* pc_rows, const float* ps, const float* alpha, int64_t n,
                                       const int16_t* vc, int64_t D, float* const* o) {
  const int16_t* pc[kIntValueRows];
  block_rows<kIntValueRows>(pc_rows, n, pc);
  for (int64_t d0 = 0; d0 < D; d0 += 16) {
    const bool two = d0 + 16 <= D;  // else the last 8 of a head size that is no multiple of 16
    __m256i a00 = _mm256_setzero_si256(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00, a31 = a00;
    for (int64_t j = 0; j < C; j += 2) {
      const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(vc + j * D + 2 * d0));
      const __m256i x1 = two ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(vc + j * D + 2 * d0 + 16))
                             : _mm256_setzero_si256();
#define INFERD_VALUE_ROW(r)                                        \
  {                                                                \
    const __m256i w = broadcast_pair(pc[r] + j);                   \
    a##r##0 = _mm256_add_epi32(a##r##0, _mm256_madd_epi16(w, x0)); \
    a##r##1 = _mm256_add_epi32(a##r##1, _mm256_madd_epi16(w, x1)); \
  }
      INFERD_VALUE_ROW(0) INFERD_VALUE_ROW(1) INFERD_VALUE_ROW(2) INFERD_VALUE_ROW(3)
#undef INFERD_VALUE_ROW
    }
    const __m256i acc[kIntValueRows][2] = {{a00, a01}, {a10, a11}, {a20, a21}, {a30, a31}};
    for (int64_t r = 0; r < n; ++r)
      for (int v = 0; v < (two ? 2 : 1); ++v) {
        float* at = o[r] + d0 + 8 * v;
        const __m256 scaled = _mm256_mul_ps(_mm256_loadu_ps(at), _mm256_set1_ps(alpha[r]));
        _mm256_storeu_ps(at, _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r][v]), _mm256_set1_ps(ps[r]), scaled));
      }
  }
}

// The chunk's scores: its two halves of 16 keys.
void scores_chunk_int(const int16_t* const* qc_rows, const float* qf, int64_t n, const int16_t* kc, const float* ks,
                      int64_t D, float* const* s) {
  scores_block_int(qc_rows, qf, n, kc, ks, D, 0, s);
  scores_block_int(qc_rows, qf, n, kc, ks, D, 16, s);
}

// attention_fast.h's online softmax over one chunk (FastSoftmaxChunk), row
// by row in four vectors of 8 positions: kInts, a prompt tile's (scores with
// their scale, weights coded after); else a decode part's, whose f32 scores
// are scaled here.
template <bool kInts>
void softmax_chunk(const FastSoftmaxChunk& c, float scale) {
  const __m256 iota = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
  __m256 value_step[4] = {};
  if constexpr (kInts)
    for (int v = 0; v < 4; ++v) value_step[v] = _mm256_loadu_ps(c.value_steps + 8 * v);
  int64_t a = 0;
  for (int64_t k = 0; k < c.n_active; ++k) {
    const int64_t i = c.active[k];
    // Lane j of vector v is valid when c0 + 8v + j is in [b, e): j in [b - c0 - 8v, e - c0 - 8v).
    __m256 valid[4];
    for (int v = 0; v < 4; ++v) {
      const __m256 jv = _mm256_add_ps(iota, _mm256_set1_ps(static_cast<float>(c.c0 + 8 * v)));
      valid[v] = _mm256_and_ps(_mm256_cmp_ps(jv, _mm256_set1_ps(static_cast<float>(c.pos_begin[i])), _CMP_GE_OQ),
                               _mm256_cmp_ps(jv, _mm256_set1_ps(static_cast<float>(c.pos_end[i])), _CMP_LT_OQ));
    }
    for (int64_t h = 0; h < c.n_heads; ++h, ++a) {
      const int64_t r = i * c.n_heads + h;
      float* s = c.s_rows[a];
      __m256 x[4];
      __m256 mx = _mm256_set1_ps(-INFINITY);
      for (int v = 0; v < 4; ++v) {
        x[v] = kInts ? _mm256_loadu_ps(s + 8 * v) : _mm256_mul_ps(_mm256_loadu_ps(s + 8 * v), _mm256_set1_ps(scale));
        mx = _mm256_max_ps(mx, _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), x[v], valid[v]));
      }
      const float m_new = std::max(c.m[r], hmax8(mx));
      // expf_poly's bits on eight lanes, without libm's ldexp call.
      // (e^0 is 1 exactly: no call while the maximum holds, most chunks of a long range.)
      c.alpha[a] = c.m[r] == -INFINITY ? 0.0f
                   : c.m[r] == m_new   ? 1.0f
                                       : _mm256_cvtss_f32(expf_poly_x8(_mm256_set1_ps(c.m[r] - m_new)));
      const __m256 mv = _mm256_set1_ps(m_new), floor = _mm256_set1_ps(kFastAttentionExpFloor);
      __m256 p[4];
      for (int v = 0; v < 4; ++v) {
        // Not below kFastAttentionExpFloor (e^x's quick path); 0 where invalid.
        const __m256 arg = _mm256_and_ps(_mm256_max_ps(_mm256_sub_ps(x[v], mv), floor), valid[v]);
        p[v] = _mm256_and_ps(expf_poly_x8(arg), valid[v]);
        _mm256_storeu_ps(s + 8 * v, p[v]);
      }
      float* lanes = c.lanes + r * 8;
      const __m256 sum4 = _mm256_add_ps(_mm256_add_ps(p[0], p[1]), _mm256_add_ps(p[2], p[3]));
      _mm256_storeu_ps(lanes, _mm256_fmadd_ps(_mm256_loadu_ps(lanes), _mm256_set1_ps(c.alpha[a]), sum4));
      c.m[r] = m_new;
      if constexpr (kInts) {
        // The weights times their values' steps (0 where not read), coded over the chunk.
        __m256 w[4];
        for (int v = 0; v < 4; ++v) w[v] = _mm256_and_ps(_mm256_mul_ps(p[v], value_step[v]), valid[v]);
        const float step =
            code_step(hmax8(_mm256_max_ps(_mm256_max_ps(w[0], w[1]), _mm256_max_ps(w[2], w[3]))), kFastAttentionWeightMax);
        c.weight_step[a] = step;
        const __m256 id = _mm256_set1_ps(code_inverse(step));
        const __m256i lo = _mm256_setzero_si256(), hi = _mm256_set1_epi32(kFastAttentionWeightMax);
        int16_t* pc = c.pc + a * C;
        for (int v = 0; v < 4; v += 2) {
          const __m256i codes = _mm256_packs_epi32(codes8(w[v], id, lo, hi), codes8(w[v + 1], id, lo, hi));
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(pc + 8 * v), _mm256_permute4x64_epi64(codes, 0xD8));
        }
      }
    }
  }
}

void softmax_chunk_int(const FastSoftmaxChunk& c) { softmax_chunk<true>(c, 0.0f); }

constexpr FastAttentionIntProducts kAvx2Products{scores_chunk_int, kIntRows, values_block_int, kIntValueRows,
                                                 softmax_chunk_int};

// s[r][0, 16) = the fma chains over d of q[r][d] * kt[d][j0 + j]: R rows by
// 16 keys, one key vector pair a step for R broadcast query elements.
template <int R>
[[gnu::always_inline]] inline void scores_block(const float* const* q, const float* kt, int64_t D, int64_t j0,
                                                float* const* s) {
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t d = 0; d < D; ++d) {
    const __m256 k0 = _mm256_loadu_ps(kt + d * C + j0), k1 = _mm256_loadu_ps(kt + d * C + j0 + 8);
    for (int r = 0; r < R; ++r) {
      const __m256 x = _mm256_broadcast_ss(q[r] + d);
      acc[r][0] = _mm256_fmadd_ps(x, k0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(x, k1, acc[r][1]);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(s[r] + j0, acc[r][0]);
    _mm256_storeu_ps(s[r] + j0 + 8, acc[r][1]);
  }
}

// o[r][d0, d0 + 8 NV) = o * alpha[r], then the fma chain over the chunk's
// keys j in [j0, j1) of p[r][j] * vs[j][d]: R rows by 8 NV head elements (NV
// 2, or 1 for the last 8 of a head size that is no multiple of 16). Only the
// rows' own positions: a value a row does not read never meets it (a zero
// weight times an infinite value would be NaN).
template <int R, int NV>
[[gnu::always_inline]] inline void values_block(const float* const* p, const float* alpha, const float* vs, int64_t D,
                                                int64_t d0, float* const* o, int64_t j0, int64_t j1) {
  __m256 acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_mul_ps(_mm256_loadu_ps(o[r] + d0 + 8 * v), _mm256_set1_ps(alpha[r]));
  for (int64_t j = j0; j < j1; ++j) {
    __m256 x[NV];
    for (int v = 0; v < NV; ++v) x[v] = _mm256_loadu_ps(vs + j * D + d0 + 8 * v);
    for (int r = 0; r < R; ++r) {
      const __m256 w = _mm256_broadcast_ss(p[r] + j);
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_fmadd_ps(w, x[v], acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) _mm256_storeu_ps(o[r] + d0 + 8 * v, acc[r][v]);
}

// Runs f.template operator()<R>(first) over `n` rows in blocks of kRows, the
// last block narrower.
template <typename F>
inline void each_row_block(int64_t n, F&& f) {
  int64_t r = 0;
  for (; r + kRows <= n; r += kRows) f.template operator()<kRows>(r);
  switch (n - r) {
    case 5: f.template operator()<5>(r); break;
    case 4: f.template operator()<4>(r); break;
    case 3: f.template operator()<3>(r); break;
    case 2: f.template operator()<2>(r); break;
    case 1: f.template operator()<1>(r); break;
    default: break;
  }
}

}  // namespace

void attend_heads_tile_fast_avx2(const AttentionTile& tile, int64_t n_heads, const PagedKV& kv, int64_t head_offset,
                                 int64_t D, float scale, const float* sinks, const FastAttentionState* parts) {
  attend_heads_tile_fast_with(kAvx2Products, tile, n_heads, kv, head_offset, D, scale, sinks, parts);
}

void attend_heads_tile_fast_with(const FastAttentionIntProducts& products, const AttentionTile& tile,
                                 int64_t n_heads, const PagedKV& kv, int64_t head_offset, int64_t D, float scale,
                                 const float* sinks, const FastAttentionState* parts) {
  assert(!(parts && (sinks || tile.n_tokens != 1)) && "parts: one token, no sinks (they join with the parts)");
  const int64_t T = tile.n_tokens, R = T * n_heads;
  if (T == 0) return;
  int64_t lo = tile.pos_begin[0], hi = tile.pos_end[0];
  for (int64_t i = 1; i < T; ++i) lo = std::min(lo, tile.pos_begin[i]), hi = std::max(hi, tile.pos_end[i]);

  // Scratch: the chunk's keys (transposed) and values, each row's scores or
  // weights, running outputs, maxima, lane sums and rescale factors.
  thread_local std::vector<float> scratch;
  const size_t need = static_cast<size_t>(2 * C * D + R * C + R * D + R * 8);
  if (scratch.size() < need) scratch.resize(need);
  float* kt = scratch.data();
  float* vs = kt + C * D;
  float* s_all = vs + C * D;
  float* o_all = s_all + R * C;
  float* lanes_all = o_all + R * D;
  thread_local std::vector<float> m, alpha;
  thread_local std::vector<const float*> q_rows, s_rows_c;
  thread_local std::vector<float*> s_rows, o_rows;
  m.resize(R), alpha.resize(R), q_rows.resize(R), s_rows.resize(R), s_rows_c.resize(R), o_rows.resize(R);
  // A prompt tile's integer products (attention_fast.h): the query rows'
  // codes and factors, the chunk's key and value codes and steps, and each
  // active row's weight codes and step.
  const bool ints = parts == nullptr;
  const int32_t KQ = fast_attention_key_max(D);
  thread_local std::vector<int16_t> codes;
  thread_local std::vector<float> q_factor, chunk_steps, weight_step;
  thread_local std::vector<const int16_t*> qc_rows, pc_rows;
  thread_local std::vector<float> qf_rows;
  int16_t *qc_all = nullptr, *kc = nullptr, *vc = nullptr, *pc_all = nullptr;
  if (ints) {
    const size_t n_codes = static_cast<size_t>(R * D + 2 * C * D + R * C);
    if (codes.size() < n_codes) codes.resize(n_codes);
    qc_all = codes.data(), kc = qc_all + R * D, vc = kc + C * D, pc_all = vc + C * D;
    q_factor.resize(R), chunk_steps.resize(2 * C), weight_step.resize(R);
    qc_rows.resize(R), pc_rows.resize(R), qf_rows.resize(R);
    for (int64_t i = 0; i < T; ++i)
      for (int64_t h = 0; h < n_heads; ++h) {
        const int64_t r = i * n_heads + h;
        q_factor[r] = code_query(tile.q + i * tile.q_stride + h * D, D, KQ, qc_all + r * D) * scale;
      }
  }
  float* ks = chunk_steps.data();
  float* vs_step = ks + C;
  std::fill(o_all, o_all + R * D, 0.0f);
  for (int64_t i = 0; i < T; ++i)
    for (int64_t h = 0; h < n_heads; ++h) {
      const int64_t r = i * n_heads + h;
      m[r] = sinks ? sinks[h] : -INFINITY;
      float* lanes = lanes_all + r * 8;
      std::fill(lanes, lanes + 8, 0.0f);
      lanes[0] = sinks ? 1.0f : 0.0f;
    }
  // With parts (one token, no sinks): the rows' states out as part `part`'s,
  // and the next part's from the start.
  int64_t part = 0;
  auto flush = [&] {
    std::copy(m.begin(), m.begin() + R, parts->m + part * R);
    std::copy(lanes_all, lanes_all + 8 * R, parts->lanes + 8 * part * R);
    std::copy(o_all, o_all + R * D, parts->o + part * R * D);
    ++part;
    std::fill(m.begin(), m.begin() + R, -INFINITY);
    std::fill(lanes_all, lanes_all + 8 * R, 0.0f);
    std::fill(o_all, o_all + R * D, 0.0f);
  };

  int64_t slots[C];
  const uint16_t* key[C];
  const uint16_t* value[C];
  const uint16_t* ahead[2 * C];  // the next chunk's keys, then its values (decode)
  thread_local std::vector<int64_t> active;  // tokens whose range meets the chunk
  active.reserve(T);
  for (int64_t c0 = lo / C * C; c0 < hi; c0 += C) {
    if (parts && c0 > lo / C * C && c0 % kFastDecodeSplit == 0) flush();
    active.clear();
    for (int64_t i = 0; i < T; ++i)
      if (tile.pos_begin[i] < c0 + C && tile.pos_end[i] > c0) active.push_back(i);
    if (active.empty()) continue;  // a gap between unrelated ranges
    // The positions some active token reads: their slots (the others stay unread: zeros).
    const int64_t first = std::max(c0, lo), last = std::min(c0 + C, hi);
    kv.f16_slots(first, last, slots + (first - c0));
    bool read[C] = {};
    for (int64_t i : active)
      for (int64_t j = std::max(tile.pos_begin[i], c0) - c0, j_end = std::min(tile.pos_end[i], c0 + C) - c0; j < j_end; ++j)
        read[j] = true;
    for (int64_t j = 0; j < C; ++j) {
      key[j] = read[j] ? kv.k_f16() + slots[j] + head_offset : nullptr;
      value[j] = read[j] ? kv.v_f16() + slots[j] + head_offset : nullptr;
    }
    // A decode step (parts) streams its range once, from memory: the next chunk's rows are prefetched.
    const bool prefetch = parts && c0 + C < hi;
    if (prefetch) {
      const int64_t next_end = std::min(c0 + 2 * C, hi);
      kv.f16_slots(c0 + C, next_end, slots);
      for (int64_t j = 0; j < C; ++j) {
        const bool next = c0 + C + j < next_end;
        ahead[j] = next ? kv.k_f16() + slots[j] + head_offset : nullptr;
        ahead[C + j] = next ? kv.v_f16() + slots[j] + head_offset : nullptr;
      }
    }
    if (ints)
      load_chunk_codes(key, value, D, KQ, kc, ks, vc, vs_step);
    else
      load_chunk(key, value, D, kt, vs, prefetch ? ahead : nullptr);

    // The active rows, token by token (a token's heads together).
    int64_t n = 0;
    for (int64_t i : active)
      for (int64_t h = 0; h < n_heads; ++h, ++n) {
        const int64_t r = i * n_heads + h;
        q_rows[n] = tile.q + i * tile.q_stride + h * D;
        s_rows[n] = s_all + r * C;
        s_rows_c[n] = s_rows[n];
        o_rows[n] = o_all + r * D;
        if (ints) {
          qc_rows[n] = qc_all + r * D;
          qf_rows[n] = q_factor[r];
          pc_rows[n] = pc_all + n * C;
        }
      }
    if (ints) {
      for (int64_t r0 = 0; r0 < n; r0 += products.score_rows) {
        const int64_t b = std::min<int64_t>(products.score_rows, n - r0);
        products.scores(qc_rows.data() + r0, qf_rows.data() + r0, b, kc, ks, D, s_rows.data() + r0);
      }
    } else {
      each_row_block(n, [&]<int B>(int64_t r0) {
        scores_block<B>(q_rows.data() + r0, kt, D, 0, s_rows.data() + r0);
        scores_block<B>(q_rows.data() + r0, kt, D, 16, s_rows.data() + r0);
      });
    }

    // The online softmax, row by row.
    FastSoftmaxChunk chunk;
    chunk.active = active.data(), chunk.n_active = static_cast<int64_t>(active.size());
    chunk.n_heads = n_heads, chunk.c0 = c0, chunk.pos_begin = tile.pos_begin, chunk.pos_end = tile.pos_end;
    chunk.s_rows = s_rows.data(), chunk.alpha = alpha.data(), chunk.pc = pc_all, chunk.weight_step = weight_step.data();
    chunk.m = m.data(), chunk.lanes = lanes_all, chunk.value_steps = vs_step;
    if (ints)
      products.softmax(chunk);
    else
      softmax_chunk<false>(chunk, scale);

    // The weighted values: rows of tokens that read the whole chunk in blocks
    // of kRows; a token that reads part of it (a causal tile's last chunk, a
    // window's first) has its heads take just its own positions.
    auto values = [&](int64_t n_rows, const float* const* p_rows, const float* alphas, float* const* out_rows,
                      int64_t j0, int64_t j1) {
      each_row_block(n_rows, [&]<int B>(int64_t r0) {
        int64_t d0 = 0;
        for (; d0 + 16 <= D; d0 += 16) values_block<B, 2>(p_rows + r0, alphas + r0, vs, D, d0, out_rows + r0, j0, j1);
        if (d0 < D) values_block<B, 1>(p_rows + r0, alphas + r0, vs, D, d0, out_rows + r0, j0, j1);
      });
    };
    if (ints) {
      // Every active row over the whole chunk: a weight code is 0 where its row reads no value.
      for (int64_t r0 = 0; r0 < n; r0 += products.value_rows) {
        const int64_t b = std::min<int64_t>(products.value_rows, n - r0);
        products.values(pc_rows.data() + r0, weight_step.data() + r0, alpha.data() + r0, b, vc, D,
                        o_rows.data() + r0);
      }
      continue;
    }
    int64_t n_whole = 0;  // rows of whole-chunk tokens, moved to the front
    int64_t a = 0;
    for (int64_t i : active) {
      const int64_t j0 = std::max(tile.pos_begin[i], c0) - c0, j1 = std::min(tile.pos_end[i], c0 + C) - c0;
      if (j0 == 0 && j1 == C) {
        for (int64_t h = 0; h < n_heads; ++h, ++a, ++n_whole) {
          s_rows_c[n_whole] = s_rows_c[a];
          alpha[n_whole] = alpha[a];
          o_rows[n_whole] = o_rows[a];
        }
      } else {
        values(n_heads, s_rows_c.data() + a, alpha.data() + a, o_rows.data() + a, j0, j1);
        a += n_heads;
      }
    }
    values(n_whole, s_rows_c.data(), alpha.data(), o_rows.data(), 0, C);
  }

  if (parts) {
    flush();
    return;
  }
  for (int64_t i = 0; i < T; ++i)
    for (int64_t h = 0; h < n_heads; ++h) {
      const int64_t r = i * n_heads + h;
      const __m256 inv = _mm256_set1_ps(1.0f / hsum8(_mm256_loadu_ps(lanes_all + r * 8)));
      float* out = tile.out + i * tile.out_stride + h * D;
      for (int64_t d = 0; d < D; d += 8) _mm256_storeu_ps(out + d, _mm256_mul_ps(_mm256_loadu_ps(o_all + r * D + d), inv));
    }
}

void join_fast_attention_states_avx2(const FastAttentionState& parts, int64_t n_parts, int64_t n_heads, int64_t D,
                                     const float* sinks, float* out) {
  join_states(
      parts, n_parts, n_heads, D, sinks, out,
      [D](float w, const float* part_o, float* o) {
        const __m256 wv = _mm256_set1_ps(w);
        for (int64_t d = 0; d < D; d += 8)
          _mm256_storeu_ps(o + d, _mm256_fmadd_ps(wv, _mm256_loadu_ps(part_o + d), _mm256_loadu_ps(o + d)));
      },
      [D](float inv, float* o) {
        const __m256 iv = _mm256_set1_ps(inv);
        for (int64_t d = 0; d < D; d += 8) _mm256_storeu_ps(o + d, _mm256_mul_ps(_mm256_loadu_ps(o + d), iv));
      });
}

}  // namespace inferd::kernels::detail
