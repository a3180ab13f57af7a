// Steps the fast attention kernels share (attention_fast.cpp's reference and
// attention_fast_avx2.cpp), so the levels give the same bits. Internal
// linkage: each file is compiled with its own instruction set.
#pragma once
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/attention_fast.h"
#include "kernels/cpu/expf_poly.h"

namespace inferd::kernels::detail {
namespace {

// The eight lanes' sum, in attention_fast.h's order.
inline float lane_sum(const float* lanes) {
  return ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
}

// The rows of a block of an integer product, kBlock of them: r < n their
// own, the rest the last (whose repeated sums are not stored).
template <int kBlock>
inline void block_rows(const int16_t* const* rows, int64_t n, const int16_t** out) {
  for (int r = 0; r < kBlock; ++r) out[r] = rows[std::min<int64_t>(r, n - 1)];
}

// attention_fast.h's integer codes: a vector's step from its largest |x|, the
// step's inverse, and one code (rne as cvtps2dq: NaN or out of range give
// INT32_MIN before the clamp).
inline float code_step(float amax, int32_t cmax) { return amax / static_cast<float>(cmax); }
inline float code_inverse(float step) { return step != 0.0f ? 1.0f / step : 0.0f; }
inline int32_t code_of(float x, float id, int32_t lo, int32_t hi) {
  const float y = x * id;
  const int32_t r = y >= -2147483648.0f && y < 2147483648.0f ? static_cast<int32_t>(std::nearbyint(y)) : INT32_MIN;
  return std::clamp(r, lo, hi);
}

// A part's weight in the join: e^(m - M), 1 exactly where its maximum is the whole one.
inline float part_weight(float m, float M) { return m == M ? 1.0f : m == -INFINITY ? 0.0f : expf_poly(m - M); }

// attention_fast.h's join, head by head. `accumulate(w, part_o, o)` sets
// o[d] = fma(w, part_o[d], o[d]) and `normalize(inv, o)` o[d] = o[d] * inv
// for d < D: each level gives its own form of those two steps.
template <typename Accumulate, typename Normalize>
void join_states(const FastAttentionState& parts, int64_t n_parts, int64_t n_heads, int64_t D, const float* sinks,
                 float* out, Accumulate&& accumulate, Normalize&& normalize) {
  for (int64_t h = 0; h < n_heads; ++h) {
    float M = sinks ? sinks[h] : -INFINITY;
    for (int64_t p = 0; p < n_parts; ++p) M = std::max(M, parts.m[p * n_heads + h]);
    float sum = 0.0f;
    float* o = out + h * D;
    std::fill(o, o + D, 0.0f);
    for (int64_t p = 0; p < n_parts; ++p) {
      const int64_t r = p * n_heads + h;
      const float w = part_weight(parts.m[r], M);
      sum = std::fma(lane_sum(parts.lanes + 8 * r), w, sum);
      accumulate(w, parts.o + r * D, o);
    }
    if (sinks) sum += expf_poly(sinks[h] - M);
    normalize(1.0f / sum, o);
  }
}

}  // namespace
}  // namespace inferd::kernels::detail
