#include "kernels/cpu/rms_norm.h"

namespace inferd::kernels::detail {

double sum_squares_lanes_avx512(const float* x, const float* h, int64_t n) {
  return sum_squares_lanes_portable(x, h, n);
}

}  // namespace inferd::kernels::detail
