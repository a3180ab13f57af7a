// The largest value of a float range and the first index holding it: the
// greedy choice of a token from a row of logits.
//
// One pass, in lanes that each keep their largest value and the first index
// that held it (a running index in one register is a chain of dependent
// compares; a second pass looking for the maximum reads the row again).
// NaNs never compare greater, so a NaN is never chosen unless the range holds
// nothing else.
#pragma once
#include <cstdint>

namespace inferd::kernels {

struct RangeMax {
  float value;    // the largest non-NaN value (-inf when there is none)
  int64_t index;  // the first index holding it, from the range's start; -1: every value NaN
};

// The largest value of x[0, n) and the first index holding it.
RangeMax range_max(const float* x, int64_t n);

namespace detail {
RangeMax range_max_scalar(const float* x, int64_t n);
RangeMax range_max_avx2(const float* x, int64_t n);
RangeMax range_max_avx512(const float* x, int64_t n);
}  // namespace detail

}  // namespace inferd::kernels
