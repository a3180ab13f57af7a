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

int64_t first_index_of_max(const RangeMax* parts, const int64_t* offsets, int n_parts) {
  int best = -1;
  for (int i = 0; i < n_parts; ++i)  // strictly greater: an earlier range keeps a tie
    if (parts[i].index >= 0 && (best < 0 || parts[i].value > parts[best].value)) best = i;
  return best < 0 ? 0 : offsets[best] + parts[best].index;
}

}  // namespace inferd::kernels
