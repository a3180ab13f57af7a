#include "kernels/cpu/argmax.h"

#include "kernels/cpu/argmax_impl.h"
#include "kernels/cpu/kernel_table.h"

namespace inferd::kernels {

namespace detail {
RangeMax range_max_scalar(const float* x, int64_t n) { return range_max_body<4, 4>(x, n); }  // SSE2 registers on x86-64
}  // namespace detail

void fill_argmax_kernels(FloatKernels& ops, SimdLevel level) {
  ops.range_max = level >= SimdLevel::kAvx512 ? detail::range_max_avx512
                  : level >= SimdLevel::kAvx2 ? detail::range_max_avx2
                                              : detail::range_max_scalar;
}

RangeMax range_max(const float* x, int64_t n) { return kernel_table().ops.range_max(x, n); }

}  // namespace inferd::kernels
