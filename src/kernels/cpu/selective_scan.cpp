#include "kernels/cpu/selective_scan.h"

#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/selective_scan_impl.h"

namespace inferd::kernels {

namespace detail {

void selective_scan_scalar_avx512_order(const SelectiveScanArgs& a, int64_t h0, int64_t h1) {
  selective_scan_of<PortableAvx512Order>(a, h0, h1);
}
void selective_scan_scalar_avx2_order(const SelectiveScanArgs& a, int64_t h0, int64_t h1) {
  selective_scan_of<PortableAvx2Order>(a, h0, h1);
}

}  // namespace detail

void fill_selective_scan_kernels(FloatKernels& ops, SimdLevel level) {
  constexpr int k512 = static_cast<int>(GgmlFlavour::kAvx512), k2 = static_cast<int>(GgmlFlavour::kAvx2);
  if (level >= SimdLevel::kAvx512) {
    ops.selective_scan[k512] = detail::selective_scan_avx512_avx512_order;
    ops.selective_scan[k2] = detail::selective_scan_avx512_avx2_order;
  } else if (level >= SimdLevel::kAvx2) {
    ops.selective_scan[k512] = detail::selective_scan_avx2_avx512_order;
    ops.selective_scan[k2] = detail::selective_scan_avx2_avx2_order;
  } else {
    ops.selective_scan[k512] = detail::selective_scan_scalar_avx512_order;
    ops.selective_scan[k2] = detail::selective_scan_scalar_avx2_order;
  }
}

void selective_scan(const SelectiveScanArgs& a, int64_t h0, int64_t h1, GgmlFlavour flavour) {
  kernel_table().ops.selective_scan[static_cast<int>(flavour)](a, h0, h1);
}

}  // namespace inferd::kernels
