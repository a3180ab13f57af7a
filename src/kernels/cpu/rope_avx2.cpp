// rope_head with FMA instructions (this file is compiled with -mfma).
#include "kernels/cpu/rope_impl.h"

namespace inferd::kernels::detail {

void rope_head_fma(float* x, int64_t rope_dim, RopePairs pairs, const float* cos_t, const float* sin_t) {
  rope_head_body(x, rope_dim, pairs, cos_t, sin_t);
}

}  // namespace inferd::kernels::detail
