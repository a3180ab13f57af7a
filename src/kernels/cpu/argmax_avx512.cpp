// range_max compiled for AVX512 (this file's name sets its flags).
#include "kernels/cpu/argmax_impl.h"

namespace inferd::kernels::detail {

RangeMax range_max_avx512(const float* x, int64_t n) { return range_max_body<16, 2>(x, n); }

}  // namespace inferd::kernels::detail
