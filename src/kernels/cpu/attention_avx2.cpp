// Attention with AVX2, FMA and F16C (compiled with -mavx2 -mfma -mf16c): the
// portable kernels of both flavours with FMA instructions, and a vector kernel
// for each: GGML's AVX2 build's (GgmlFlavour::kAvx2, v8) and its AVX-512
// build's arithmetic emulated with 8-lane halves (GgmlFlavour::kAvx512, v16).
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

// GGML's AVX-512 build's arithmetic (GgmlFlavour::kAvx512, attend_one_head_portable's
// bits) on AVX2: each of its 16-lane vectors is a pair of 8-lane halves (lo:
// lanes 0-7, hi: lanes 8-15) whose lanes follow the same FMA chains, and its
// 16-lane sums (reduce16: hi + lo, then the 8-lane movehl tree) are done on
// the halves in that order. F16C's conversions are exact (to f32) or round to
// nearest even (to f16), as the software ones.
namespace v16 {

using v8::cross;
using v8::kCrossOrder;
using v8::last;
using v8::load_f16;
using v8::mid_movehl;
using v8::reduce_movehl;
using v8::round_f16;

// expf_poly on eight lanes, to the bit (expf_poly8 is the AVX2 build's e^x,
// not this one). ldexp(j, n) is j * 2^n rounded once; for |n| > 126, where
// 2^n is no normal float, it is j * 2^(n -+ 100) (exact: normal) times
// 2^(+-100), again one rounding.
inline __m256 expf_poly_x8(__m256 x) {
  using namespace expf_poly_constants;
  const __m256 shift = _mm256_set1_ps(kShift);
  const __m256 n = _mm256_sub_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(kLog2e), shift), shift);
  const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x));
  const __m256 u = _mm256_mul_ps(b, b);
  const __m256 j = _mm256_fmadd_ps(
      _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(kC5), b, _mm256_set1_ps(kC4)), u,
                      _mm256_fmadd_ps(_mm256_set1_ps(kC3), b, _mm256_set1_ps(kC2))),
      u, _mm256_fmadd_ps(_mm256_set1_ps(kC1), b, _mm256_set1_ps(1.0f)));
  const __m256i ni = _mm256_cvtps_epi32(n);  // n is a whole number
  const __m256 abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), n);
  const __m256 big = _mm256_cmp_ps(abs_n, _mm256_set1_ps(126.0f), _CMP_GT_OQ);
  auto pow2 = [](__m256i e) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(127)), 23)); };
  if (_mm256_movemask_ps(big) == 0) return _mm256_mul_ps(j, pow2(ni));
  const __m256 neg = _mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ);
  const __m256i shift_by = _mm256_and_si256(_mm256_castps_si256(big),  // 100 (n < -126) or -100 (n > 126)
                                            _mm256_blendv_epi8(_mm256_set1_epi32(-100), _mm256_set1_epi32(100),
                                                               _mm256_castps_si256(neg)));
  const __m256 back = _mm256_blendv_ps(_mm256_set1_ps(1.0f),
                                       _mm256_blendv_ps(_mm256_set1_ps(0x1p100f), _mm256_set1_ps(0x1p-100f), neg), big);
  const __m256 res = _mm256_mul_ps(_mm256_mul_ps(j, pow2(_mm256_add_epi32(ni, shift_by))), back);
  const __m256 huge = _mm256_cmp_ps(abs_n, _mm256_set1_ps(192.0f), _CMP_GT_OQ);
  return _mm256_blendv_ps(res, _mm256_blendv_ps(_mm256_set1_ps(INFINITY), _mm256_setzero_ps(), neg), huge);
}

// z[h]: query head h's 16-lane dot-product accumulator with key k, as its
// two halves added (hi + lo, reduce16's first level; reduce_movehl of it is
// the score); zero for a null key (outside the range). A one-token step runs
// ggml_vec_dot_f16's four 16-lane accumulators over 64-element steps, folded
// (0+2)+(1+3): as halves, eight chains B_b over the 8-element blocks b of
// each step, lo = (B0+B4)+(B2+B6), hi = (B1+B5)+(B3+B7). Several tokens run
// tinyBLAS's one accumulator: lo over blocks 0, 2, 4..., hi over 1, 3, 5...
// q holds NH heads of 8 * NV floats.
template <int NH, int NV>
[[gnu::always_inline]] inline void key_dots(const float* q, const uint16_t* k, bool prefill, __m256* z) {
  constexpr int D = 8 * NV;
  if (k == nullptr) {
    for (int h = 0; h < NH; ++h) z[h] = _mm256_setzero_ps();
    return;
  }
  if (prefill) {
    __m256 lo[NH], hi[NH];
    for (int h = 0; h < NH; ++h) lo[h] = hi[h] = _mm256_setzero_ps();
    for (int j = 0; j < NV; j += 2) {
      const __m256 k0 = load_f16(k + 8 * j), k1 = load_f16(k + 8 * j + 8);
      for (int h = 0; h < NH; ++h) {
        lo[h] = _mm256_fmadd_ps(k0, _mm256_load_ps(q + h * D + 8 * j), lo[h]);
        hi[h] = _mm256_fmadd_ps(k1, _mm256_load_ps(q + h * D + 8 * j + 8), hi[h]);
      }
    }
    for (int h = 0; h < NH; ++h) z[h] = _mm256_add_ps(hi[h], lo[h]);
    return;
  }
  static_assert(NV % 8 == 0);
  auto chain = [&](int b, __m256* acc) __attribute__((always_inline)) {
    for (int h = 0; h < NH; ++h) acc[h] = _mm256_setzero_ps();
    for (int s = 0; s < NV / 8; ++s) {
      const __m256 kf = load_f16(k + 64 * s + 8 * b);
      for (int h = 0; h < NH; ++h) acc[h] = _mm256_fmadd_ps(kf, _mm256_load_ps(q + h * D + 64 * s + 8 * b), acc[h]);
    }
  };
  auto half = [&](int b0, __m256* y) __attribute__((always_inline)) {  // (B_b0 + B_b0+4) + (B_b0+2 + B_b0+6)
    __m256 a[NH], c[NH];
    chain(b0, a);
    chain(b0 + 4, c);
    for (int h = 0; h < NH; ++h) y[h] = _mm256_add_ps(a[h], c[h]);
    chain(b0 + 2, a);
    chain(b0 + 6, c);
    for (int h = 0; h < NH; ++h) y[h] = _mm256_add_ps(y[h], _mm256_add_ps(a[h], c[h]));
  };
  __m256 lo[NH], hi[NH];
  half(0, lo);
  half(1, hi);
  for (int h = 0; h < NH; ++h) z[h] = _mm256_add_ps(hi[h], lo[h]);
}

// Unscaled scores of an 8-position chunk: lane l of s[h] is head h's score of
// keys[l] (null: outside the range, 0 here); the movehl trees of the eight
// keys' hi + lo vectors, transposed (v8::cross).
template <int NH, int NV>
[[gnu::always_inline]] inline void chunk_scores(const float* q, const uint16_t* const* keys, bool prefill, __m256* s) {
  __m256 u[2][NH];
  for (int half = 0; half < 2; ++half) {
    __m256 t[2][NH];
    for (int pair = 0; pair < 2; ++pair) {
      const int* order = kCrossOrder + 4 * half + 2 * pair;
      __m256 z0[NH], z1[NH];
      key_dots<NH, NV>(q, keys[order[0]], prefill, z0);
      key_dots<NH, NV>(q, keys[order[1]], prefill, z1);
      for (int h = 0; h < NH; ++h) t[pair][h] = cross(z0[h], z1[h]);
    }
    for (int h = 0; h < NH; ++h) u[half][h] = mid_movehl(t[0][h], t[1][h]);
  }
  for (int h = 0; h < NH; ++h) s[h] = last(u[0][h], u[1][h]);
}

// The portable kernel's softmax on w[0, n) (n a multiple of 16, from a
// multiple of 16): e^(w - max) by expf_poly, the sum in double per 16-position
// chunk (reduce16), then the weights times 1 / sum, rounded to f16 (kRound).
template <bool kRound>
void softmax(float* w, int64_t n, float max) {
  const __m256 vmax = _mm256_set1_ps(max);
  double sum = 0;
  for (int64_t i = 0; i < n; i += 16) {
    const __m256 lo = expf_poly_x8(_mm256_sub_ps(_mm256_loadu_ps(w + i), vmax));
    const __m256 hi = expf_poly_x8(_mm256_sub_ps(_mm256_loadu_ps(w + i + 8), vmax));
    _mm256_storeu_ps(w + i, lo);
    _mm256_storeu_ps(w + i + 8, hi);
    sum += static_cast<double>(reduce_movehl(_mm256_add_ps(hi, lo)));
  }
  const __m256 inv = _mm256_set1_ps(static_cast<float>(1.0 / sum));
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 x = _mm256_mul_ps(_mm256_loadu_ps(w + i), inv);
    _mm256_storeu_ps(w + i, kRound ? round_f16(x) : x);
  }
}

// reduce16 lane-wise over sixteen vectors y(0..15) (column by column):
// (t6(0) + t6(2)) + (t6(1) + t6(3)), t6(i) = (y(i+12) + y(i+4)) + (y(i+8) + y(i)).
template <class Y>
[[gnu::always_inline]] inline __m256 fold16(const Y& y) {
  auto t6 = [&](int i) __attribute__((always_inline)) {
    return _mm256_add_ps(_mm256_add_ps(y(i + 12), y(i + 4)), _mm256_add_ps(y(i + 8), y(i)));
  };
  const __m256 u = _mm256_add_ps(t6(0), t6(2));
  return _mm256_add_ps(u, _mm256_add_ps(t6(1), t6(3)));
}

// NH query heads of 8 * NV columns over one key/value head; the arithmetic
// of attend_one_head_portable per head, with each key and value widened once
// for the NH heads.
template <int NH, int NV>
void attend_heads(const float* q_in, const PagedKV& kv, int64_t head_offset, int64_t pos_begin, int64_t pos_end,
                  float scale, AttentionPass pass, float* out) {
  constexpr int64_t D = 8 * NV;
  const bool prefill = pass == AttentionPass::kPrefill;
  thread_local std::vector<float> weights;
  thread_local std::vector<const uint16_t*> krow, vrow;
  alignas(32) float q[NH * D];
  for (int64_t i = 0; i < NH * D; i += 8) _mm256_store_ps(&q[i], round_f16(_mm256_loadu_ps(q_in + i)));

  // Scores over whole 16-position chunks from a multiple of 16, as the
  // softmax sums them; positions outside the range are masked.
  const int64_t c0 = pos_begin - pos_begin % 16;
  const int64_t n = (pos_end - c0 + 15) / 16 * 16;
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
  const __m256 ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  for (int h = 0; h < NH; ++h) vmax[h] = ninf;
  const __m256 vscale = _mm256_set1_ps(scale);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int64_t i = 0; i < n; i += 8) {
    const int64_t lo = std::max(c0 + i, pos_begin) - (c0 + i), hi = std::min(c0 + i + 8, pos_end) - (c0 + i);
    if (hi <= 0 || lo >= 8) {  // the chunk half before pos_begin or past pos_end
      for (int h = 0; h < NH; ++h) _mm256_storeu_ps(&weights[h * n + i], ninf);
      continue;
    }
    __m256 s[NH];
    chunk_scores<NH, NV>(q, &krow[i], prefill, s);
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

  // Weighted values. Position p goes into set p % 64 (one-token step: four
  // accumulators of 16 lanes) or p % 16 (tinyBLAS), summed in position order;
  // per block of CB * 8 columns each set is built in registers for the NH
  // heads, stored, and the sets folded as the portable kernel does.
  constexpr int CB = NH == 1 ? 4 : 2;
  static_assert(NV % CB == 0);
  const int64_t n_sets = prefill ? 16 : 64;
  alignas(32) float sets[NH][64][CB * 8];
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
        auto S = [&](int s) __attribute__((always_inline)) { return _mm256_load_ps(&sets[h][s][8 * c]); };
        __m256 r;
        if (prefill) {  // lane l is set l
          r = fold16(S);
        } else {  // lane l is (set l + set 32+l) + (set 16+l + set 48+l)
          r = fold16([&](int l) __attribute__((always_inline)) {
            return _mm256_add_ps(_mm256_add_ps(S(l), S(32 + l)), _mm256_add_ps(S(16 + l), S(48 + l)));
          });
        }
        _mm256_storeu_ps(out + h * D + col + 8 * c, r);
      }
    }
  }
}

// Up to four query heads at a time (build/attention_bench: with four heads
// per key/value head, faster than three and one by 20-30%).
template <int NV>
void attend_group(const float* q, int64_t n_heads, const PagedKV& kv, int64_t head_offset, int64_t pos_begin,
                  int64_t pos_end, float scale, AttentionPass pass, float* out) {
  constexpr int64_t D = 8 * NV;
  for (int64_t h = 0; h < n_heads;) {
    if (n_heads - h >= 4) {
      attend_heads<4, NV>(q + h * D, kv, head_offset, pos_begin, pos_end, scale, pass, out + h * D);
      h += 4;
    } else if (n_heads - h >= 3) {
      attend_heads<3, NV>(q + h * D, kv, head_offset, pos_begin, pos_end, scale, pass, out + h * D);
      h += 3;
    } else if (n_heads - h >= 2) {
      attend_heads<2, NV>(q + h * D, kv, head_offset, pos_begin, pos_end, scale, pass, out + h * D);
      h += 2;
    } else {
      attend_heads<1, NV>(q + h * D, kv, head_offset, pos_begin, pos_end, scale, pass, out + h * D);
      h += 1;
    }
  }
}

}  // namespace v16
}  // namespace

// GgmlFlavour::kAvx512 on AVX2: head sizes of 64, 128, 192 and 256 (whole
// 64-element steps, so no double tail) get the vector kernel; others run the
// portable one.
void attend_heads_avx2(const float* q, int64_t n_heads, const PagedKV& kv, int64_t head_offset, int64_t D,
                       int64_t pos_begin, int64_t pos_end, float scale, AttentionPass pass, float* out) {
  switch (D) {
    case 64: return v16::attend_group<8>(q, n_heads, kv, head_offset, pos_begin, pos_end, scale, pass, out);
    case 128: return v16::attend_group<16>(q, n_heads, kv, head_offset, pos_begin, pos_end, scale, pass, out);
    case 192: return v16::attend_group<24>(q, n_heads, kv, head_offset, pos_begin, pos_end, scale, pass, out);
    case 256: return v16::attend_group<32>(q, n_heads, kv, head_offset, pos_begin, pos_end, scale, pass, out);
    default:
      for (int64_t h = 0; h < n_heads; ++h)
        attend_one_head_fma(q + h * D, kv, head_offset, D, pos_begin, pos_end, scale, pass, out + h * D);
  }
}

void softmax_avx2(float* w, int64_t n) {
  float max = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) max = std::max(max, w[i]);
  v16::softmax<false>(w, n, max);
}

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
