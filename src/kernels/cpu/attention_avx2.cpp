// Attention with AVX2, FMA and F16C (compiled with -mavx2 -mfma -mf16c): the
// portable kernels of both flavours with FMA instructions, and the AVX2 kernel
// of GGML's AVX2 build (GgmlFlavour::kAvx2).
#include <immintrin.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "kernels/cpu/attention_ggml_avx2_impl.h"
#include "kernels/cpu/attention_portable_impl.h"
#include "kernels/cpu/expf_poly.h"

namespace inferd::kernels::detail {

void attend_one_head_fma(const float* q, const PagedKV& kv, int64_t head_offset, int64_t D, int64_t pos_begin,
                         int64_t pos_end, float scale, AttentionPass pass, float* out) {
  attend_one_head_portable(q, kv, head_offset, D, pos_begin, pos_end, scale, pass, out);
}

void attend_one_head_ggml_avx2_fma(const float* q, const PagedKV& kv, int64_t head_offset, int64_t D,
                                   int64_t pos_begin, int64_t pos_end, float scale, AttentionPass pass, float* out) {
  ggml_avx2::attend_one_head_portable(q, kv, head_offset, D, pos_begin, pos_end, scale, pass, out);
}

namespace {
namespace v8 {

inline __m256 load_f16(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

inline __m256 round_f16(__m256 x) { return _mm256_cvtph_ps(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT)); }

// reduce8_movehl on one vector: tinyBLAS's hsum, the softmax's chunk sum.
inline float reduce_movehl(__m256 a) {
  __m128 t = _mm_add_ps(_mm256_extractf128_ps(a, 1), _mm256_castps256_ps128(a));
  t = _mm_add_ps(t, _mm_movehl_ps(t, t));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

// The two lane sums (reduce8_hadd, reduce8_movehl) of eight vectors at once:
// lane i of the result is the sum of the lanes of the i-th vector, by the
// same additions. Three levels, so that a caller can walk the tree as its
// inputs come: t = cross(y, y') holds y's half sums in the low 128 bits and
// y''s in the high ones; mid_* pairs two of those; last pairs two of those.
// The inputs must come in the order p0, p4, p1, p5, p2, p6, p3, p7 for lane i
// to hold the sum of p_i (kCrossOrder).
constexpr int kCrossOrder[8] = {0, 4, 1, 5, 2, 6, 3, 7};
inline __m256 cross(__m256 a, __m256 b) {
  return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}
inline __m256 mid_hadd(__m256 t0, __m256 t1) { return _mm256_hadd_ps(t0, t1); }  // t[0]+t[1], t[2]+t[3]
inline __m256 mid_movehl(__m256 t0, __m256 t1) {                                   // t[0]+t[2], t[1]+t[3]
  return _mm256_add_ps(_mm256_shuffle_ps(t0, t1, _MM_SHUFFLE(1, 0, 1, 0)), _mm256_shuffle_ps(t0, t1, _MM_SHUFFLE(3, 2, 3, 2)));
}
inline __m256 last(__m256 u0, __m256 u1) { return _mm256_hadd_ps(u0, u1); }

// y[h]: query head h's dot-product vector with key k (zero for a null key,
// outside the range), before the lane sum: ggml_vec_dot_f16's four
// accumulators over 32-element steps folded (0+2)+(1+3) for a one-token step,
// tinyBLAS's one accumulator otherwise. q holds NH heads of 8 * NV floats.
template <int NH, int NV>
[[gnu::always_inline]] inline void key_dots(const float* q, const uint16_t* k, bool prefill, __m256* y) {
  if (k == nullptr) {
    for (int h = 0; h < NH; ++h) y[h] = _mm256_setzero_ps();
    return;
  }
  if (prefill) {
    __m256 c[NH];
    for (int h = 0; h < NH; ++h) c[h] = _mm256_setzero_ps();
    for (int j = 0; j < NV; ++j) {
      const __m256 kf = load_f16(k + 8 * j);
      for (int h = 0; h < NH; ++h) c[h] = _mm256_fmadd_ps(kf, _mm256_load_ps(q + h * 8 * NV + 8 * j), c[h]);
    }
    for (int h = 0; h < NH; ++h) y[h] = c[h];
  } else {
    static_assert(NV % 4 == 0);
    __m256 s[NH][4];
    for (int h = 0; h < NH; ++h)
      for (int a = 0; a < 4; ++a) s[h][a] = _mm256_setzero_ps();
    for (int j = 0; j < NV; j += 4)
      for (int a = 0; a < 4; ++a) {
        const __m256 kf = load_f16(k + 8 * (j + a));
        for (int h = 0; h < NH; ++h) s[h][a] = _mm256_fmadd_ps(kf, _mm256_load_ps(q + h * 8 * NV + 8 * (j + a)), s[h][a]);
      }
    for (int h = 0; h < NH; ++h) y[h] = _mm256_add_ps(_mm256_add_ps(s[h][0], s[h][2]), _mm256_add_ps(s[h][1], s[h][3]));
  }
}

// Unscaled scores of an 8-position chunk: lane l of s[h] is head h's score of
// keys[l] (null: outside the range, 0 here).
template <int NH, int NV>
[[gnu::always_inline]] inline void chunk_scores(const float* q, const uint16_t* const* keys, bool prefill, __m256* s) {
  __m256 u[2][NH];
  for (int half = 0; half < 2; ++half) {
    __m256 t[2][NH];
    for (int pair = 0; pair < 2; ++pair) {
      const int* order = kCrossOrder + 4 * half + 2 * pair;
      __m256 y0[NH], y1[NH];
      key_dots<NH, NV>(q, keys[order[0]], prefill, y0);
      key_dots<NH, NV>(q, keys[order[1]], prefill, y1);
      for (int h = 0; h < NH; ++h) t[pair][h] = cross(y0[h], y1[h]);
    }
    for (int h = 0; h < NH; ++h) u[half][h] = prefill ? mid_movehl(t[0][h], t[1][h]) : mid_hadd(t[0][h], t[1][h]);
  }
  for (int h = 0; h < NH; ++h) s[h] = last(u[0][h], u[1][h]);
}

// ggml_avx2::softmax_to_f16 (or softmax, without the rounding) on w[0, n).
template <bool kRound>
void softmax(float* w, int64_t n, float max) {
  const __m256 vmax = _mm256_set1_ps(max);
  double sum = 0;
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 e = expf_poly8(_mm256_sub_ps(_mm256_loadu_ps(w + i), vmax));
    _mm256_storeu_ps(w + i, e);
    sum += static_cast<double>(reduce_movehl(e));
  }
  const __m256 inv = _mm256_set1_ps(static_cast<float>(1.0 / sum));
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 x = _mm256_mul_ps(_mm256_loadu_ps(w + i), inv);
    _mm256_storeu_ps(w + i, kRound ? round_f16(x) : x);
  }
}

// NH query heads of 8 * NV columns over one key/value head; the arithmetic
// of ggml_avx2::attend_one_head_portable per head, with each key and value
// widened once for the NH heads.
template <int NH, int NV>
void attend_heads(const float* q_in, const PagedKV& kv, int64_t head_offset, int64_t pos_begin, int64_t pos_end,
                  float scale, AttentionPass pass, float* out) {
  constexpr int64_t D = 8 * NV;
  const bool prefill = pass == AttentionPass::kPrefill;
  thread_local std::vector<float> weights;
  thread_local std::vector<const uint16_t*> krow, vrow;
  alignas(32) float q[NH * D];
  for (int64_t i = 0; i < NH * D; i += 8) _mm256_store_ps(&q[i], round_f16(_mm256_loadu_ps(q_in + i)));

  // Chunks of 8 positions from a multiple of 8, as GGML's softmax takes them.
  const int64_t c0 = pos_begin - pos_begin % 8;
  const int64_t n = (pos_end - c0 + 7) / 8 * 8;
  krow.assign(static_cast<size_t>(n), nullptr);
  vrow.assign(static_cast<size_t>(n), nullptr);
  for (int64_t p = pos_begin, block = p / kv.block_size, offset = p % kv.block_size; p < pos_end; ++p) {
    const int64_t slot = int64_t{kv.block_table[block]} * kv.block_size + offset;
    krow[p - c0] = kv.k + slot * kv.slot_stride + head_offset;
    vrow[p - c0] = kv.v + slot * kv.slot_stride + head_offset;
    if (++offset == kv.block_size) offset = 0, ++block;
  }

  weights.resize(static_cast<size_t>(NH * n));
  __m256 vmax[NH];
  for (int h = 0; h < NH; ++h) vmax[h] = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  const __m256 vscale = _mm256_set1_ps(scale), ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int64_t i = 0; i < n; i += 8) {
    __m256 s[NH];
    chunk_scores<NH, NV>(q, &krow[i], prefill, s);
    const int64_t lo = std::max(c0 + i, pos_begin) - (c0 + i), hi = std::min(c0 + i + 8, pos_end) - (c0 + i);
    const __m256 valid = _mm256_castsi256_ps(_mm256_and_si256(
        _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(hi)), lane),
        _mm256_cmpgt_epi32(lane, _mm256_set1_epi32(static_cast<int>(lo) - 1))));
    for (int h = 0; h < NH; ++h) {
      s[h] = _mm256_blendv_ps(ninf, _mm256_mul_ps(s[h], vscale), valid);
      _mm256_storeu_ps(&weights[h * n + i], s[h]);
      vmax[h] = _mm256_max_ps(vmax[h], s[h]);
    }
  }
  for (int h = 0; h < NH; ++h) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(vmax[h]), _mm256_extractf128_ps(vmax[h], 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    softmax<true>(&weights[h * n], n, _mm_cvtss_f32(m));
  }

  // Weighted values. Position p goes into set p % 32 (one-token step) or p % 8
  // (tinyBLAS), summed in position order; per block of CB * 8 columns each
  // set is built in registers for the NH heads, stored, and the sets folded as
  // GGML's lane sums do.
  constexpr int CB = NH == 1 ? 4 : 2;
  static_assert(NV % CB == 0);
  const int64_t n_sets = prefill ? 8 : 32;
  alignas(32) float sets[NH][32][CB * 8];
  for (int64_t j = 0; j < NV; j += CB) {
    const int64_t col = 8 * j;
    for (int64_t set = 0; set < n_sets; ++set) {
      __m256 a[NH][CB];
      for (int h = 0; h < NH; ++h)
        for (int c = 0; c < CB; ++c) a[h][c] = _mm256_setzero_ps();
      int64_t p = pos_begin + ((set - pos_begin) % n_sets + n_sets) % n_sets;  // first position of the set
      for (; p < pos_end; p += n_sets) {
        const uint16_t* v = vrow[p - c0] + col;
        for (int c = 0; c < CB; ++c) {
          const __m256 vf = load_f16(v + 8 * c);
          for (int h = 0; h < NH; ++h)
            a[h][c] = _mm256_fmadd_ps(vf, _mm256_broadcast_ss(&weights[h * n + p - c0]), a[h][c]);
        }
      }
      for (int h = 0; h < NH; ++h)
        for (int c = 0; c < CB; ++c) _mm256_store_ps(&sets[h][set][8 * c], a[h][c]);
    }
    for (int h = 0; h < NH; ++h) {
      for (int c = 0; c < CB; ++c) {
        auto S = [&](int s) { return _mm256_load_ps(&sets[h][s][8 * c]); };
        __m256 r;
        if (prefill) {  // reduce8_movehl over the 8 sets
          r = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(S(0), S(4)), _mm256_add_ps(S(2), S(6))),
                            _mm256_add_ps(_mm256_add_ps(S(1), S(5)), _mm256_add_ps(S(3), S(7))));
        } else {  // lanes y_l = (l + 16+l) + (8+l + 24+l), then reduce8_hadd
          __m256 y[8];
          for (int l = 0; l < 8; ++l) y[l] = _mm256_add_ps(_mm256_add_ps(S(l), S(16 + l)), _mm256_add_ps(S(8 + l), S(24 + l)));
          r = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(y[0], y[4]), _mm256_add_ps(y[1], y[5])),
                            _mm256_add_ps(_mm256_add_ps(y[2], y[6]), _mm256_add_ps(y[3], y[7])));
        }
        _mm256_storeu_ps(out + h * D + col + 8 * c, r);
      }
    }
  }
}

// Two query heads at a time (more would spill the score accumulators).
template <int NV>
void attend_group(const float* q, int64_t n_heads, const PagedKV& kv, int64_t head_offset, int64_t pos_begin,
                  int64_t pos_end, float scale, AttentionPass pass, float* out) {
  constexpr int64_t D = 8 * NV;
  for (int64_t h = 0; h < n_heads;) {
    if (n_heads - h >= 2) {
      attend_heads<2, NV>(q + h * D, kv, head_offset, pos_begin, pos_end, scale, pass, out + h * D);
      h += 2;
    } else {
      attend_heads<1, NV>(q + h * D, kv, head_offset, pos_begin, pos_end, scale, pass, out + h * D);
      h += 1;
    }
  }
}

}  // namespace v8
}  // namespace

// Head sizes of 64, 128 and 256 get the vector kernel; others (and a one-token
// step whose head size is not a multiple of 32, which ends in a double tail)
// run the portable one.
void attend_heads_ggml_avx2(const float* q, int64_t n_heads, const PagedKV& kv, int64_t head_offset, int64_t D,
                            int64_t pos_begin, int64_t pos_end, float scale, AttentionPass pass, float* out) {
  switch (D) {
    case 64: return v8::attend_group<8>(q, n_heads, kv, head_offset, pos_begin, pos_end, scale, pass, out);
    case 128: return v8::attend_group<16>(q, n_heads, kv, head_offset, pos_begin, pos_end, scale, pass, out);
    case 256: return v8::attend_group<32>(q, n_heads, kv, head_offset, pos_begin, pos_end, scale, pass, out);
    default:
      for (int64_t h = 0; h < n_heads; ++h)
        attend_one_head_ggml_avx2_fma(q + h * D, kv, head_offset, D, pos_begin, pos_end, scale, pass, out + h * D);
  }
}

void softmax_ggml_avx2(float* w, int64_t n) {
  float max = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) max = std::max(max, w[i]);
  v8::softmax<false>(w, n, max);
}

}  // namespace inferd::kernels::detail
