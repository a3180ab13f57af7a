#include "kernels/cpu/gated_delta_rule.h"

#include "kernels/cpu/gated_delta_rule_impl.h"
#include "kernels/cpu/kernel_table.h"

namespace inferd::kernels {

namespace detail {

void gated_delta_rule_scalar_avx512_order(const GatedDeltaArgs& a, int64_t h0, int64_t h1) {
  gated_delta_rule_of<PortableAvx512Order>(a, h0, h1);
}
void gated_delta_rule_scalar_avx2_order(const GatedDeltaArgs& a, int64_t h0, int64_t h1) {
  gated_delta_rule_of<PortableAvx2Order>(a, h0, h1);
}

}  // namespace detail

void fill_gated_delta_rule_kernels(FloatKernels& ops, SimdLevel level) {
  constexpr int k512 = static_cast<int>(GgmlFlavour::kAvx512), k2 = static_cast<int>(GgmlFlavour::kAvx2);
  if (level >= SimdLevel::kAvx512) {
    ops.gated_delta_rule[k512] = detail::gated_delta_rule_avx512_avx512_order;
    ops.gated_delta_rule[k2] = detail::gated_delta_rule_avx512_avx2_order;
  } else if (level >= SimdLevel::kAvx2) {
    ops.gated_delta_rule[k512] = detail::gated_delta_rule_avx2_avx512_order;
    ops.gated_delta_rule[k2] = detail::gated_delta_rule_avx2_avx2_order;
  } else {
    ops.gated_delta_rule[k512] = detail::gated_delta_rule_scalar_avx512_order;
    ops.gated_delta_rule[k2] = detail::gated_delta_rule_scalar_avx2_order;
  }
}

void gated_delta_rule(const GatedDeltaArgs& a, int64_t h0, int64_t h1, GgmlFlavour flavour) {
  kernel_table().ops.gated_delta_rule[static_cast<int>(flavour)](a, h0, h1);
}

}  // namespace inferd::kernels
