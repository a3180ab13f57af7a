// range_max's body, compiled once per level (argmax*.cpp) with that level's
// register width W and C independent chains of registers (a compare and a
// blend each step is a dependency chain: one chain runs at its latency, not
// at the loads' speed). Internal linkage, like the other *_impl.h bodies.
#pragma once
#include <cstdint>
#include <limits>

#include "kernels/cpu/argmax.h"

namespace inferd::kernels::detail {
namespace {

typedef float F32x4 __attribute__((vector_size(16)));
typedef int32_t I32x4 __attribute__((vector_size(16)));
typedef float F32x8 __attribute__((vector_size(32)));
typedef int32_t I32x8 __attribute__((vector_size(32)));
typedef float F32x16 __attribute__((vector_size(64)));
typedef int32_t I32x16 __attribute__((vector_size(64)));
template <int W> struct ArgmaxLanes;
template <> struct ArgmaxLanes<4> { using F = F32x4; using I = I32x4; };
template <> struct ArgmaxLanes<8> { using F = F32x8; using I = I32x8; };
template <> struct ArgmaxLanes<16> { using F = F32x16; using I = I32x16; };

// Each of the W * C lanes keeps its largest value and the first index that
// held it; then the largest of all and the lowest index holding it. n < 2^31
// (the lanes' indices are 32-bit).
template <int W, int C>
inline RangeMax range_max_body(const float* x, int64_t n) {
  using F = typename ArgmaxLanes<W>::F;
  using I = typename ArgmaxLanes<W>::I;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  F best[C];
  I at[C], index[C];
  for (int c = 0; c < C; ++c)
    for (int l = 0; l < W; ++l) {
      best[c][l] = kNegInf;
      at[c][l] = 0;
      index[c][l] = c * W + l;
    }
  int64_t i = 0;
  for (; i + W * C <= n; i += W * C)
    for (int c = 0; c < C; ++c) {
      F v;
      __builtin_memcpy(&v, x + i + c * W, sizeof v);
      const I greater = v > best[c];  // false for NaN: a NaN never replaces a lane's best
      best[c] = greater ? v : best[c];
      at[c] = greater ? index[c] : at[c];
      index[c] += W * C;
    }
  float value = kNegInf;
  for (int c = 0; c < C; ++c)
    for (int l = 0; l < W; ++l) value = best[c][l] > value ? best[c][l] : value;
  int64_t first = -1;
  if (value > kNegInf)
    for (int c = 0; c < C; ++c)
      for (int l = 0; l < W; ++l)
        if (best[c][l] == value && (first < 0 || at[c][l] < first)) first = at[c][l];
  for (; i < n; ++i)  // the tail comes after every lane's index: only a larger value replaces
    if (x[i] > value) {
      value = x[i];
      first = i;
    }
  if (first < 0)  // nothing above -inf: the first -inf, if any
    for (int64_t j = 0; j < n; ++j)
      if (x[j] == kNegInf) return {kNegInf, j};
  return {value, first};
}

}  // namespace
}  // namespace inferd::kernels::detail
