// swiglu with FMA instructions (compiled with -mfma).
#include "kernels/cpu/activation.h"

namespace inferd::kernels::detail {

void swiglu_fma(const float* gate, const float* up, float* out, int64_t n) { swiglu_portable(gate, up, out, n); }

}  // namespace inferd::kernels::detail
