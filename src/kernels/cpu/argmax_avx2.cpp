// range_max compiled for AVX2 (this file's name sets its flags).
#include "kernels/cpu/argmax_impl.h"

namespace inferd::kernels::detail {

RangeMax range_max_avx2(const float* x, int64_t n) { return range_max_body<8, 4>(x, n); }

}  // namespace inferd::kernels::detail
