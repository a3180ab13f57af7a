// range_max's body, compiled once per level (argmax*.cpp); internal linkage,
// like the other *_impl.h bodies. GCC vector types keep 16 lanes however wide
// the registers are.
#pragma once
#include <cstdint>
#include <limits>

#include "kernels/cpu/argmax.h"

namespace inferd::kernels::detail {
namespace {

// n < 2^31 (the lanes' indices are 32-bit).
inline RangeMax range_max_body(const float* x, int64_t n) {
  typedef float F16x __attribute__((vector_size(64)));
  typedef int32_t I16x __attribute__((vector_size(64)));
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  F16x best = {};
  I16x at = {}, index = {};
  for (int l = 0; l < 16; ++l) {
    best[l] = kNegInf;
    index[l] = l;
  }
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    F16x v;
    __builtin_memcpy(&v, x + i, sizeof v);
    const I16x greater = v > best;  // false for NaN: a NaN never replaces a lane's best
    best = greater ? v : best;
    at = greater ? index : at;
    index += 16;
  }
  float value = kNegInf;
  for (int l = 0; l < 16; ++l) value = best[l] > value ? best[l] : value;
  int64_t first = -1;
  if (value > kNegInf)
    for (int l = 0; l < 16; ++l)
      if (best[l] == value && (first < 0 || at[l] < first)) first = at[l];
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
