// AVX-512 attention: f16 keys and values are widened 16 at a time.
#include <immintrin.h>

#include <cmath>
#include <limits>

#include "kernels/cpu/attention.h"

namespace inferd::kernels::detail {

namespace {

inline int64_t slot_of(const PagedKV& kv, int64_t p) {
  return int64_t{kv.block_table[p / kv.block_size]} * kv.block_size + p % kv.block_size;
}

// e^x for x <= 0 (softmax weights), 16 at a time: x = n ln2 + r with |r| <= ln2/2,
// e^r by its degree-6 Taylor polynomial (relative error below 2e-7), times 2^n.
// A scalar exp per position cost more than the position's dot products.
inline __m512 exp_nonpositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));  // e^-87 ~ 1.6e-38: still a normal float
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);  // ln2, high bits
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);     // ln2, low bits
  __m512 p = _mm512_set1_ps(1.0f / 720);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

}  // namespace

void attend_one_head_avx512(const float* q, const PagedKV& kv, int64_t head_offset, int64_t D,
                            int64_t pos_begin, int64_t pos_end, float scale, float* out) {
  if (D % 16 != 0 || D > 512) {
    attend_one_head_scalar(q, kv, head_offset, D, pos_begin, pos_end, scale, out);
    return;
  }
  constexpr int64_t kTile = 64;
  const int64_t nv = D / 16;
  __m512 qv[32], acc[32];
  for (int64_t j = 0; j < nv; ++j) {
    qv[j] = _mm512_loadu_ps(q + 16 * j);
    acc[j] = _mm512_setzero_ps();
  }
  float scores[kTile];
  float running_max = -std::numeric_limits<float>::infinity();
  float running_sum = 0.0f;
  for (int64_t tile = pos_begin; tile < pos_end; tile += kTile) {
    const int64_t n = std::min(kTile, pos_end - tile);
    float tile_max = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t* k = kv.k + slot_of(kv, tile + i) * kv.slot_stride + head_offset;
      __m512 s = _mm512_setzero_ps();
      for (int64_t j = 0; j < nv; ++j) {
        const __m512 kf = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(k + 16 * j)));
        s = _mm512_fmadd_ps(qv[j], kf, s);
      }
      scores[i] = _mm512_reduce_add_ps(s) * scale;
      tile_max = std::max(tile_max, scores[i]);
    }
    const float new_max = std::max(running_max, tile_max);
    const float correction = std::exp(running_max - new_max);
    running_sum *= correction;
    const __m512 corr = _mm512_set1_ps(correction);
    for (int64_t j = 0; j < nv; ++j) acc[j] = _mm512_mul_ps(acc[j], corr);
    float weights[kTile];
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 m = n - i >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << (n - i)) - 1);
      const __m512 sc = _mm512_maskz_loadu_ps(m, scores + i);
      _mm512_mask_storeu_ps(weights + i, m, exp_nonpositive(_mm512_sub_ps(sc, _mm512_set1_ps(new_max))));
    }
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t* v = kv.v + slot_of(kv, tile + i) * kv.slot_stride + head_offset;
      const float w = weights[i];
      running_sum += w;
      const __m512 wv = _mm512_set1_ps(w);
      for (int64_t j = 0; j < nv; ++j) {
        const __m512 vf = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + 16 * j)));
        acc[j] = _mm512_fmadd_ps(wv, vf, acc[j]);
      }
    }
    running_max = new_max;
  }
  const __m512 inv = _mm512_set1_ps(running_sum > 0.0f ? 1.0f / running_sum : 0.0f);
  for (int64_t j = 0; j < nv; ++j) _mm512_storeu_ps(out + 16 * j, _mm512_mul_ps(acc[j], inv));
}

}  // namespace inferd::kernels::detail
