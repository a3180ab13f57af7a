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
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t* v = kv.v + slot_of(kv, tile + i) * kv.slot_stride + head_offset;
      const float w = std::exp(scores[i] - new_max);
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
