// AVX-512 attention, GGML's arithmetic (attention.h): f16 keys and values are
// widened 16 at a time; scores and softmax weights in 16-position chunks; the
// weighted values summed per position lane into L1-resident partial sums.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_portable_impl.h"
#include "kernels/cpu/expf_poly.h"
#include "kernels/cpu/lanes_avx512.h"

namespace inferd::kernels::detail {

namespace {

// How far ahead (positions) decode's scores prefetch their keys: a block's
// rows are a slot apart and the blocks scattered, which the hardware
// prefetchers do not follow at long context. Each key's lines are asked for as a key is
// used, not a chunk's at once: a burst of a hundred prefetches stalls on the
// core's few outstanding misses.
constexpr int64_t kKeyPrefetch = 32;

// The prefetch is an asm statement, not _mm_prefetch: GCC 12 emitted no
// prefetch at all in attend_heads_avx512<4, 16> (the kernel of Qwen3.5-4B's
// four query heads a key/value head) from the intrinsic, and cold decode
// attention ran at half the speed it does with them (attention_bench --cold,
// docs/benchmarks.md). A volatile asm statement the compiler must keep.
inline void prefetch_lines(const void* p, int64_t bytes) {
  for (int64_t b = 0; b < bytes; b += 64) asm volatile("prefetcht0 %0" : : "m"(static_cast<const char*>(p)[b]));
}

inline __m512 load_f16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

inline __m512 round_f16(__m512 x) { return _mm512_cvtph_ps(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT)); }

// GGML's fold of a 16-lane accumulator into one sum, _mm512_reduce_add_ps's
// tree, run lane-wise on sixteen vectors: out = (t6[0] + t6[2]) + (t6[1] +
// t6[3]) with t6[i] = (y[i+12] + y[i+4]) + (y[i+8] + y[i]). lane(l, y) gives
// y_l of each of NH heads; lanes are asked for in the tree's order, so only a
// few vectors per head are live at a time.
template <int NH, class Lane>
[[gnu::always_inline]] inline void fold_lanes(const Lane& lane, __m512* out) {
  auto t6 = [&](int64_t i, __m512* t) __attribute__((always_inline)) {
    __m512 y0[NH], y1[NH];
    lane(i + 12, y0);
    lane(i + 4, y1);
    for (int h = 0; h < NH; ++h) t[h] = _mm512_add_ps(y0[h], y1[h]);
    lane(i + 8, y0);
    lane(i, y1);
    for (int h = 0; h < NH; ++h) t[h] = _mm512_add_ps(t[h], _mm512_add_ps(y0[h], y1[h]));
  };
  __m512 u[NH], v[NH], t[NH];
  t6(0, u);
  t6(2, t);
  for (int h = 0; h < NH; ++h) u[h] = _mm512_add_ps(u[h], t[h]);
  t6(1, v);
  t6(3, t);
  for (int h = 0; h < NH; ++h) out[h] = _mm512_add_ps(u[h], _mm512_add_ps(v[h], t[h]));
}

// Decode's lanes: GGML's four 16-lane accumulators hold 64 position sets, and
// lane l is (set l + set 32+l) + (set 16+l + set 48+l). set(s, sum) gives set s
// of each of NH heads.
template <int NH, class Set>
struct DecodeLanes {
  const Set& set;
  [[gnu::always_inline]] void operator()(int64_t l, __m512* y) const {
    __m512 a[NH], b[NH];
    set(l, a);
    set(32 + l, b);
    for (int h = 0; h < NH; ++h) y[h] = _mm512_add_ps(a[h], b[h]);
    set(16 + l, a);
    set(48 + l, b);
    for (int h = 0; h < NH; ++h) y[h] = _mm512_add_ps(y[h], _mm512_add_ps(a[h], b[h]));
  }
};

// out[0, D) from the weighted values' partial sums (sets of D floats, one per
// position lane: 16 for a prefill pass, 64 for decode, folded as GGML does).
// Only the sets in `reached` (bit s: set s) were written; the others count as
// zero, added like GGML's zero lanes but not read from memory (short contexts
// reach few of the 64 sets).
template <bool kAllReached>
void fold_sets(const float* acc, int64_t D, bool prefill, uint64_t reached, float* out) {
  for (int64_t j = 0; j < D / 16; ++j) {
    auto set = [&](int64_t s, __m512* sum) __attribute__((always_inline)) {
      sum[0] = kAllReached || (reached >> s & 1) ? _mm512_loadu_ps(acc + s * D + 16 * j) : _mm512_setzero_ps();
    };
    __m512 result;
    if (prefill) {
      fold_lanes<1>(set, &result);
    } else {
      fold_lanes<1>(DecodeLanes<1, decltype(set)>{set}, &result);
    }
    _mm512_storeu_ps(out + 16 * j, result);
  }
}

void fold_partial_sums(const float* acc, int64_t D, bool prefill, uint64_t reached, float* out) {
  const uint64_t all = prefill ? 0xFFFF : ~uint64_t{0};
  if ((reached & all) == all) {
    fold_sets<true>(acc, D, prefill, reached, out);
  } else {
    fold_sets<false>(acc, D, prefill, reached, out);
  }
}

// The sets (bits, as fold_partial_sums takes them) that positions
// [pos_begin, pos_begin + used) reach, position p being in set p % n_sets:
// a run of `used` bits from bit pos_begin % n_sets, wrapping at n_sets.
uint64_t sets_reached(int64_t pos_begin, int64_t used, int64_t n_sets) {
  const uint64_t all = n_sets == 64 ? ~uint64_t{0} : (uint64_t{1} << n_sets) - 1;
  if (used >= n_sets) return all;
  const uint64_t run = (uint64_t{1} << used) - 1;
  const int64_t first = pos_begin % n_sets;
  return ((run << first) | (first > 0 ? run >> (n_sets - first) : 0)) & all;
}

// Scores w[0, n) (n a multiple of 16) into softmax weights rounded to f16:
// e^(w - max) by expf_poly16, the sum in double per 16-position chunk (and a
// sink's term after it).
void softmax_to_f16(float* w, int64_t n, float max, const float* sink) {
  max = max_with_sink(max, sink);
  const __m512 vmax = _mm512_set1_ps(max);
  double sum = 0;
  for (int64_t i = 0; i < n; i += 16) {
    const __m512 e = expf_poly16(_mm512_sub_ps(_mm512_loadu_ps(w + i), vmax));
    _mm512_storeu_ps(w + i, e);
    sum += static_cast<double>(_mm512_reduce_add_ps(e));
  }
  sum = add_sink(sum, sink, max);
  const __m512 inv = _mm512_set1_ps(static_cast<float>(1.0 / sum));
  for (int64_t i = 0; i < n; i += 16) _mm512_storeu_ps(w + i, round_f16(_mm512_mul_ps(_mm512_loadu_ps(w + i), inv)));
}

// Where each position in [pos_begin, pos_end)'s slot starts (elements from k
// or v), from the block table.
void slots_of(const PagedKV& kv, int64_t pos_begin, int64_t pos_end, std::vector<int64_t>& slots) {
  slots.resize(static_cast<size_t>(pos_end - pos_begin));
  kv.f16_slots(pos_begin, pos_end, slots.data());
}

// y[h]: the dot-product vector of query head h (q, NH heads of 16 * NV
// floats) with key k, whose lane sum is the score; zero when k is null (a
// position outside the range, masked later). Decode runs ggml_vec_dot_f16's
// four accumulators over 64-element steps, prefill tinyBLAS's one.
template <int NH, int NV>
[[gnu::always_inline]] inline void key_dots(const float* q, const uint16_t* k, const uint16_t* ahead, bool prefill, __m512* y) {
  if (ahead != nullptr) prefetch_lines(ahead, 32 * NV);
  if (k == nullptr) {
    for (int h = 0; h < NH; ++h) y[h] = _mm512_setzero_ps();
    return;
  }
  if (prefill) {
    __m512 kf[NV];
    for (int j = 0; j < NV; ++j) kf[j] = load_f16(k + 16 * j);
    for (int h = 0; h < NH; ++h) {
      __m512 c = _mm512_setzero_ps();
      for (int j = 0; j < NV; ++j) c = _mm512_fmadd_ps(kf[j], _mm512_load_ps(q + h * 16 * NV + 16 * j), c);
      y[h] = c;
    }
    return;
  }
  // Decode: the key widened four vectors at a time (NV is a multiple of 4),
  // each used for every head before the next four: the heads' four sums each
  // and four key vectors fit the registers (all sixteen of a 256-wide key
  // beside sixteen sums did not: attention_bench --cold, 5-8% at 16k). Each
  // sum's multiply-adds keep their order.
  __m512 sum[NH][4];
  for (int h = 0; h < NH; ++h)
    for (int a = 0; a < 4; ++a) sum[h][a] = _mm512_setzero_ps();
  for (int j = 0; j < NV; j += 4) {
    __m512 kf[4];
    for (int a = 0; a < 4; ++a) kf[a] = load_f16(k + 16 * (j + a));
    for (int h = 0; h < NH; ++h)
      for (int a = 0; a < 4; ++a) sum[h][a] = _mm512_fmadd_ps(kf[a], _mm512_load_ps(q + h * 16 * NV + 16 * (j + a)), sum[h][a]);
  }
  for (int h = 0; h < NH; ++h) y[h] = _mm512_add_ps(_mm512_add_ps(sum[h][0], sum[h][2]), _mm512_add_ps(sum[h][1], sum[h][3]));
}

// a[h] = tree_pairs of the dot-product vectors with keys k0 and k1.
template <int NH, int NV>
[[gnu::always_inline]] inline void key_pair(const float* q, const uint16_t* k0, const uint16_t* k1,
                                            const uint16_t* ahead0, const uint16_t* ahead1, bool prefill, __m512* a) {
  __m512 y0[NH], y1[NH];
  key_dots<NH, NV>(q, k0, ahead0, prefill, y0);
  key_dots<NH, NV>(q, k1, ahead1, prefill, y1);
  for (int h = 0; h < NH; ++h) a[h] = tree_pairs(y0[h], y1[h]);
}

// The unscaled scores of a 16-position chunk: lane l of s[h] is head h's
// score of key keys[l] (null: outside the range). Each key is widened once
// for all NH heads, and the tree is walked as the keys come.
template <int NH, int NV>
[[gnu::always_inline]] inline void chunk_scores(const float* q, const uint16_t* const* keys, const uint16_t* const* ahead, bool prefill,
                                                __m512* s) {
  __m512 c[2][NH];
  for (int half = 0; half < 2; ++half) {
    __m512 b[2][NH];
    for (int quad = 0; quad < 2; ++quad) {
      const int* order = kTreeOrder + 8 * half + 4 * quad;
      __m512 a0[NH], a1[NH];
      key_pair<NH, NV>(q, keys[order[0]], keys[order[1]], ahead[order[0]], ahead[order[1]], prefill, a0);
      key_pair<NH, NV>(q, keys[order[2]], keys[order[3]], ahead[order[2]], ahead[order[3]], prefill, a1);
      for (int h = 0; h < NH; ++h) b[quad][h] = tree_quads(a0[h], a1[h]);
    }
    for (int h = 0; h < NH; ++h) c[half][h] = tree_halves(b[0][h], b[1][h]);
  }
  for (int h = 0; h < NH; ++h) s[h] = tree_last(c[0][h], c[1][h]);
}

// The weighted values' partial sums of positions [pos_begin, pos_end), one set
// per position lane: set s (s = p % n_sets, for the n_sets or fewer sets the
// range reaches) gets sum of w_p * v_p over its positions, in position order,
// each set's columns [0, width) at acc + s * width. The columns go 256 at a
// time (sixteen vectors held in registers while a set's positions stream
// by), so only the sets reached are written and none is zeroed first: the
// same multiply-adds in the same order as adding each position into a zeroed
// set. v + slots[i] + col0 is the value row of position pos_begin + i, w[i]
// its weight.
void sum_value_sets(const uint16_t* v, const int64_t* slots, int64_t col0, int64_t width, int64_t pos_begin,
                    int64_t pos_end, int64_t n_sets, const float* w, float* acc) {
  const int64_t used = std::min(n_sets, pos_end - pos_begin);
  for (int64_t d0 = 0; d0 < width; d0 += 256) {
    const int64_t nv = std::min<int64_t>(16, (width - d0) / 16);
    for (int64_t p0 = pos_begin; p0 < pos_begin + used; ++p0) {
      __m512 a[16];
      for (int64_t j = 0; j < nv; ++j) a[j] = _mm512_setzero_ps();
      for (int64_t p = p0; p < pos_end; p += n_sets) {
        const uint16_t* row = v + slots[p - pos_begin] + col0 + d0;
        const __m512 wp = _mm512_set1_ps(w[p - pos_begin]);
        for (int64_t j = 0; j < nv; ++j) a[j] = _mm512_fmadd_ps(load_f16(row + 16 * j), wp, a[j]);
      }
      float* dst = acc + (p0 % n_sets) * width + d0;
      for (int64_t j = 0; j < nv; ++j) _mm512_storeu_ps(dst + 16 * j, a[j]);
    }
  }
}

// Up to about this many positions weighted_values_decode is the faster
// (build/attention_bench): beyond, it pays for walking the positions once per
// 16 columns (6% slower at 512, 16% at 1,024), while storing the sets costs
// little per position.
constexpr int64_t kRegisterSetsMaxPositions = 384;

// The value row of the i-th position of a range (slots from slots_of).
struct ValueRows {
  const uint16_t* v;
  const int64_t* slots;
  int64_t head_offset;
  const uint16_t* operator()(int64_t i) const { return v + slots[i] + head_offset; }
};

// sum[h]: a decode set of head h, columns [col, col + 16): its first position
// i0 (relative) and every 64th after it.
template <int NH>
[[gnu::always_inline]] inline void value_set(const ValueRows& vrow, int64_t i0, int64_t P, int64_t col, const float* w,
                                             int64_t w_stride, __m512* sum) {
  for (int h = 0; h < NH; ++h) sum[h] = _mm512_setzero_ps();
#pragma GCC unroll 1
  for (int64_t i = i0; i < P; i += 64) {
    const __m512 v = load_f16(vrow(i) + col);
    for (int h = 0; h < NH; ++h) sum[h] = _mm512_fmadd_ps(v, _mm512_set1_ps(w[h * w_stride + i]), sum[h]);
  }
}

// Decode's weighted sum of values for NH query heads, GGML's order: position
// p's product w_p * v_p goes into set p % 64 (summed in position order), and
// the 64 sets are folded as fold_sets does. Each 16-column slice of the
// output is built set by set in registers, in the order of the fold's tree,
// so the sets never go through memory: written out, the 64 sets of three
// heads are 48 KiB, and storing them cost more than all the arithmetic.
// vrow(i) is the value row of position pos_begin + i, w[h * w_stride + i]
// head h's weight of it; P positions.
template <int NH, int NV>
[[gnu::always_inline]] inline void weighted_values_decode(const ValueRows& vrow, int64_t pos_begin, int64_t P, const float* w, int64_t w_stride,
                            float* out) {
  const int64_t base = -pos_begin & 63;  // set s starts at relative position (s - pos_begin) mod 64
  // Not unrolled: one slice's code is already about a thousand instructions,
  // and NV copies of it would not fit the instruction cache.
#pragma GCC unroll 1
  for (int64_t j = 0; j < NV; ++j) {
    const int64_t col = 16 * j;
    auto set = [&](int64_t s, __m512* sum) __attribute__((always_inline)) {
      value_set<NH>(vrow, (base + s) & 63, P, col, w, w_stride, sum);
    };
    __m512 result[NH];
    fold_lanes<NH>(DecodeLanes<NH, decltype(set)>{set}, result);
    for (int h = 0; h < NH; ++h) _mm512_storeu_ps(out + h * 16 * NV + col, result[h]);
  }
}

// Positions whose value rows sum_value_lanes reads as one tile in decode:
// four of each lane's. Larger tiles store the lane sums less often, but at 512
// (256 KiB of rows for a 256-wide head) the tile, the next one and the sums
// no longer stay in L2, and the walk ran 10-30% slower; 256 beat 128 by 5-10%
// on every shape of attention_bench --cold (Zen 5, head by head).
constexpr int64_t kValueTile = 256;

// Long contexts' weighted values: lane s (s = p % n_sets) of head h gets
// sum of w_p * v_p over its positions in position order, stored as a D-vector
// at acc + (h * n_sets + s) * D; P = pos_end - pos_begin, w[h * w_stride + i]
// head h's weight of position pos_begin + i.
// A lane's positions are n_sets apart, so walking one lane over the whole
// range reads a row every n_sets slots, 128 bytes at a time: a pattern no
// hardware prefetcher follows, from memory each time at long context. So the
// positions go `tile` at a time (a multiple of 64): each lane's sums are
// loaded, carried over the tile's positions and stored back (the same
// additions in the same order as one walk, so the same bits), while the next
// tile's rows are prefetched, and the tile's rows are read from L2. A tile
// of P or more is the plain walk (keys and values already in cache).
// One tile of sum_value_lanes, positions [t0, min(t0 + tile, P)), for NH
// heads; prefetching the next tile's rows if `prefetch`.
template <int NH, int NV>
void sum_tile_lanes(const ValueRows& vrow, int64_t pos_begin, int64_t P, int64_t n_sets, int64_t tile, int64_t t0,
                    bool prefetch, const float* w, int64_t w_stride, float* acc) {
  constexpr int64_t D = 16 * NV;
  const int64_t t1 = std::min(t0 + tile, P), lanes = std::min(n_sets, t1 - t0);
  for (int64_t i0 = t0; i0 < t0 + lanes; ++i0) {
    const int64_t lane = (pos_begin + i0) % n_sets;
    for (int64_t j = 0; j < NV; j += 4) {
      __m512 a[NH][4];
      for (int h = 0; h < NH; ++h) {
        const float* src = acc + (h * n_sets + lane) * D + 16 * j;
        for (int k = 0; k < 4; ++k) a[h][k] = t0 == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(src + 16 * k);
      }
      for (int64_t i = i0; i < t1; i += n_sets) {
        // The same columns of this lane's row a tile on, so the next
        // tile is in cache when it comes, asked for at the pace it is read.
        if (prefetch && i + tile < P) prefetch_lines(vrow(i + tile) + 16 * j, 128);
        const uint16_t* v = vrow(i) + 16 * j;
        __m512 vf[4];
        for (int k = 0; k < 4; ++k) vf[k] = load_f16(v + 16 * k);
        for (int h = 0; h < NH; ++h) {
          const __m512 wp = _mm512_set1_ps(w[h * w_stride + i]);
          for (int k = 0; k < 4; ++k) a[h][k] = _mm512_fmadd_ps(vf[k], wp, a[h][k]);
        }
      }
      for (int h = 0; h < NH; ++h) {
        float* dst = acc + (h * n_sets + lane) * D + 16 * j;
        for (int k = 0; k < 4; ++k) _mm512_storeu_ps(dst + 16 * k, a[h][k]);
      }
    }
  }
}

// NA + NB heads (NB of them after the first NA, 0: none), each tile for the
// NA heads and then, from L2, for the NB: the values are read from memory
// once for a group of more heads than the registers hold.
template <int NA, int NB, int NV>
void sum_value_lanes(const ValueRows& vrow, int64_t pos_begin, int64_t pos_end, int64_t n_sets, int64_t tile,
                     const float* w, int64_t w_stride, float* acc) {
  const int64_t P = pos_end - pos_begin;
  for (int64_t t0 = 0; t0 < P; t0 += tile) {
    sum_tile_lanes<NA, NV>(vrow, pos_begin, P, n_sets, tile, t0, true, w, w_stride, acc);
    if constexpr (NB > 0)
      sum_tile_lanes<NB, NV>(vrow, pos_begin, P, n_sets, tile, t0, false, w + NA * w_stride, w_stride,
                             acc + NA * n_sets * 16 * NV);
  }
}

// NH query heads of 16 * NV columns over one key/value head. The same
// arithmetic per head as attend_one_head_avx512, organized for speed: each
// key and value is widened once for all NH heads, and scores come sixteen
// positions at a time (chunk_scores).
template <int NH, int NV>
void attend_heads_avx512(const float* q_in, const PagedKV& kv, int64_t head_offset, int64_t pos_begin,
                         int64_t pos_end, float scale, AttentionPass pass, float* out, const float* sinks) {
  static_assert(NH <= 8);
  constexpr int64_t D = 16 * NV;
  // More heads than the registers hold go as two groups, the second's
  // scores and values computed from the keys and values the first just read.
  constexpr int NA = std::min(NH, 4), NB = NH - NA;
  const bool prefill = pass == AttentionPass::kPrefill;
  thread_local std::vector<float> weights, acc;
  thread_local std::vector<int64_t> slots;  // cache slot of each position, from the block table
  alignas(64) float q[NH * D];
  for (int64_t i = 0; i < NH * D; i += 16) _mm512_store_ps(&q[i], round_f16(_mm512_loadu_ps(q_in + i)));
  slots_of(kv, pos_begin, pos_end, slots);

  const bool long_decode = !prefill && pos_end - pos_begin > kRegisterSetsMaxPositions;
  // Scores over whole 16-position chunks; positions outside the range are masked.
  const int64_t c0 = pos_begin - pos_begin % 16;
  const int64_t n = (pos_end - c0 + 15) / 16 * 16;
  weights.resize(static_cast<size_t>(NH * n));
  __m512 vmax[NH];
  for (int h = 0; h < NH; ++h) vmax[h] = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t ch = c0; ch < pos_end; ch += 16) {
    const int64_t lo = std::max(ch, pos_begin) - ch, hi = std::min(ch + 16, pos_end) - ch;
    const uint16_t* keys[16];
    for (int64_t l = 0; l < 16; ++l)
      keys[l] = l >= lo && l < hi ? kv.k_f16() + slots[ch + l - pos_begin] + head_offset : nullptr;
    // The keys kKeyPrefetch positions on, prefetched as the chunk's keys are
    // read: in long decode only (prefill's keys are read by every token of
    // the batch, and a short context's stay in cache from step to step).
    const uint16_t* ahead[16];
    for (int64_t l = 0; l < 16; ++l) {
      const int64_t p = ch + kKeyPrefetch + l;
      ahead[l] = long_decode && p < pos_end ? kv.k_f16() + slots[p - pos_begin] + head_offset : nullptr;
    }
    __m512 s[NH];
    chunk_scores<NA, NV>(q, keys, ahead, prefill, s);
    if constexpr (NB > 0) {
      const uint16_t* const none[16] = {};
      chunk_scores<NB, NV>(q + NA * D, keys, none, prefill, s + NA);
    }
    const __mmask16 valid = static_cast<__mmask16>(((1u << hi) - 1) & ~((1u << lo) - 1));
    for (int h = 0; h < NH; ++h) {
      s[h] = _mm512_mask_mul_ps(_mm512_set1_ps(-std::numeric_limits<float>::infinity()), valid, s[h],
                                _mm512_set1_ps(scale));
      _mm512_storeu_ps(&weights[h * n + ch - c0], s[h]);
      vmax[h] = _mm512_max_ps(vmax[h], s[h]);
    }
  }
  for (int h = 0; h < NH; ++h) {
    float* w = &weights[h * n];
    softmax_to_f16(w, n, _mm512_reduce_max_ps(vmax[h]), sinks ? sinks + h : nullptr);
  }

  const ValueRows vrow{kv.v_f16(), slots.data(), head_offset};
  if (!prefill && !long_decode) {
    weighted_values_decode<NA, NV>(vrow, pos_begin, pos_end - pos_begin, weights.data() + (pos_begin - c0), n, out);
    if constexpr (NB > 0)
      weighted_values_decode<NB, NV>(vrow, pos_begin, pos_end - pos_begin, weights.data() + NA * n + (pos_begin - c0),
                                     n, out + NA * D);
    return;
  }
  // Otherwise partial sums per position lane (p mod 16; mod 64 for decode),
  // each a D-vector summed in registers four vectors at a time for all NH
  // heads, stored, then folded.
  const int64_t n_sets = prefill ? 16 : 64;
  const int64_t head_acc = n_sets * D;
  acc.resize(static_cast<size_t>(NH * head_acc));
  const int64_t used = std::min(n_sets, pos_end - pos_begin);
  // Decode's keys and values come from memory (a step streams the weights
  // between two layers' attention); prefill's were read by the batch's
  // other tokens, and tiles would only store the sums more often.
  const int64_t tile = prefill ? pos_end - pos_begin : kValueTile;
  sum_value_lanes<NA, NB, NV>(vrow, pos_begin, pos_end, n_sets, tile, weights.data() + (pos_begin - c0), n,
                              acc.data());
  const uint64_t reached = sets_reached(pos_begin, used, n_sets);
  for (int h = 0; h < NH; ++h) {
    fold_partial_sums(&acc[h * head_acc], D, prefill, reached, out + h * D);
  }
}

// Up to eight heads of a group at a time: the kernel holds four in registers
// and takes up to four more from the keys and values it has just read.
template <int NV>
void attend_heads_avx512(const float* q, int64_t n_heads, const PagedKV& kv, int64_t head_offset, int64_t pos_begin,
                         int64_t pos_end, float scale, AttentionPass pass, float* out, const float* sinks) {
  constexpr int64_t D = 16 * NV;
  for (int64_t h = 0; h < n_heads;) {
    const int64_t nh = std::min<int64_t>(n_heads - h, 8);
    const float* qh = q + h * D;
    float* oh = out + h * D;
    const float* sh = sinks ? sinks + h : nullptr;
    switch (nh) {
      case 8: attend_heads_avx512<8, NV>(qh, kv, head_offset, pos_begin, pos_end, scale, pass, oh, sh); break;
      case 7: attend_heads_avx512<7, NV>(qh, kv, head_offset, pos_begin, pos_end, scale, pass, oh, sh); break;
      case 6: attend_heads_avx512<6, NV>(qh, kv, head_offset, pos_begin, pos_end, scale, pass, oh, sh); break;
      case 5: attend_heads_avx512<5, NV>(qh, kv, head_offset, pos_begin, pos_end, scale, pass, oh, sh); break;
      case 4: attend_heads_avx512<4, NV>(qh, kv, head_offset, pos_begin, pos_end, scale, pass, oh, sh); break;
      case 3: attend_heads_avx512<3, NV>(qh, kv, head_offset, pos_begin, pos_end, scale, pass, oh, sh); break;
      case 2: attend_heads_avx512<2, NV>(qh, kv, head_offset, pos_begin, pos_end, scale, pass, oh, sh); break;
      default: attend_heads_avx512<1, NV>(qh, kv, head_offset, pos_begin, pos_end, scale, pass, oh, sh); break;
    }
    h += nh;
  }
}

// Prefill tiles (attend_heads_tile): several query tokens of one sequence
// over one key/value head, each token's arithmetic attend_heads_avx512's
// (kPrefill) step for step, only the loops reordered so that what the tokens
// share is read once for the tile:
//   scores  chunk by chunk; each 16-position chunk's keys are read from memory
//           once and by the tile's other tokens from L1 (chunk_scores per
//           token on the keys of its own range, null outside it, as the
//           per-token kernel passes them: the same bits);
//   softmax per token and head over its own chunks (softmax_to_f16);
//   values  position lane s (p % 16) of each token is the same chain of
//           fused multiply-adds in position order as sum_value_lanes's, cut
//           into blocks of kTileValueBlock positions: per block, lane and 64
//           columns, each token carries its chain over its part of the block
//           (stored and loaded between blocks, which keeps the bits), so a
//           lane's value rows are read once for the tile;
//   fold    fold_partial_sums per token and head, as the per-token kernel.
// Tokens per call: at most kTileMaxTokens (the wrapper below cuts larger
// tiles).
constexpr int64_t kTileMaxTokens = 16;
constexpr int64_t kTileValueBlock = 256;
// Groups of more than four query heads (the kernel's two passes over each
// chunk's keys and values) gained only over long ranges: at 512 and 2,048
// positions the per-token kernel, which shares each key's widening among all
// of them, was 8-12% faster, at 8,192 the tiles 5-7% (attention_bench
// --tile=8 --heads=7,7, docs/benchmarks.md). Below this many positions such
// groups go token by token.
constexpr int64_t kWideGroupTileMinPositions = 4096;

// One token's lane chain over positions p0, p0 + 16, ... < p1 (one lane), its
// 64 columns from 16 * j, for NH heads: w[h * n + p - c0] head h's weight of
// position p, acc + h * 16 * D the head's lane (its partial sums, read unless
// `first`, the lane's first positions: those start from zero).
template <int NH, int NV>
[[gnu::always_inline]] inline void tile_lane_walk(const ValueRows& vrow, int64_t B, int64_t c0, int64_t p0, int64_t p1,
                                                  int64_t j, bool first, const float* w, int64_t n, float* acc) {
  constexpr int64_t D = 16 * NV;
  __m512 a[NH][4];
  for (int h = 0; h < NH; ++h)
    for (int k = 0; k < 4; ++k)
      a[h][k] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + h * 16 * D + 16 * (j + k));
  for (int64_t p = p0; p < p1; p += 16) {
    const uint16_t* v = vrow(p - B) + 16 * j;
    __m512 vf[4];
    for (int k = 0; k < 4; ++k) vf[k] = load_f16(v + 16 * k);
    for (int h = 0; h < NH; ++h) {
      const __m512 wp = _mm512_set1_ps(w[h * n + p - c0]);
      for (int k = 0; k < 4; ++k) a[h][k] = _mm512_fmadd_ps(vf[k], wp, a[h][k]);
    }
  }
  for (int h = 0; h < NH; ++h)
    for (int k = 0; k < 4; ++k) _mm512_storeu_ps(acc + h * 16 * D + 16 * (j + k), a[h][k]);
}

// NH query heads of 16 * NV columns, tile.n_tokens <= kTileMaxTokens tokens.
template <int NH, int NV>
void attend_tile_avx512(const AttentionTile& tile, const PagedKV& kv, int64_t head_offset, float scale,
                        const float* sinks) {
  static_assert(NH <= 8);
  constexpr int64_t D = 16 * NV;
  constexpr int NA = std::min(NH, 4), NB = NH - NA;
  const int64_t T = tile.n_tokens;
  const int64_t* b = tile.pos_begin;
  const int64_t* e = tile.pos_end;
  int64_t B = b[0], E = e[0];  // the positions any token reads
  for (int64_t i = 1; i < T; ++i) B = std::min(B, b[i]), E = std::max(E, e[i]);
  thread_local std::vector<float> q_buf, weights, acc_buf;
  thread_local std::vector<int64_t> slots;  // cache slot of each position in [B, E)
  thread_local std::vector<__m512> vmax;    // token i, head h: vmax[i * NH + h]
  float* q = line_aligned(q_buf, static_cast<size_t>(T * NH * D));
  for (int64_t i = 0; i < T; ++i)
    for (int64_t d = 0; d < NH * D; d += 16)
      _mm512_store_ps(q + i * NH * D + d, round_f16(_mm512_loadu_ps(tile.q + i * tile.q_stride + d)));
  slots_of(kv, B, E, slots);

  // Scores: token i's head h at weights[(i * NH + h) * n + p - c0], over the
  // whole chunks of its own range (c0 the tile's first chunk).
  const int64_t c0 = B - B % 16;
  const int64_t n = (E - c0 + 15) / 16 * 16;
  weights.resize(static_cast<size_t>(T * NH * n));
  vmax.assign(static_cast<size_t>(T * NH), _mm512_set1_ps(-std::numeric_limits<float>::infinity()));
  const uint16_t* const none[16] = {};
  for (int64_t ch = c0; ch < E; ch += 16) {
    const uint16_t* keys[16];
    for (int64_t l = 0; l < 16; ++l)
      keys[l] = ch + l >= B && ch + l < E ? kv.k_f16() + slots[ch + l - B] + head_offset : nullptr;
    for (int64_t i = 0; i < T; ++i) {
      if (e[i] <= ch || b[i] >= ch + 16) continue;  // the chunk is outside token i's range
      const int64_t lo = std::max(ch, b[i]) - ch, hi = std::min(ch + 16, e[i]) - ch;
      const uint16_t* mine[16];  // token i's keys of the chunk, null outside its range
      for (int64_t l = 0; l < 16; ++l) mine[l] = l >= lo && l < hi ? keys[l] : nullptr;
      __m512 s[NH];
      chunk_scores<NA, NV>(q + i * NH * D, mine, none, true, s);
      if constexpr (NB > 0) chunk_scores<NB, NV>(q + i * NH * D + NA * D, mine, none, true, s + NA);
      const __mmask16 valid = static_cast<__mmask16>(((1u << hi) - 1) & ~((1u << lo) - 1));
      for (int h = 0; h < NH; ++h) {
        s[h] = _mm512_mask_mul_ps(_mm512_set1_ps(-std::numeric_limits<float>::infinity()), valid, s[h],
                                  _mm512_set1_ps(scale));
        _mm512_storeu_ps(&weights[(i * NH + h) * n + ch - c0], s[h]);
        vmax[i * NH + h] = _mm512_max_ps(vmax[i * NH + h], s[h]);
      }
    }
  }
  for (int64_t i = 0; i < T; ++i) {
    const int64_t ci = b[i] - b[i] % 16, ni = (e[i] - ci + 15) / 16 * 16;
    for (int h = 0; h < NH; ++h)
      softmax_to_f16(&weights[(i * NH + h) * n + ci - c0], ni, _mm512_reduce_max_ps(vmax[i * NH + h]),
                     sinks ? sinks + h : nullptr);
  }

  // Values: token i's head h, lane s at acc + ((i * NH + h) * 16 + s) * D.
  float* acc = line_aligned(acc_buf, static_cast<size_t>(T * NH * 16 * D));
  const ValueRows vrow{kv.v_f16(), slots.data(), head_offset};
  for (int64_t blk = B - B % kTileValueBlock; blk < E; blk += kTileValueBlock) {
    for (int64_t i = 0; i < T; ++i) {
      for (int64_t s = 0; s < 16; ++s) {
        for (int64_t j = 0; j < NV; j += 4) {
          const int64_t r0 = std::max(blk, b[i]), r1 = std::min(blk + kTileValueBlock, e[i]);
          const int64_t p0 = r0 + ((s - r0 % 16) + 16) % 16;  // the lane's first position in the block
          if (p0 >= r1) continue;
          const bool first = p0 - b[i] < 16;  // the lane's first in token i's range
          float* a = acc + (i * NH * 16 + s) * D;
          const float* w = &weights[i * NH * n];
          tile_lane_walk<NA, NV>(vrow, B, c0, p0, r1, j, first, w, n, a);
          if constexpr (NB > 0) tile_lane_walk<NB, NV>(vrow, B, c0, p0, r1, j, first, w + NA * n, n, a + NA * 16 * D);
        }
      }
    }
  }
  for (int64_t i = 0; i < T; ++i) {
    const uint64_t reached = sets_reached(b[i], std::min<int64_t>(16, e[i] - b[i]), 16);
    for (int h = 0; h < NH; ++h)
      fold_partial_sums(acc + (i * NH + h) * 16 * D, D, true, reached, tile.out + i * tile.out_stride + h * D);
  }
}

// Up to eight heads and kTileMaxTokens tokens at a time.
template <int NV>
void attend_tile_avx512(const AttentionTile& tile, int64_t n_heads, const PagedKV& kv, int64_t head_offset,
                        float scale, const float* sinks) {
  constexpr int64_t D = 16 * NV;
  if (n_heads > 4) {
    int64_t B = tile.pos_begin[0], E = tile.pos_end[0];
    for (int64_t i = 1; i < tile.n_tokens; ++i) B = std::min(B, tile.pos_begin[i]), E = std::max(E, tile.pos_end[i]);
    if (E - B < kWideGroupTileMinPositions) {
      for (int64_t i = 0; i < tile.n_tokens; ++i)
        attend_heads_avx512<NV>(tile.q + i * tile.q_stride, n_heads, kv, head_offset, tile.pos_begin[i],
                                tile.pos_end[i], scale, AttentionPass::kPrefill, tile.out + i * tile.out_stride, sinks);
      return;
    }
  }
  for (int64_t i0 = 0; i0 < tile.n_tokens; i0 += kTileMaxTokens) {
    for (int64_t h = 0; h < n_heads;) {
      const int64_t nh = std::min<int64_t>(n_heads - h, 8);
      AttentionTile part = tile;
      part.q = tile.q + i0 * tile.q_stride + h * D;
      part.out = tile.out + i0 * tile.out_stride + h * D;
      part.n_tokens = std::min(kTileMaxTokens, tile.n_tokens - i0);
      part.pos_begin = tile.pos_begin + i0;
      part.pos_end = tile.pos_end + i0;
      const float* sh = sinks ? sinks + h : nullptr;
      switch (nh) {
        case 8: attend_tile_avx512<8, NV>(part, kv, head_offset, scale, sh); break;
        case 7: attend_tile_avx512<7, NV>(part, kv, head_offset, scale, sh); break;
        case 6: attend_tile_avx512<6, NV>(part, kv, head_offset, scale, sh); break;
        case 5: attend_tile_avx512<5, NV>(part, kv, head_offset, scale, sh); break;
        case 4: attend_tile_avx512<4, NV>(part, kv, head_offset, scale, sh); break;
        case 3: attend_tile_avx512<3, NV>(part, kv, head_offset, scale, sh); break;
        case 2: attend_tile_avx512<2, NV>(part, kv, head_offset, scale, sh); break;
        default: attend_tile_avx512<1, NV>(part, kv, head_offset, scale, sh); break;
      }
      h += nh;
    }
  }
}

}  // namespace

// Head sizes of 64, 128, 192 and 256 get the grouped kernels; others go one
// head at a time.
void attend_heads_avx512(const float* q, int64_t n_heads, const PagedKV& kv, int64_t head_offset, int64_t D,
                         int64_t pos_begin, int64_t pos_end, float scale, AttentionPass pass, float* out, const float* sinks) {
  switch (D) {
    case 64: return attend_heads_avx512<4>(q, n_heads, kv, head_offset, pos_begin, pos_end, scale, pass, out, sinks);
    case 128: return attend_heads_avx512<8>(q, n_heads, kv, head_offset, pos_begin, pos_end, scale, pass, out, sinks);
    case 192: return attend_heads_avx512<12>(q, n_heads, kv, head_offset, pos_begin, pos_end, scale, pass, out, sinks);
    case 256: return attend_heads_avx512<16>(q, n_heads, kv, head_offset, pos_begin, pos_end, scale, pass, out, sinks);
    default:
      for (int64_t h = 0; h < n_heads; ++h)
        attend_one_head_avx512(q + h * D, kv, head_offset, D, pos_begin, pos_end, scale, pass, out + h * D, sinks ? sinks + h : nullptr);
  }
}

void attend_heads_tile_avx512(const AttentionTile& tile, int64_t n_heads, const PagedKV& kv, int64_t head_offset,
                              int64_t D, float scale, const float* sinks) {
  switch (D) {
    case 64: return attend_tile_avx512<4>(tile, n_heads, kv, head_offset, scale, sinks);
    case 128: return attend_tile_avx512<8>(tile, n_heads, kv, head_offset, scale, sinks);
    case 192: return attend_tile_avx512<12>(tile, n_heads, kv, head_offset, scale, sinks);
    case 256: return attend_tile_avx512<16>(tile, n_heads, kv, head_offset, scale, sinks);
    default:
      for (int64_t i = 0; i < tile.n_tokens; ++i)
        attend_heads_avx512(tile.q + i * tile.q_stride, n_heads, kv, head_offset, D, tile.pos_begin[i],
                            tile.pos_end[i], scale, AttentionPass::kPrefill, tile.out + i * tile.out_stride, sinks);
  }
}

void attend_one_head_avx512(const float* q_in, const PagedKV& kv, int64_t head_offset, int64_t D, int64_t pos_begin,
                            int64_t pos_end, float scale, AttentionPass pass, float* out, const float* sinks) {
  if (D % 16 != 0 || D > 256) {
    attend_one_head_scalar(q_in, kv, head_offset, D, pos_begin, pos_end, scale, pass, out, sinks);
    return;
  }
  const int64_t nv = D / 16;
  const bool prefill = pass == AttentionPass::kPrefill;
  __m512 q[16];
  for (int64_t j = 0; j < nv; ++j) q[j] = round_f16(_mm512_loadu_ps(q_in + 16 * j));

  thread_local std::vector<float> weights, acc;
  thread_local std::vector<int64_t> slots;  // cache slot of each position, from the block table
  slots_of(kv, pos_begin, pos_end, slots);
  const int64_t c0 = pos_begin - pos_begin % 16;
  const int64_t n = (pos_end - c0 + 15) / 16 * 16;
  weights.assign(static_cast<size_t>(n), -std::numeric_limits<float>::infinity());
  float max = -std::numeric_limits<float>::infinity();
  const int64_t np = D & ~int64_t{63};
  for (int64_t p = pos_begin; p < pos_end; ++p) {
    const uint16_t* k = kv.k_f16() + slots[p - pos_begin] + head_offset;
    float s;
    if (prefill) {  // tinyBLAS: one accumulator
      __m512 c = _mm512_setzero_ps();
      for (int64_t j = 0; j < nv; ++j) c = _mm512_fmadd_ps(load_f16(k + 16 * j), q[j], c);
      s = _mm512_reduce_add_ps(c);
    } else {  // ggml_vec_dot_f16: four accumulators, then the tail in double
      __m512 sum[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
      for (int64_t i = 0; i < np; i += 64)
        for (int j = 0; j < 4; ++j) sum[j] = _mm512_fmadd_ps(load_f16(k + i + 16 * j), q[i / 16 + j], sum[j]);
      double sd = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(sum[0], sum[2]), _mm512_add_ps(sum[1], sum[3])));
      if (np < D) {
        alignas(64) float qt[16], kt[16];
        for (int64_t i = np; i < D; i += 16) {
          _mm512_store_ps(qt, q[i / 16]);
          _mm512_store_ps(kt, load_f16(k + i));
          for (int l = 0; l < 16; ++l) sd += static_cast<double>(kt[l] * qt[l]);
        }
      }
      s = static_cast<float>(sd);
    }
    s *= scale;
    weights[p - c0] = s;
    max = std::max(max, s);
  }
  softmax_to_f16(weights.data(), n, max, sinks);

  // Partial sums per position lane (p mod 16; mod 64 for decode: four
  // accumulators of 16 lanes), then folded.
  const int64_t n_sets = prefill ? 16 : 64;
  acc.resize(static_cast<size_t>(n_sets * D));
  const int64_t used = std::min(n_sets, pos_end - pos_begin);
  sum_value_sets(kv.v_f16(), slots.data(), head_offset, D, pos_begin, pos_end, n_sets, weights.data() + (pos_begin - c0),
                 acc.data());
  fold_partial_sums(acc.data(), D, prefill, sets_reached(pos_begin, used, n_sets), out);
}

// Latent attention (attend_latent_heads), GGML's AVX-512 build: the portable
// kernel's arithmetic (attend_one_head_kv_of<Avx512Build>) with its per-lane
// loops as vector instructions. Each lane's fused multiply-adds are the same
// operations in the same order, and the lane sums stay reduce16's, so the bits
// are the portable kernel's. Heads whose widths are not whole vectors run the
// portable kernel.
void attend_latent_heads_avx512(const float* q_in, int64_t n_heads, const PagedKV& kv, int64_t Dk, int64_t Dv,
                                int64_t pos_begin, int64_t pos_end, float scale, AttentionPass pass, float* out) {
  if (Dk % 16 != 0 || Dv % 16 != 0) {
    for (int64_t h = 0; h < n_heads; ++h)
      attend_one_head_kv_of<Avx512Build>(q_in + h * Dk, kv, 0, Dk, Dv, pos_begin, pos_end, scale, pass,
                                         out + h * Dv, nullptr);
    return;
  }
  thread_local std::vector<float> q, weights, acc;
  thread_local std::vector<int64_t> slots;
  slots.resize(static_cast<size_t>(pos_end - pos_begin));
  kv.f16_slots(pos_begin, pos_end, slots.data());
  const bool prefill = pass == AttentionPass::kPrefill;
  const int64_t c0 = pos_begin - pos_begin % 16;
  const int64_t n = (pos_end - c0 + 15) / 16 * 16;
  const int64_t np = Dk & ~int64_t{63};
  const int64_t n_sets = prefill ? 16 : 64;
  q.resize(static_cast<size_t>(Dk));
  alignas(64) float lanes[16];
  for (int64_t h = 0; h < n_heads; ++h) {
    for (int64_t d = 0; d < Dk; d += 16) _mm512_storeu_ps(&q[d], round_f16(_mm512_loadu_ps(q_in + h * Dk + d)));
    weights.assign(static_cast<size_t>(n), -std::numeric_limits<float>::infinity());
    float max = -std::numeric_limits<float>::infinity();
    for (int64_t p = pos_begin; p < pos_end; ++p) {
      const uint16_t* k = kv.k_f16() + slots[p - pos_begin];
      float dot;
      if (prefill) {  // tinyBLAS: one accumulator
        __m512 c = _mm512_setzero_ps();
        for (int64_t i = 0; i < Dk; i += 16) c = _mm512_fmadd_ps(load_f16(k + i), _mm512_loadu_ps(&q[i]), c);
        _mm512_store_ps(lanes, c);
        dot = reduce16(lanes);
      } else {  // ggml_vec_dot_f16: four accumulators, then the tail in double
        __m512 sum[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
        for (int64_t i = 0; i < np; i += 64)
          for (int j = 0; j < 4; ++j)
            sum[j] = _mm512_fmadd_ps(load_f16(k + i + 16 * j), _mm512_loadu_ps(&q[i + 16 * j]), sum[j]);
        _mm512_store_ps(lanes, _mm512_add_ps(_mm512_add_ps(sum[0], sum[2]), _mm512_add_ps(sum[1], sum[3])));
        double sd = reduce16(lanes);
        for (int64_t i = np; i < Dk; ++i) sd += static_cast<double>(f16_to_f32(k[i]) * q[i]);
        dot = static_cast<float>(sd);
      }
      const float sc = dot * scale;
      weights[p - c0] = sc;
      max = std::max(max, sc);
    }
    softmax_of<Avx512Build, true>(weights.data(), n, max);
    // Each position set's weighted values summed in registers, 256 columns
    // at a time (the latent is wider than the registers hold), and only the
    // sets the positions reach written: the same multiply-adds in the same
    // order as summing into a zeroed set per position, without zeroing and
    // folding all 64 sets of a 512-wide latent per head and step.
    acc.resize(static_cast<size_t>(n_sets * Dv));
    const int64_t used = std::min(n_sets, pos_end - pos_begin);
    sum_value_sets(kv.v_f16(), slots.data(), 0, Dv, pos_begin, pos_end, n_sets, weights.data() + (pos_begin - c0),
                   acc.data());
    fold_partial_sums(acc.data(), Dv, prefill, sets_reached(pos_begin, used, n_sets), out + h * Dv);
  }
}

}  // namespace inferd::kernels::detail
