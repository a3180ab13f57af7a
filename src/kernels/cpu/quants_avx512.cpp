// AVX-512 kernels: the shared x86 kernels with VNNI dot products (dpbusd on
// 256-bit vectors via AVX-512VL), mask-register bit unpacking and 512-bit float
// dots. Only called after dispatch.cpp has checked avx512f/bw/vl/dq/vnni; the
// AMX kernels only after amx_usable().
// GCC 12 reports its own _mm512_undefined_* placeholders as maybe-uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
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
#define INFERD_X86_AVX512 1
#include "kernels/cpu/quants_x86_impl.h"
#include "kernels/cpu/packed_x86_impl.h"
#include "kernels/cpu/kquant_x86_impl.h"
#include "kernels/cpu/kquant_amx_impl.h"
#undef INFERD_X86_AVX512
}  // namespace

void fill_avx512_kernels(KernelTable& table) {
  fill_x86(table);
  fill_x86_packed(table);
  fill_x86_kquant(table);
  table.level = "avx512vnni";
}

void fill_amx_kernels(KernelTable& table) {
  table.q4k_groups = q4k_groups_amx;
  table.level = "amx";
}

}  // namespace inferd::kernels
