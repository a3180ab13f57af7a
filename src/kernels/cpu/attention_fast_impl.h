// Steps the fast attention kernels share (attention_fast.cpp's reference and
// attention_fast_avx2.cpp), so the levels give the same bits. Internal
// linkage: each file is compiled with its own instruction set.
#pragma once
#include <cmath>

#include "kernels/cpu/expf_poly.h"

namespace inferd::kernels::detail {
namespace {

// The eight lanes' sum, in attention_fast.h's order.
inline float lane_sum(const float* lanes) {
  return ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
}

// A part's weight in the join: e^(m - M), 1 exactly where its maximum is the whole one.
inline float part_weight(float m, float M) { return m == M ? 1.0f : m == -INFINITY ? 0.0f : expf_poly(m - M); }

}  // namespace
}  // namespace inferd::kernels::detail
