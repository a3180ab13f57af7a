// Attention with AVX2, FMA and F16C (compiled with -mavx2 -mfma -mf16c): the
// portable kernels of both flavours with FMA instructions, and a vector kernel
// for each: GGML's AVX2 build's (GgmlFlavour::kAvx2, v8) and its AVX-512
// build's arithmetic emulated with 8-lane halves (GgmlFlavour::kAvx512, v16).
#include <immintrin.h>

#include <algorithm>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/cpu/attention_ggml_avx2_impl.h"
#include "kernels/cpu/attention_portable_impl.h"
#include "kernels/cpu/expf_poly.h"

namespace inferd::kernels::detail {

void attend_one_head_fma(const float* q, const PagedKV& kv, int64_t head_offset, int64_t D, int64_t pos_begin,
                         int64_t pos_end, float scale, AttentionPass pass, float* out, const float* sinks) {
  attend_one_head_portable(q, kv, head_offset, D, pos_begin, pos_end, scale, pass, out, sinks);
}

template <GgmlFlavour flavour>
void attend_latent_heads_fma(const float* q, int64_t n_heads, const PagedKV& kv, int64_t Dk, int64_t Dv,
                             int64_t pos_begin, int64_t pos_end, float scale, AttentionPass pass, float* out) {
  using Build = std::conditional_t<flavour == GgmlFlavour::kAvx2, ggml_avx2::Build, Avx512Build>;
  attend_latent_heads_of<Build>(q, n_heads, kv, Dk, Dv, pos_begin, pos_end, scale, pass, out);
}
template void attend_latent_heads_fma<GgmlFlavour::kAvx512>(const float*, int64_t, const PagedKV&, int64_t, int64_t,
                                                            int64_t, int64_t, float, AttentionPass, float*);
template void attend_latent_heads_fma<GgmlFlavour::kAvx2>(const float*, int64_t, const PagedKV&, int64_t, int64_t,
                                                          int64_t, int64_t, float, AttentionPass, float*);

void attend_one_head_ggml_avx2_fma(const float* q, const PagedKV& kv, int64_t head_offset, int64_t D,
                                   int64_t pos_begin, int64_t pos_end, float scale, AttentionPass pass, float* out, const float* sinks) {
  ggml_avx2::attend_one_head_portable(q, kv, head_offset, D, pos_begin, pos_end, scale, pass, out, sinks);
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

// GGML's AVX2 build (GgmlFlavour::kAvx2) for the shared kernel below: the
// arithmetic of ggml_avx2::attend_one_head_portable per head.
struct Build {
  static constexpr int kLanes = 8;  // lanes of GGML's vectors: positions per softmax chunk
  static constexpr int kMaxHeads = 2;  // query heads at a time (more would spill the score accumulators)

  template <int NH, int NV>
  [[gnu::always_inline]] static void key_dots(const float* q, const uint16_t* k, bool prefill, __m256* y) {
    v8::key_dots<NH, NV>(q, k, prefill, y);
  }
  // The scores' middle level: reduce8_movehl (tinyBLAS) or reduce8_hadd.
  [[gnu::always_inline]] static __m256 mid(__m256 t0, __m256 t1, bool prefill) {
    return prefill ? mid_movehl(t0, t1) : mid_hadd(t0, t1);
  }
  // e^(w - max) on one softmax chunk by expf_poly_avx2, stored; returns the chunk.
  [[gnu::always_inline]] static __m256 exp_chunk(float* w, __m256 vmax) {
    const __m256 e = expf_poly8(_mm256_sub_ps(_mm256_loadu_ps(w), vmax));
    _mm256_storeu_ps(w, e);
    return e;
  }
  // The value sets' lane sum over y(0..7), column by column: reduce8_movehl
  // (tinyBLAS's hsum) or reduce8_hadd (ggml_vec_dot_f16).
  template <class Y>
  [[gnu::always_inline]] static __m256 fold(const Y& y, bool prefill) {
    if (prefill)
      return _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(y(0), y(4)), _mm256_add_ps(y(2), y(6))),
                           _mm256_add_ps(_mm256_add_ps(y(1), y(5)), _mm256_add_ps(y(3), y(7))));
    return _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(y(0), y(4)), _mm256_add_ps(y(1), y(5))),
                         _mm256_add_ps(_mm256_add_ps(y(2), y(6)), _mm256_add_ps(y(3), y(7))));
  }
};

}  // namespace v8

// GGML's AVX-512 build's arithmetic (GgmlFlavour::kAvx512, attend_one_head_portable's
// bits) on AVX2: each of its 16-lane vectors is a pair of 8-lane halves (lo:
// lanes 0-7, hi: lanes 8-15) whose lanes follow the same FMA chains, and its
// 16-lane sums (reduce16: hi + lo, then the 8-lane movehl tree) are done on
// the halves in that order. F16C's conversions are exact (to f32) or round to
// nearest even (to f16), as the software ones.
namespace v16 {

using v8::load_f16;
using v8::mid_movehl;

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

// GGML's AVX-512 build (GgmlFlavour::kAvx512) for the shared kernel below:
// the arithmetic of attend_one_head_portable per head.
struct Build {
  static constexpr int kLanes = 16;  // lanes of GGML's vectors: positions per softmax chunk
  // Up to four query heads at a time (build/attention_bench: with four heads
  // per key/value head, faster than three and one by 20-30%).
  static constexpr int kMaxHeads = 4;

  template <int NH, int NV>
  [[gnu::always_inline]] static void key_dots(const float* q, const uint16_t* k, bool prefill, __m256* z) {
    v16::key_dots<NH, NV>(q, k, prefill, z);
  }
  // The scores are the movehl trees of the keys' hi + lo vectors.
  [[gnu::always_inline]] static __m256 mid(__m256 t0, __m256 t1, bool /*prefill*/) { return mid_movehl(t0, t1); }
  // e^(w - max) on one 16-position chunk by expf_poly, stored; returns its
  // hi + lo (reduce16's first level).
  [[gnu::always_inline]] static __m256 exp_chunk(float* w, __m256 vmax) {
    const __m256 lo = expf_poly_x8(_mm256_sub_ps(_mm256_loadu_ps(w), vmax));
    const __m256 hi = expf_poly_x8(_mm256_sub_ps(_mm256_loadu_ps(w + 8), vmax));
    _mm256_storeu_ps(w, lo);
    _mm256_storeu_ps(w + 8, hi);
    return _mm256_add_ps(hi, lo);
  }
  // The value sets' lane sum over y(0..15): reduce16 either way.
  template <class Y>
  [[gnu::always_inline]] static __m256 fold(const Y& y, bool /*prefill*/) {
    return fold16(y);
  }
};

}  // namespace v16

// The vector kernel of both flavours, K its build (v8::Build or v16::Build):
// GGML's vectors of K::kLanes lanes, each 8-lane half of them an __m256.

// Long-context decode (more than kLongDecodePositions) as the AVX-512
// kernel's (attention_avx512.cpp): keys prefetched kKeyPrefetch positions
// ahead, values summed a tile of kValueTile positions (a multiple of every
// flavour's 4L sets) at a time, the next tile prefetched.
constexpr int64_t kKeyPrefetch = 32;
constexpr int64_t kValueTile = 128;
constexpr int64_t kLongDecodePositions = 384;

// Unscaled scores of an 8-position chunk: lane l of s[h] is head h's score of
// keys[l] (null: outside the range, 0 here); the lane sums of the eight keys'
// vectors, transposed (v8::cross).
// ahead (null: none): eight keys to prefetch, one as each key is read.
template <class K, int NH, int NV>
[[gnu::always_inline]] inline void chunk_scores(const float* q, const uint16_t* const* keys,
                                                const uint16_t* const* ahead, bool prefill, __m256* s) {
  __m256 u[2][NH];
  for (int half = 0; half < 2; ++half) {
    __m256 t[2][NH];
    for (int pair = 0; pair < 2; ++pair) {
      const int* order = v8::kCrossOrder + 4 * half + 2 * pair;
      if (ahead != nullptr) {
        for (int x = 0; x < 2; ++x)
          if (const uint16_t* row = ahead[order[x]])
            for (int b = 0; b < 16 * NV; b += 64) _mm_prefetch(reinterpret_cast<const char*>(row) + b, _MM_HINT_T0);
      }
      __m256 y0[NH], y1[NH];
      K::template key_dots<NH, NV>(q, keys[order[0]], prefill, y0);
      K::template key_dots<NH, NV>(q, keys[order[1]], prefill, y1);
      for (int h = 0; h < NH; ++h) t[pair][h] = v8::cross(y0[h], y1[h]);
    }
    for (int h = 0; h < NH; ++h) u[half][h] = K::mid(t[0][h], t[1][h], prefill);
  }
  for (int h = 0; h < NH; ++h) s[h] = v8::last(u[0][h], u[1][h]);
}

// The softmax on w[0, n) (n a multiple of K::kLanes, from a multiple of it):
// e^(w - max), the sum in double per K::kLanes-position chunk (its movehl
// tree; a sink's term after it), then the weights times 1 / sum, rounded to f16
// (kRound). For
// v8::Build: ggml_avx2::softmax(_to_f16); for v16::Build: the portable
// kernel's.
template <class K, bool kRound>
void softmax(float* w, int64_t n, float max, const float* sink = nullptr) {
  max = max_with_sink(max, sink);
  const __m256 vmax = _mm256_set1_ps(max);
  double sum = 0;
  for (int64_t i = 0; i < n; i += K::kLanes) sum += static_cast<double>(v8::reduce_movehl(K::exp_chunk(w + i, vmax)));
  sum = add_sink(sum, sink, max);
  const __m256 inv = _mm256_set1_ps(static_cast<float>(1.0 / sum));
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 x = _mm256_mul_ps(_mm256_loadu_ps(w + i), inv);
    _mm256_storeu_ps(w + i, kRound ? v8::round_f16(x) : x);
  }
}

// The key and value rows of positions [begin, end) of the head at
// head_offset, at krow/vrow[p - c0] for n entries (null outside the range),
// stepping through the block table without a division per position.
void kv_rows(const PagedKV& kv, int64_t head_offset, int64_t begin, int64_t end, int64_t c0, int64_t n,
             std::vector<const uint16_t*>& krow, std::vector<const uint16_t*>& vrow) {
  krow.assign(static_cast<size_t>(n), nullptr);
  vrow.assign(static_cast<size_t>(n), nullptr);
  const int64_t block_elements = kv.block_bytes() / 2;
  for (int64_t p = begin, block = p / kv.block_size, offset = p % kv.block_size; p < end; ++p) {
    const int64_t slot = int64_t{kv.block_table[block]} * block_elements + offset * kv.slot_stride;
    krow[p - c0] = kv.k_f16() + slot + head_offset;
    vrow[p - c0] = kv.v_f16() + slot + head_offset;
    if (++offset == kv.block_size) offset = 0, ++block;
  }
}

template <class K>
void softmax_unrounded(float* w, int64_t n) {
  float max = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) max = std::max(max, w[i]);
  softmax<K, false>(w, n, max);
}

// NH query heads of 8 * NV columns over one key/value head; the arithmetic
// of K's portable kernel per head, with each key and value widened once for
// the NH heads.
template <class K, int NH, int NV>
void attend_heads(const float* q_in, const PagedKV& kv, int64_t head_offset, int64_t pos_begin, int64_t pos_end,
                  float scale, AttentionPass pass, float* out, const float* sinks) {
  constexpr int64_t D = 8 * NV;
  constexpr int64_t L = K::kLanes;
  const bool prefill = pass == AttentionPass::kPrefill;
  thread_local std::vector<float> weights;
  thread_local std::vector<float> acc;
  thread_local std::vector<const uint16_t*> krow, vrow;
  alignas(32) float q[NH * D];
  for (int64_t i = 0; i < NH * D; i += 8) _mm256_store_ps(&q[i], v8::round_f16(_mm256_loadu_ps(q_in + i)));

  // Scores over whole L-position chunks from a multiple of L, as GGML's
  // softmax sums them; positions outside the range are masked.
  const int64_t c0 = pos_begin - pos_begin % L;
  const int64_t n = (pos_end - c0 + L - 1) / L * L;
  kv_rows(kv, head_offset, pos_begin, pos_end, c0, n, krow, vrow);

  weights.resize(static_cast<size_t>(NH * n));
  // Decode past a few hundred positions reads its keys and values from
  // memory; shorter contexts stay in cache from step to step, where the
  // tiles' stores and the prefetches only cost (as the AVX-512 kernel's
  // register-fold path, up to 384 positions).
  const bool long_decode = !prefill && pos_end - pos_begin > kLongDecodePositions;
  __m256 vmax[NH];
  const __m256 ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  for (int h = 0; h < NH; ++h) vmax[h] = ninf;
  const __m256 vscale = _mm256_set1_ps(scale);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int64_t i = 0; i < n; i += 8) {
    const int64_t lo = std::max(c0 + i, pos_begin) - (c0 + i), hi = std::min(c0 + i + 8, pos_end) - (c0 + i);
    if (hi <= 0 || lo >= 8) {  // a chunk half before pos_begin or past pos_end (L = 16 only)
      for (int h = 0; h < NH; ++h) _mm256_storeu_ps(&weights[h * n + i], ninf);
      continue;
    }
    __m256 s[NH];
    // Long decode's keys come from memory: prefetched kKeyPrefetch positions
    // ahead (a short context's stay in cache from step to step).
    const uint16_t* const* ahead = long_decode && i + kKeyPrefetch + 8 <= n ? &krow[i + kKeyPrefetch] : nullptr;
    chunk_scores<K, NH, NV>(q, &krow[i], ahead, prefill, s);
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
    softmax<K, true>(&weights[h * n], n, _mm_cvtss_f32(m), sinks ? sinks + h : nullptr);
  }

  // Weighted values. Position p goes into set p % 4L (one-token step: four
  // accumulators of L lanes) or p % L (tinyBLAS), summed in position order;
  // per block of CB * 8 columns each set is built in registers for the NH
  // heads, stored, and the sets folded as K's portable kernel does.
  // A one-token step goes kValueTile positions at a time (the AVX-512
  // kernel's sum_value_lanes says why): each set is carried from tile to tile
  // through acc, the same additions in the same order, and each tile's
  // columns are prefetched a tile ahead as they are read.
  constexpr int CB = NH == 1 ? 4 : 2;
  static_assert(NV % CB == 0);
  const int64_t n_sets = prefill ? L : 4 * L;
  const int64_t P = pos_end - pos_begin, tile = long_decode ? kValueTile : P;
  // The sets of column block j / CB: [head][set][CB * 8 columns]; with one
  // tile, every column block is folded at once and reuses the first's sets
  // (16 KiB at most, in L1).
  const int64_t block_floats = NH * n_sets * CB * 8, n_blocks = P > tile ? NV / CB : 1;
  float* const sums = line_aligned(acc, static_cast<size_t>(n_blocks * block_floats));
  for (int64_t t0 = 0; t0 < P; t0 += tile) {
    const int64_t t1 = std::min(t0 + tile, P);
    for (int64_t j = 0; j < NV; j += CB) {
      const int64_t col = 8 * j;
      float* sets = sums + (n_blocks > 1 ? j / CB : 0) * block_floats;
      // The tile's positions of every set into sets: from zero in the first
      // tile (kFirst), prefetching the next tile's columns unless it is the
      // last (kPrefetch). Both are template constants: tested per set, they
      // cost a short context's decode 15-30%.
      auto sum_sets = [&](auto kFirst, auto kPrefetch) __attribute__((always_inline)) {
        for (int64_t set = 0; set < n_sets; ++set) {
          __m256 a[NH][CB];
          for (int h = 0; h < NH; ++h)
            for (int c = 0; c < CB; ++c)
              a[h][c] = kFirst ? _mm256_setzero_ps() : _mm256_loadu_ps(&sets[(h * n_sets + set) * CB * 8 + 8 * c]);
          // The set's first position in the tile.
          int64_t p = pos_begin + t0 + ((set - pos_begin - t0) % n_sets + n_sets) % n_sets;
          for (; p < pos_begin + t1; p += n_sets) {
            if (kPrefetch && p + tile < pos_end)
              _mm_prefetch(reinterpret_cast<const char*>(vrow[p + tile - c0] + col), _MM_HINT_T0);
            const uint16_t* v = vrow[p - c0] + col;
            for (int c = 0; c < CB; ++c) {
              const __m256 vf = v8::load_f16(v + 8 * c);
              for (int h = 0; h < NH; ++h)
                a[h][c] = _mm256_fmadd_ps(vf, _mm256_broadcast_ss(&weights[h * n + p - c0]), a[h][c]);
            }
          }
          for (int h = 0; h < NH; ++h)
            for (int c = 0; c < CB; ++c) _mm256_storeu_ps(&sets[(h * n_sets + set) * CB * 8 + 8 * c], a[h][c]);
        }
      };
      if (t0 == 0 && t1 == P) {
        sum_sets(std::true_type{}, std::false_type{});
      } else if (t0 == 0) {
        sum_sets(std::true_type{}, std::true_type{});
      } else {
        sum_sets(std::false_type{}, std::bool_constant<true>{});
      }
      if (t1 < P) continue;
      for (int h = 0; h < NH; ++h) {
        for (int c = 0; c < CB; ++c) {
          auto S = [&](int s) __attribute__((always_inline)) {
            return _mm256_loadu_ps(&sets[(h * n_sets + s) * CB * 8 + 8 * c]);
          };
          __m256 r;
          if (prefill) {  // lane l is set l
            r = K::fold(S, true);
          } else {  // lane l is (set l + set 2L+l) + (set L+l + set 3L+l)
            r = K::fold([&](int l) __attribute__((always_inline)) {
              return _mm256_add_ps(_mm256_add_ps(S(l), S(2 * L + l)), _mm256_add_ps(S(L + l), S(3 * L + l)));
            }, false);
          }
          _mm256_storeu_ps(out + h * D + col + 8 * c, r);
        }
      }
    }
  }
}

// n_heads query heads NH at a time, then the rest (fewer than NH) together.
template <class K, int NV, int NH = K::kMaxHeads>
void attend_group(const float* q, int64_t n_heads, const PagedKV& kv, int64_t head_offset, int64_t pos_begin,
                  int64_t pos_end, float scale, AttentionPass pass, float* out, const float* sinks) {
  constexpr int64_t D = 8 * NV;
  int64_t h = 0;
  for (; n_heads - h >= NH; h += NH)
    attend_heads<K, NH, NV>(q + h * D, kv, head_offset, pos_begin, pos_end, scale, pass, out + h * D,
                            sinks ? sinks + h : nullptr);
  if constexpr (NH > 1) {
    if (h < n_heads)
      attend_group<K, NV, NH - 1>(q + h * D, n_heads - h, kv, head_offset, pos_begin, pos_end, scale, pass,
                                  out + h * D, sinks ? sinks + h : nullptr);
  }
}

// Prefill tiles (attend_heads_tile) of either flavour, K its build: several
// query tokens of one sequence over one key/value head, each token's
// arithmetic attend_heads<K, ...>'s (kPrefill) step for step, only the loops
// between tokens reordered so that each 8-position half chunk of keys and each
// block of value rows is read from memory once for the tile and by the other
// tokens from L1 (attention_avx512.cpp's tile kernel's scheme):
//   scores  half chunk by half chunk, chunk_scores per token on its keys with
//           the positions outside the token's range null, then the same mask,
//           the same running max in the same order (a half chunk wholly
//           outside the range, L = 16 only, stored as -inf, no max). A row
//           (token, head) depends on its query and the keys only, so tokens
//           whose range holds the whole half are passed as heads of one call;
//   softmax softmax<K, true> per token and head over its own chunks;
//   values  lane s (p % L, tinyBLAS's lanes) of each token is the per-token
//           kernel's chain of fused multiply-adds in position order from +0,
//           cut into blocks of positions: the chain is stored and reloaded
//           between blocks (exact) and starts from zero at the lane's first
//           position in that token's range, so each token adds exactly its
//           own positions, no zero-weight products of others';
//   fold    K::fold per token, head and 8 columns; a lane the token's range
//           never reaches is +0, as the per-token kernel's zeroed set.
constexpr int64_t kTileMaxTokens = 16;  // tokens per call (the wrapper cuts larger tiles)
constexpr int64_t kTileMaxHeads = 8;    // query heads per call (the wrapper cuts larger groups)
// Bytes of value rows per block: 16 KiB stay in the 32 KiB L1 data cache
// while every token of the tile walks them.
constexpr int64_t kTileValueBytes = 16384;

// One token's chains of lane positions p0, p0 + L, ... < p1 for NH heads and
// CB * 8 columns from col: w + h * n head h's weights (indexed p - c0), acc +
// h * head_acc head h's lane (read unless `first`: the lane's first positions
// start from +0).
template <int L, int NH, int CB>
[[gnu::always_inline]] inline void tile_lane_walk(const uint16_t* const* vrow, int64_t c0, int64_t p0, int64_t p1,
                                                  int64_t col, bool first, const float* w, int64_t n, float* acc,
                                                  int64_t head_acc) {
  __m256 a[NH][CB];
  for (int h = 0; h < NH; ++h)
    for (int c = 0; c < CB; ++c)
      a[h][c] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(acc + h * head_acc + col + 8 * c);
  for (int64_t p = p0; p < p1; p += L) {
    const uint16_t* v = vrow[p - c0] + col;
    for (int c = 0; c < CB; ++c) {
      const __m256 vf = v8::load_f16(v + 8 * c);
      for (int h = 0; h < NH; ++h) a[h][c] = _mm256_fmadd_ps(vf, _mm256_broadcast_ss(&w[h * n + p - c0]), a[h][c]);
    }
  }
  for (int h = 0; h < NH; ++h)
    for (int c = 0; c < CB; ++c) _mm256_storeu_ps(acc + h * head_acc + col + 8 * c, a[h][c]);
}

// Scores of rows [r, r1) (D = 8 * NV floats apart in q) over 8 keys, NH rows
// a call, then the rest: s of each row to `store(row, s)`.
template <class K, int NV, int NH = K::kMaxHeads, class Store>
[[gnu::always_inline]] inline void tile_scores(const float* q, const uint16_t* const* keys, int64_t r, int64_t r1,
                                               const Store& store) {
  for (; r1 - r >= NH; r += NH) {
    __m256 s[NH];
    chunk_scores<K, NH, NV>(q + r * 8 * NV, keys, nullptr, true, s);
    for (int h = 0; h < NH; ++h) store(r + h, s[h]);
  }
  if constexpr (NH > 1) {
    if (r < r1) tile_scores<K, NV, NH - 1>(q, keys, r, r1, store);
  }
}

// G <= kTileMaxHeads query heads of 8 * NV columns, tile.n_tokens <=
// kTileMaxTokens tokens. Row r = i * G + h is token i's head h.
template <class K, int NV>
void attend_tile(const AttentionTile& tile, int64_t G, const PagedKV& kv, int64_t head_offset, float scale,
                 const float* sinks) {
  constexpr int64_t D = 8 * NV, L = K::kLanes;
  const int64_t T = tile.n_tokens, R = T * G;
  const int64_t* b = tile.pos_begin;
  const int64_t* e = tile.pos_end;
  int64_t B = b[0], E = e[0];  // the positions any token reads
  for (int64_t i = 1; i < T; ++i) B = std::min(B, b[i]), E = std::max(E, e[i]);
  thread_local std::vector<float> q_buf, weights, acc_buf, vmax_buf;
  thread_local std::vector<const uint16_t*> krow, vrow;
  float* q = line_aligned(q_buf, static_cast<size_t>(R * D));
  for (int64_t i = 0; i < T; ++i)
    for (int64_t d = 0; d < G * D; d += 8)
      _mm256_store_ps(q + i * G * D + d, v8::round_f16(_mm256_loadu_ps(tile.q + i * tile.q_stride + d)));

  // Key and value rows of [B, E), indexed p - c0 (null outside).
  const int64_t c0 = B - B % L;
  const int64_t n = (E - c0 + L - 1) / L * L;
  kv_rows(kv, head_offset, B, E, c0, n, krow, vrow);

  // Scores: row r's at weights[r * n + p - c0], over its token's chunks.
  weights.resize(static_cast<size_t>(R * n));
  const __m256 ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  float* vmax = line_aligned(vmax_buf, static_cast<size_t>(R * 8));  // row r's running max at vmax + 8 * r
  for (int64_t r = 0; r < R; ++r) _mm256_store_ps(vmax + 8 * r, ninf);
  const __m256 vscale = _mm256_set1_ps(scale);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int64_t ch = c0; ch < c0 + n; ch += 8) {
    const uint16_t* const* keys = &krow[ch - c0];
    for (int64_t i = 0; i < T;) {
      if (ch < b[i] - b[i] % L || ch >= (e[i] + L - 1) / L * L) {  // outside token i's chunks
        ++i;
        continue;
      }
      if (e[i] <= ch || b[i] >= ch + 8) {  // L = 16: a half of its chunk wholly outside its range
        for (int64_t r = i * G; r < (i + 1) * G; ++r) _mm256_storeu_ps(&weights[r * n + ch - c0], ninf);
        ++i;
        continue;
      }
      const int64_t lo = std::max(ch, b[i]) - ch, hi = std::min(ch + 8, e[i]) - ch;
      const __m256 valid = _mm256_castsi256_ps(_mm256_and_si256(
          _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(hi)), lane),
          _mm256_cmpgt_epi32(lane, _mm256_set1_epi32(static_cast<int>(lo) - 1))));
      auto store = [&](int64_t r, __m256 s) __attribute__((always_inline)) {
        s = _mm256_blendv_ps(ninf, _mm256_mul_ps(s, vscale), valid);
        _mm256_storeu_ps(&weights[r * n + ch - c0], s);
        _mm256_store_ps(vmax + 8 * r, _mm256_max_ps(_mm256_load_ps(vmax + 8 * r), s));
      };
      if (lo == 0 && hi == 8) {  // token i and the next ones that hold the whole half, together
        int64_t j = i + 1;
        while (j < T && b[j] <= ch && e[j] >= ch + 8) ++j;
        tile_scores<K, NV>(q, keys, i * G, j * G, store);
        i = j;
        continue;
      }
      const uint16_t* mine[8];  // token i's keys of the half, null outside its range
      for (int64_t l = 0; l < 8; ++l) mine[l] = l >= lo && l < hi ? keys[l] : nullptr;
      tile_scores<K, NV>(q, mine, i * G, (i + 1) * G, store);
      ++i;
    }
  }
  for (int64_t r = 0; r < R; ++r) {
    const int64_t i = r / G, h = r % G;
    const int64_t ci = b[i] - b[i] % L, ni = (e[i] - ci + L - 1) / L * L;
    const __m256 vm = _mm256_load_ps(vmax + 8 * r);
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(vm), _mm256_extractf128_ps(vm, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    softmax<K, true>(&weights[r * n + ci - c0], ni, _mm_cvtss_f32(m), sinks ? sinks + h : nullptr);
  }

  // Values: row r's lane s at acc + (r * L + s) * D.
  float* acc = line_aligned(acc_buf, static_cast<size_t>(R * L * D));
  constexpr int64_t VB = std::max(kTileValueBytes / (2 * D) / L * L, L);
  constexpr int CB = 4;
  static_assert(NV % CB == 0);
  for (int64_t blk = B - B % VB; blk < E; blk += VB) {
    for (int64_t i = 0; i < T; ++i) {
      const int64_t r0 = std::max(blk, b[i]), r1 = std::min(blk + VB, e[i]);
      if (r0 >= r1) continue;
      const float* w = &weights[i * G * n];
      for (int64_t s = 0; s < L; ++s) {
        const int64_t p0 = r0 + ((s - r0 % L) + L) % L;  // the lane's first position in the block
        if (p0 >= r1) continue;
        const bool first = p0 - b[i] < L;  // the lane's first in token i's range
        float* a = acc + (i * G * L + s) * D;
        for (int64_t col = 0; col < D; col += 8 * CB) {
          int64_t h = 0;
          for (; G - h >= 2; h += 2)
            tile_lane_walk<L, 2, CB>(vrow.data(), c0, p0, r1, col, first, w + h * n, n, a + h * L * D, L * D);
          if (h < G) tile_lane_walk<L, 1, CB>(vrow.data(), c0, p0, r1, col, first, w + h * n, n, a + h * L * D, L * D);
        }
      }
    }
  }
  for (int64_t i = 0; i < T; ++i) {
    const int64_t P = e[i] - b[i];  // lanes reached: all from L positions on
    for (int64_t h = 0; h < G; ++h) {
      const float* a = acc + (i * G + h) * L * D;
      for (int64_t col = 0; col < D; col += 8) {
        auto S = [&](int s) __attribute__((always_inline)) {
          return P >= L || ((s - b[i] % L) + L) % L < P ? _mm256_loadu_ps(a + s * D + col) : _mm256_setzero_ps();
        };
        _mm256_storeu_ps(tile.out + i * tile.out_stride + h * D + col, K::fold(S, true));
      }
    }
  }
}

// kTileMaxTokens tokens and kTileMaxHeads heads at a time.
template <class K, int NV>
void attend_tiles(const AttentionTile& tile, int64_t n_heads, const PagedKV& kv, int64_t head_offset, float scale,
                  const float* sinks) {
  constexpr int64_t D = 8 * NV;
  for (int64_t i0 = 0; i0 < tile.n_tokens; i0 += kTileMaxTokens) {
    for (int64_t h = 0; h < n_heads; h += kTileMaxHeads) {
      AttentionTile part = tile;
      part.q = tile.q + i0 * tile.q_stride + h * D;
      part.out = tile.out + i0 * tile.out_stride + h * D;
      part.n_tokens = std::min(kTileMaxTokens, tile.n_tokens - i0);
      part.pos_begin = tile.pos_begin + i0;
      part.pos_end = tile.pos_end + i0;
      attend_tile<K, NV>(part, std::min(kTileMaxHeads, n_heads - h), kv, head_offset, scale, sinks ? sinks + h : nullptr);
    }
  }
}

}  // namespace

// GgmlFlavour::kAvx512 on AVX2: head sizes of 64, 128, 192 and 256 (whole
// 64-element steps, so no double tail) get the vector kernel; others run the
// portable one.
void attend_heads_avx2(const float* q, int64_t n_heads, const PagedKV& kv, int64_t head_offset, int64_t D,
                       int64_t pos_begin, int64_t pos_end, float scale, AttentionPass pass, float* out, const float* sinks) {
  using v16::Build;
  switch (D) {
    case 64: return attend_group<Build, 8>(q, n_heads, kv, head_offset, pos_begin, pos_end, scale, pass, out, sinks);
    case 128: return attend_group<Build, 16>(q, n_heads, kv, head_offset, pos_begin, pos_end, scale, pass, out, sinks);
    case 192: return attend_group<Build, 24>(q, n_heads, kv, head_offset, pos_begin, pos_end, scale, pass, out, sinks);
    case 256: return attend_group<Build, 32>(q, n_heads, kv, head_offset, pos_begin, pos_end, scale, pass, out, sinks);
    default:
      for (int64_t h = 0; h < n_heads; ++h)
        attend_one_head_fma(q + h * D, kv, head_offset, D, pos_begin, pos_end, scale, pass, out + h * D, sinks ? sinks + h : nullptr);
  }
}

void softmax_avx2(float* w, int64_t n) { softmax_unrounded<v16::Build>(w, n); }

// Head sizes of 64, 128 and 256 get the vector kernel; others (and a one-token
// step whose head size is not a multiple of 32, which ends in a double tail)
// run the portable one.
void attend_heads_ggml_avx2(const float* q, int64_t n_heads, const PagedKV& kv, int64_t head_offset, int64_t D,
                            int64_t pos_begin, int64_t pos_end, float scale, AttentionPass pass, float* out, const float* sinks) {
  using v8::Build;
  switch (D) {
    case 64: return attend_group<Build, 8>(q, n_heads, kv, head_offset, pos_begin, pos_end, scale, pass, out, sinks);
    case 128: return attend_group<Build, 16>(q, n_heads, kv, head_offset, pos_begin, pos_end, scale, pass, out, sinks);
    case 256: return attend_group<Build, 32>(q, n_heads, kv, head_offset, pos_begin, pos_end, scale, pass, out, sinks);
    default:
      for (int64_t h = 0; h < n_heads; ++h)
        attend_one_head_ggml_avx2_fma(q + h * D, kv, head_offset, D, pos_begin, pos_end, scale, pass, out + h * D, sinks ? sinks + h : nullptr);
  }
}

void softmax_ggml_avx2(float* w, int64_t n) { softmax_unrounded<v8::Build>(w, n); }

// Head sizes of 64, 128, 192 and 256 get the tiled kernel (those attend_heads_avx2
// has a grouped kernel for); others go token by token.
void attend_heads_tile_avx2(const AttentionTile& tile, int64_t n_heads, const PagedKV& kv, int64_t head_offset,
                            int64_t D, float scale, const float* sinks) {
  switch (D) {
    case 64: return attend_tiles<v16::Build, 8>(tile, n_heads, kv, head_offset, scale, sinks);
    case 128: return attend_tiles<v16::Build, 16>(tile, n_heads, kv, head_offset, scale, sinks);
    case 192: return attend_tiles<v16::Build, 24>(tile, n_heads, kv, head_offset, scale, sinks);
    case 256: return attend_tiles<v16::Build, 32>(tile, n_heads, kv, head_offset, scale, sinks);
    default:
      for (int64_t i = 0; i < tile.n_tokens; ++i)
        attend_heads_avx2(tile.q + i * tile.q_stride, n_heads, kv, head_offset, D, tile.pos_begin[i],
                          tile.pos_end[i], scale, AttentionPass::kPrefill, tile.out + i * tile.out_stride, sinks);
  }
}

// Head sizes of 64, 128 and 256 get the tiled kernel (those attend_heads_ggml_avx2
// has a grouped kernel for); others go token by token.
void attend_heads_tile_ggml_avx2(const AttentionTile& tile, int64_t n_heads, const PagedKV& kv, int64_t head_offset,
                                 int64_t D, float scale, const float* sinks) {
  switch (D) {
    case 64: return attend_tiles<v8::Build, 8>(tile, n_heads, kv, head_offset, scale, sinks);
    case 128: return attend_tiles<v8::Build, 16>(tile, n_heads, kv, head_offset, scale, sinks);
    case 256: return attend_tiles<v8::Build, 32>(tile, n_heads, kv, head_offset, scale, sinks);
    default:
      for (int64_t i = 0; i < tile.n_tokens; ++i)
        attend_heads_ggml_avx2(tile.q + i * tile.q_stride, n_heads, kv, head_offset, D, tile.pos_begin[i],
                               tile.pos_end[i], scale, AttentionPass::kPrefill, tile.out + i * tile.out_stride, sinks);
  }
}

}  // namespace inferd::kernels::detail
