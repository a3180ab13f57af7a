// AVX2 + FMA + F16C kernels (compiled with -mavx2 -mfma -mf16c -mbmi2; only
// called after dispatch.cpp has checked the CPU supports them).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/kquant_layout.h"
#include "kernels/cpu/packed_layout.h"
#include "kernels/cpu/weight_prefetch_x86.h"
#include "kernels/cpu/quants_blocks.h"

namespace inferd::kernels {
namespace {
#define INFERD_X86_AVX512 0
#include "kernels/cpu/quants_x86_impl.h"
#include "kernels/cpu/packed_x86_impl.h"
#include "kernels/cpu/kquant_x86_impl.h"
#undef INFERD_X86_AVX512
}  // namespace

void fill_avx2_kernels(KernelTable& table) {
  fill_x86(table);
  fill_x86_packed(table);
  fill_x86_kquant(table);
  table.level = "avx2";
}

}  // namespace inferd::kernels
