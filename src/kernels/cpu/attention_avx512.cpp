// AVX-512 attention, GGML's arithmetic (attention.h): f16 keys and values are
// widened 16 at a time; scores and softmax weights in 16-position chunks; the
// weighted values summed per position lane into L1-resident partial sums.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/expf_poly.h"

namespace inferd::kernels::detail {

namespace {

inline __m512 load_f16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

inline __m512 round_f16(__m512 x) { return _mm512_cvtph_ps(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT)); }

// The 16-lane tree of _mm512_reduce_add_ps, applied lane-wise to 16 vectors.
inline __m512 reduce16_lanewise(const __m512* y) {
  __m512 t3[8], t6[4];
  for (int i = 0; i < 8; ++i) t3[i] = _mm512_add_ps(y[i + 8], y[i]);
  for (int i = 0; i < 4; ++i) t6[i] = _mm512_add_ps(t3[i + 4], t3[i]);
  return _mm512_add_ps(_mm512_add_ps(t6[0], t6[2]), _mm512_add_ps(t6[1], t6[3]));
}

// out[0, D) from the weighted values' partial sums (sets of D floats, one per
// position lane: 16 for a prefill pass, 64 for decode, folded as GGML does).
// Only the sets in `reached` (bit s: set s) were written; the others count as
// zero, added like GGML's zero lanes but not read from memory (short contexts
// reach few of the 64 sets).
template <bool kAllReached>
void fold_sets(const float* acc, int64_t D, bool prefill, uint64_t reached, float* out) {
  for (int64_t j = 0; j < D / 16; ++j) {
    auto set = [&](int64_t s) {
      if (kAllReached || (reached >> s & 1)) return _mm512_loadu_ps(acc + s * D + 16 * j);
      return _mm512_setzero_ps();
    };
    __m512 y[16];
    for (int l = 0; l < 16; ++l) {
      y[l] = prefill ? set(l) : _mm512_add_ps(_mm512_add_ps(set(l), set(32 + l)), _mm512_add_ps(set(16 + l), set(48 + l)));
    }
    _mm512_storeu_ps(out + 16 * j, reduce16_lanewise(y));
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
// e^(w - max) by expf_poly16, the sum in double per 16-position chunk.
void softmax_to_f16(float* w, int64_t n, float max) {
  const __m512 vmax = _mm512_set1_ps(max);
  double sum = 0;
  for (int64_t i = 0; i < n; i += 16) {
    const __m512 e = expf_poly16(_mm512_sub_ps(_mm512_loadu_ps(w + i), vmax));
    _mm512_storeu_ps(w + i, e);
    sum += static_cast<double>(_mm512_reduce_add_ps(e));
  }
  const __m512 inv = _mm512_set1_ps(static_cast<float>(1.0 / sum));
  for (int64_t i = 0; i < n; i += 16) _mm512_storeu_ps(w + i, round_f16(_mm512_mul_ps(_mm512_loadu_ps(w + i), inv)));
}

// The cache slot of each position in [pos_begin, pos_end), from the block table.
void slots_of(const PagedKV& kv, int64_t pos_begin, int64_t pos_end, std::vector<int64_t>& slots) {
  slots.resize(static_cast<size_t>(pos_end - pos_begin));
  for (int64_t p = pos_begin, block = p / kv.block_size, offset = p % kv.block_size; p < pos_end; ++p) {
    slots[p - pos_begin] = int64_t{kv.block_table[block]} * kv.block_size + offset;
    if (++offset == kv.block_size) offset = 0, ++block;
  }
}

// Lane l of the result is _mm512_reduce_add_ps(y[l]), to the bit: the same
// pairing tree (halves, quarters, pairs, then the last two), run on sixteen
// vectors at once with shuffles, a few instructions per vector instead of a
// chain of dependent ones.
inline __m512 reduce_add_16(const __m512* y) {
  // The tree leaves the sum of input j in lane 4 * (j % 4) + j / 4: inputs are
  // taken in that (self-inverse) order so that lane l ends up with y[l].
  static constexpr int kOrder[16] = {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};
  __m512 a[8], b[4], c[2];
  for (int k = 0; k < 8; ++k) {  // x[i] + x[i + 8], two vectors per result
    const __m512 p = y[kOrder[2 * k]], q = y[kOrder[2 * k + 1]];
    a[k] = _mm512_add_ps(_mm512_shuffle_f32x4(p, q, 0x44), _mm512_shuffle_f32x4(p, q, 0xEE));
  }
  for (int k = 0; k < 4; ++k) {  // a[i] + a[i + 4], four vectors per result
    b[k] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * k], a[2 * k + 1], 0x88),
                         _mm512_shuffle_f32x4(a[2 * k], a[2 * k + 1], 0xDD));
  }
  for (int k = 0; k < 2; ++k) {  // b[0] + b[2], b[1] + b[3]
    c[k] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * k], b[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(b[2 * k], b[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  }
  return _mm512_add_ps(_mm512_shuffle_ps(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_ps(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

// Decode's weighted sum of values for NH query heads, GGML's order: position
// p's product w_p * v_p goes into set p % 64 (summed in position order), and
// the 64 sets are folded as fold_sets does. Each 16-column slice of the
// output is built set by set in registers, in the order of the fold's tree,
// so the sets never go through memory: written out, the 64 sets of three
// heads are 48 KiB, and storing them cost more than all the arithmetic.
// w[h * w_stride + p - pos_begin] is head h's weight of position p.
// Up to about this many positions weighted_values_decode is the faster
// (build/attention_bench): beyond, it pays for walking the positions once per
// 16 columns (15-20% slower at 512 to 1,024), while storing the sets costs
// little per position.
constexpr int64_t kRegisterSetsMaxPositions = 384;

template <int NH>
void weighted_values_decode(const PagedKV& kv, const int64_t* slots, int64_t pos_begin, int64_t pos_end,
                            const float* w, int64_t w_stride, int64_t head_offset, int64_t D, float* out) {
  for (int64_t j = 0; j < D / 16; ++j) {
    // Set s of every head: its positions' products, summed in order.
    auto set = [&](int64_t s, __m512* sum) {
      for (int h = 0; h < NH; ++h) sum[h] = _mm512_setzero_ps();
      for (int64_t p = pos_begin + (s - pos_begin % 64 + 64) % 64; p < pos_end; p += 64) {
        const __m512 v = load_f16(kv.v + slots[p - pos_begin] * kv.slot_stride + head_offset + 16 * j);
        for (int h = 0; h < NH; ++h) sum[h] = _mm512_fmadd_ps(v, _mm512_set1_ps(w[h * w_stride + p - pos_begin]), sum[h]);
      }
    };
    // Lane l of GGML's 16-lane vectors: (set l + set 32+l) + (set 16+l + set 48+l).
    auto lane = [&](int64_t l, __m512* y) {
      __m512 a[NH], b[NH], c[NH], d[NH];
      set(l, a), set(32 + l, b), set(16 + l, c), set(48 + l, d);
      for (int h = 0; h < NH; ++h) y[h] = _mm512_add_ps(_mm512_add_ps(a[h], b[h]), _mm512_add_ps(c[h], d[h]));
    };
    // reduce16_lanewise's tree: t6[i] = (y[i+12] + y[i+4]) + (y[i+8] + y[i]).
    __m512 t6[4][NH];
    for (int64_t i = 0; i < 4; ++i) {
      __m512 y0[NH], y4[NH], y8[NH], y12[NH];
      lane(i, y0), lane(i + 4, y4), lane(i + 8, y8), lane(i + 12, y12);
      for (int h = 0; h < NH; ++h) t6[i][h] = _mm512_add_ps(_mm512_add_ps(y12[h], y4[h]), _mm512_add_ps(y8[h], y0[h]));
    }
    for (int h = 0; h < NH; ++h) {
      _mm512_storeu_ps(out + h * D + 16 * j,
                       _mm512_add_ps(_mm512_add_ps(t6[0][h], t6[2][h]), _mm512_add_ps(t6[1][h], t6[3][h])));
    }
  }
}

// NH query heads over one key/value head, D % 64 == 0. The same arithmetic
// per head as attend_one_head_avx512, organized for speed: each key and value
// is widened once for all NH heads, and scores come sixteen positions at a
// time (reduce_add_16).
template <int NH>
void attend_heads_avx512(const float* q_in, const PagedKV& kv, int64_t head_offset, int64_t D, int64_t pos_begin,
                         int64_t pos_end, float scale, AttentionPass pass, float* out) {
  const int64_t nv = D / 16;
  const bool prefill = pass == AttentionPass::kPrefill;
  thread_local std::vector<float> q, keys, weights, acc;
  thread_local std::vector<int64_t> slots;  // cache slot of each position, from the block table
  q.resize(static_cast<size_t>(NH * D));
  for (int64_t i = 0; i < NH * D; i += 16) _mm512_storeu_ps(&q[i], round_f16(_mm512_loadu_ps(q_in + i)));
  slots_of(kv, pos_begin, pos_end, slots);

  // Scores over whole 16-position chunks; positions outside the range are masked.
  const int64_t c0 = pos_begin - pos_begin % 16;
  const int64_t n = (pos_end - c0 + 15) / 16 * 16;
  keys.resize(static_cast<size_t>(16 * D));
  weights.resize(static_cast<size_t>(NH * n));
  __m512 vmax[NH];
  for (int h = 0; h < NH; ++h) vmax[h] = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t ch = c0; ch < pos_end; ch += 16) {
    const int64_t lo = std::max(ch, pos_begin) - ch, hi = std::min(ch + 16, pos_end) - ch;
    for (int64_t l = 0; l < 16; ++l) {  // the chunk's keys, widened once; zero outside the range
      float* dst = &keys[l * D];
      if (l < lo || l >= hi) {
        std::fill(dst, dst + D, 0.0f);
        continue;
      }
      const uint16_t* k = kv.k + slots[ch + l - pos_begin] * kv.slot_stride + head_offset;
      for (int64_t j = 0; j < nv; ++j) _mm512_storeu_ps(dst + 16 * j, load_f16(k + 16 * j));
    }
    const __mmask16 valid = static_cast<__mmask16>(((1u << hi) - 1) & ~((1u << lo) - 1));
    for (int h = 0; h < NH; ++h) {
      const float* qh = &q[h * D];
      __m512 y[16];
      for (int l = 0; l < 16; ++l) {
        const float* k = &keys[l * D];
        if (prefill) {  // tinyBLAS: one accumulator
          __m512 c = _mm512_setzero_ps();
          for (int64_t j = 0; j < nv; ++j) c = _mm512_fmadd_ps(_mm512_loadu_ps(k + 16 * j), _mm512_loadu_ps(qh + 16 * j), c);
          y[l] = c;
        } else {  // ggml_vec_dot_f16: four accumulators over 64-element steps
          __m512 sum[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
          for (int64_t j = 0; j < nv; j += 4)
            for (int a = 0; a < 4; ++a)
              sum[a] = _mm512_fmadd_ps(_mm512_loadu_ps(k + 16 * (j + a)), _mm512_loadu_ps(qh + 16 * (j + a)), sum[a]);
          y[l] = _mm512_add_ps(_mm512_add_ps(sum[0], sum[2]), _mm512_add_ps(sum[1], sum[3]));
        }
      }
      const __m512 s = _mm512_mask_mul_ps(_mm512_set1_ps(-std::numeric_limits<float>::infinity()), valid,
                                          reduce_add_16(y), _mm512_set1_ps(scale));
      _mm512_storeu_ps(&weights[h * n + ch - c0], s);
      vmax[h] = _mm512_max_ps(vmax[h], s);
    }
  }
  for (int h = 0; h < NH; ++h) {
    float* w = &weights[h * n];
    softmax_to_f16(w, n, _mm512_reduce_max_ps(vmax[h]));
  }

  if (!prefill && pos_end - pos_begin <= kRegisterSetsMaxPositions) {
    weighted_values_decode<NH>(kv, slots.data(), pos_begin, pos_end, weights.data() + (pos_begin - c0), n, head_offset,
                               D, out);
    return;
  }
  // Otherwise partial sums per position lane (p mod 16; mod 64 for decode),
  // each a D-vector summed in registers four vectors at a time for all NH
  // heads, stored, then folded.
  const int64_t n_sets = prefill ? 16 : 64;
  const int64_t head_acc = n_sets * D;
  acc.resize(static_cast<size_t>(NH * head_acc));
  const int64_t used = std::min(n_sets, pos_end - pos_begin);
  for (int64_t p0 = pos_begin; p0 < pos_begin + used; ++p0) {
    for (int64_t j = 0; j < nv; j += 4) {
      __m512 a[NH][4];
      for (int h = 0; h < NH; ++h)
        for (int i = 0; i < 4; ++i) a[h][i] = _mm512_setzero_ps();
      for (int64_t p = p0; p < pos_end; p += n_sets) {
        const uint16_t* v = kv.v + slots[p - pos_begin] * kv.slot_stride + head_offset + 16 * j;
        __m512 vf[4];
        for (int i = 0; i < 4; ++i) vf[i] = load_f16(v + 16 * i);
        for (int h = 0; h < NH; ++h) {
          const __m512 w = _mm512_set1_ps(weights[h * n + p - c0]);
          for (int i = 0; i < 4; ++i) a[h][i] = _mm512_fmadd_ps(vf[i], w, a[h][i]);
        }
      }
      for (int h = 0; h < NH; ++h) {
        float* dst = &acc[h * head_acc + (p0 % n_sets) * D + 16 * j];
        for (int i = 0; i < 4; ++i) _mm512_storeu_ps(dst + 16 * i, a[h][i]);
      }
    }
  }
  const uint64_t reached = sets_reached(pos_begin, used, n_sets);
  for (int h = 0; h < NH; ++h) {
    fold_partial_sums(&acc[h * head_acc], D, prefill, reached, out + h * D);
  }
}

}  // namespace

void attend_heads_avx512(const float* q, int64_t n_heads, const PagedKV& kv, int64_t head_offset, int64_t D,
                         int64_t pos_begin, int64_t pos_end, float scale, AttentionPass pass, float* out) {
  for (int64_t h = 0; h < n_heads;) {
    const int64_t nh = D % 64 == 0 ? std::min<int64_t>(n_heads - h, 4) : 0;  // 0: one head, the general kernel
    const float* qh = q + h * D;
    float* oh = out + h * D;
    switch (nh) {
      case 4: attend_heads_avx512<4>(qh, kv, head_offset, D, pos_begin, pos_end, scale, pass, oh); break;
      case 3: attend_heads_avx512<3>(qh, kv, head_offset, D, pos_begin, pos_end, scale, pass, oh); break;
      case 2: attend_heads_avx512<2>(qh, kv, head_offset, D, pos_begin, pos_end, scale, pass, oh); break;
      case 1: attend_heads_avx512<1>(qh, kv, head_offset, D, pos_begin, pos_end, scale, pass, oh); break;
      default: attend_one_head_avx512(qh, kv, head_offset, D, pos_begin, pos_end, scale, pass, oh); break;
    }
    h += std::max<int64_t>(nh, 1);
  }
}

void attend_one_head_avx512(const float* q_in, const PagedKV& kv, int64_t head_offset, int64_t D, int64_t pos_begin,
                            int64_t pos_end, float scale, AttentionPass pass, float* out) {
  if (D % 16 != 0 || D > 256) {
    attend_one_head_scalar(q_in, kv, head_offset, D, pos_begin, pos_end, scale, pass, out);
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
    const uint16_t* k = kv.k + slots[p - pos_begin] * kv.slot_stride + head_offset;
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
  softmax_to_f16(weights.data(), n, max);

  // Partial sums per position lane (p mod 16; mod 64 for decode: four
  // accumulators of 16 lanes), each a D-vector held in registers while its
  // positions (every n_sets-th) are summed.
  const int64_t n_sets = prefill ? 16 : 64;
  acc.resize(static_cast<size_t>(n_sets * D));
  const int64_t used = std::min(n_sets, pos_end - pos_begin);
  for (int64_t p0 = pos_begin; p0 < pos_begin + used; ++p0) {
    __m512 a[16];
    for (int64_t j = 0; j < nv; ++j) a[j] = _mm512_setzero_ps();
    for (int64_t p = p0; p < pos_end; p += n_sets) {
      const uint16_t* v = kv.v + slots[p - pos_begin] * kv.slot_stride + head_offset;
      const __m512 w = _mm512_set1_ps(weights[p - c0]);
      for (int64_t j = 0; j < nv; ++j) a[j] = _mm512_fmadd_ps(load_f16(v + 16 * j), w, a[j]);
    }
    float* dst = &acc[(p0 % n_sets) * D];
    for (int64_t j = 0; j < nv; ++j) _mm512_storeu_ps(dst + 16 * j, a[j]);
  }
  fold_partial_sums(acc.data(), D, prefill, sets_reached(pos_begin, used, n_sets), out);
}

}  // namespace inferd::kernels::detail
