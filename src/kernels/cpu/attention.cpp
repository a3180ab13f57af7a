#include "kernels/cpu/attention.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "kernels/cpu/quants.h"

namespace inferd::kernels {

namespace detail {

// Scores are computed a tile at a time, then the running max/sum and the
// output accumulator are rescaled once per tile (online softmax).
void attend_one_head_scalar(const float* q, const PagedKV& kv, int64_t head_offset, int64_t D,
                            int64_t pos_begin, int64_t pos_end, float scale, float* out) {
  constexpr int64_t kTile = 64;
  float scores[kTile];
  float running_max = -std::numeric_limits<float>::infinity();
  float running_sum = 0.0f;
  for (int64_t d = 0; d < D; ++d) out[d] = 0.0f;
  for (int64_t tile = pos_begin; tile < pos_end; tile += kTile) {
    const int64_t n = std::min(kTile, pos_end - tile);
    float tile_max = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t p = tile + i;
      const int64_t slot = int64_t{kv.block_table[p / kv.block_size]} * kv.block_size + p % kv.block_size;
      const uint16_t* k = kv.k + slot * kv.slot_stride + head_offset;
      float s = 0.0f;
      for (int64_t d = 0; d < D; ++d) s += q[d] * f16_to_f32(k[d]);
      scores[i] = s * scale;
      tile_max = std::max(tile_max, scores[i]);
    }
    const float new_max = std::max(running_max, tile_max);
    const float correction = std::exp(running_max - new_max);
    running_sum *= correction;
    for (int64_t d = 0; d < D; ++d) out[d] *= correction;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t p = tile + i;
      const int64_t slot = int64_t{kv.block_table[p / kv.block_size]} * kv.block_size + p % kv.block_size;
      const uint16_t* v = kv.v + slot * kv.slot_stride + head_offset;
      const float w = std::exp(scores[i] - new_max);
      running_sum += w;
      for (int64_t d = 0; d < D; ++d) out[d] += w * f16_to_f32(v[d]);
    }
    running_max = new_max;
  }
  const float inv = running_sum > 0.0f ? 1.0f / running_sum : 0.0f;
  for (int64_t d = 0; d < D; ++d) out[d] *= inv;
}

}  // namespace detail

namespace {

using AttendFn = void (*)(const float*, const PagedKV&, int64_t, int64_t, int64_t, int64_t, float,
                          float*);

// Same level as the quantized kernels (CPU features and INFERD_SIMD).
AttendFn pick_attention() {
  return std::strcmp(simd_level(), "avx512vnni") == 0 ? detail::attend_one_head_avx512
                                                  : detail::attend_one_head_scalar;
}

}  // namespace

void attend_one_head(const float* q, const PagedKV& kv, int64_t head_offset, int64_t D,
                     int64_t pos_begin, int64_t pos_end, float scale, float* out) {
  static const AttendFn fn = pick_attention();
  fn(q, kv, head_offset, D, pos_begin, pos_end, scale, out);
}

}  // namespace inferd::kernels
