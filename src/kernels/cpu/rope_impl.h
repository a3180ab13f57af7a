// The body of rope_head, compiled twice: in rope.cpp for any x86-64 CPU (where
// std::fma is a library call) and in rope_avx2.cpp with FMA instructions. Both
// give the same bits.
#pragma once
#include <cmath>

#include "kernels/cpu/rope.h"

namespace inferd::kernels::detail {

// Internal linkage: this header is compiled with different instruction sets in
// different files, and one shared out-of-line copy could carry the wrong ones.
namespace {

inline void rope_head_body(float* x, int64_t rope_dim, RopePairs pairs, const float* cos_t, const float* sin_t) {
  const int64_t half = rope_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const int64_t a = pairs == RopePairs::kAdjacent ? 2 * i : i;
    const int64_t b = pairs == RopePairs::kAdjacent ? 2 * i + 1 : i + half;
    const float x0 = x[a], x1 = x[b];
    x[a] = std::fma(x0, cos_t[i], -(x1 * sin_t[i]));
    x[b] = std::fma(x0, sin_t[i], x1 * cos_t[i]);
  }
}

}  // namespace

}  // namespace inferd::kernels::detail
