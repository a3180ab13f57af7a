#include "kernels/cpu/rope.h"

#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/quants.h"
#include "kernels/cpu/rope_impl.h"

namespace inferd::kernels {

namespace detail {
void rope_head_scalar(float* x, int64_t rope_dim, RopePairs pairs, const float* cos_t, const float* sin_t) {
  rope_head_body(x, rope_dim, pairs, cos_t, sin_t);
}
}  // namespace detail

void fill_rope_kernels(FloatKernels& ops, SimdLevel level) {
  ops.rope_head = level >= SimdLevel::kAvx2 ? detail::rope_head_fma : detail::rope_head_scalar;  // AVX2 and up have FMA
}

void rope_head(float* x, int64_t rope_dim, RopePairs pairs, const float* cos_t, const float* sin_t) {
  kernel_table().ops.rope_head(x, rope_dim, pairs, cos_t, sin_t);
}

}  // namespace inferd::kernels
