// The fast tier's prefill attention with AVX2, FMA and F16C: attention_fast.h's
// arithmetic, to the bit, as register-blocked products. Per chunk of 32
// positions, for the whole tile: the keys turned to f32 and transposed (a row
// per head element, 32 keys wide), the values turned to f32; then scores for
// six query rows by sixteen keys at a time (12 accumulators, each key vector
// loaded once for six broadcast query elements), the online softmax row by
// row, and the weighted values for six rows by sixteen head elements.
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
      }
    each_row_block(n, [&]<int B>(int64_t r0) {
      scores_block<B>(q_rows.data() + r0, kt, D, 0, s_rows.data() + r0);
      scores_block<B>(q_rows.data() + r0, kt, D, 16, s_rows.data() + r0);
    });

    // The online softmax, row by row.
    const __m256 iota = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
    int64_t a = 0;
    for (int64_t i : active) {
      // Lane j of vector v is valid when c0 + 8v + j is in [b, e): j in [b - c0 - 8v, e - c0 - 8v).
      __m256 valid[4];
      for (int v = 0; v < 4; ++v) {
        const __m256 jv = _mm256_add_ps(iota, _mm256_set1_ps(static_cast<float>(c0 + 8 * v)));
        valid[v] = _mm256_and_ps(_mm256_cmp_ps(jv, _mm256_set1_ps(static_cast<float>(tile.pos_begin[i])), _CMP_GE_OQ),
                                 _mm256_cmp_ps(jv, _mm256_set1_ps(static_cast<float>(tile.pos_end[i])), _CMP_LT_OQ));
      }
      for (int64_t h = 0; h < n_heads; ++h, ++a) {
        const int64_t r = i * n_heads + h;
        float* s = s_rows[a];
        __m256 x[4];
        __m256 mx = _mm256_set1_ps(-INFINITY);
        for (int v = 0; v < 4; ++v) {
          x[v] = _mm256_mul_ps(_mm256_loadu_ps(s + 8 * v), _mm256_set1_ps(scale));
          mx = _mm256_max_ps(mx, _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), x[v], valid[v]));
        }
        const float m_new = std::max(m[r], hmax8(mx));
        // expf_poly's bits on eight lanes, without libm's ldexp call.
        // (e^0 is 1 exactly: no call while the maximum holds, most chunks of a long range.)
        alpha[a] = m[r] == -INFINITY ? 0.0f
                   : m[r] == m_new   ? 1.0f
                                     : _mm256_cvtss_f32(expf_poly_x8(_mm256_set1_ps(m[r] - m_new)));
        const __m256 mv = _mm256_set1_ps(m_new), floor = _mm256_set1_ps(kFastAttentionExpFloor);
        __m256 p[4];
        for (int v = 0; v < 4; ++v) {
          // Not below kFastAttentionExpFloor (e^x's quick path); 0 where invalid.
          const __m256 arg = _mm256_and_ps(_mm256_max_ps(_mm256_sub_ps(x[v], mv), floor), valid[v]);
          p[v] = _mm256_and_ps(expf_poly_x8(arg), valid[v]);
          _mm256_storeu_ps(s + 8 * v, p[v]);
        }
        float* lanes = lanes_all + r * 8;
        const __m256 sum4 = _mm256_add_ps(_mm256_add_ps(p[0], p[1]), _mm256_add_ps(p[2], p[3]));
        _mm256_storeu_ps(lanes, _mm256_fmadd_ps(_mm256_loadu_ps(lanes), _mm256_set1_ps(alpha[a]), sum4));
        m[r] = m_new;
      }
    }

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
    int64_t n_whole = 0;  // rows of whole-chunk tokens, moved to the front
    a = 0;
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
