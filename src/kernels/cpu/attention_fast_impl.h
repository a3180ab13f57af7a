// Steps the fast attention kernels share (attention_fast.cpp's reference and
// attention_fast_avx2.cpp), so the levels give the same bits. Internal
// linkage: each file is compiled with its own instruction set.
#pragma once
#include <algorithm>
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
