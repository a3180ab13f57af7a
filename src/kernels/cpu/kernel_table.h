// The table of CPU kernels chosen once at startup by dispatch.cpp (internal).
//
// Each SIMD translation unit fills in the entries it implements; the rest stay
// on the scalar reference. Indexed by the GGML type number.
#pragma once
#include <cstddef>
#include <cstdint>

namespace inferd::kernels {

// Dot product of one weight row `a` with one activation row `b` (n elements).
using VecDotFn = float (*)(int64_t n, const void* a, const void* b);
// Dot products of one weight row with `nb` (1..4) activation rows spaced
// `b_stride` bytes apart. out[i] must be bit-identical to VecDotFn on row i:
// it only exists so the weight row is unpacked once for several tokens.
using VecDotMultiFn = void (*)(int64_t n, const void* a, const void* b, size_t b_stride,
                               int nb, float* out);
using QuantizeRowFn = void (*)(const float* src, void* dst, int64_t n);
using DequantizeRowFn = void (*)(const void* src, float* dst, int64_t n);

constexpr int kMaxMultiRows = 4;
constexpr int kNumTypeSlots = 32;  // GGML type numbers we know are all below this

struct TypeKernels {
  VecDotFn vec_dot = nullptr;
  VecDotMultiFn vec_dot_multi = nullptr;
  QuantizeRowFn quantize_row = nullptr;
  DequantizeRowFn dequantize_row = nullptr;
};

struct KernelTable {
  TypeKernels type[kNumTypeSlots];
  const char* level = "scalar";
};

enum class SimdLevel { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

// The best level this CPU (and OS) supports.
SimdLevel best_simd_level();
// A table for `level` (which must not exceed best_simd_level()). Tests build
// one per level to check each against the scalar reference.
KernelTable build_kernel_table(SimdLevel level);

// The table in use: best_simd_level(), or INFERD_SIMD=scalar|avx2|avx512
// capped at it. Built on first call, immutable afterwards.
const KernelTable& kernel_table();

// Fillers, one per translation unit. They only overwrite what they implement.
void fill_scalar_kernels(KernelTable& t);                   // quants_ref.cpp
void fill_avx2_kernels(KernelTable& t);                     // quants_avx2.cpp
void fill_avx512_kernels(KernelTable& t);                   // quants_avx512.cpp

}  // namespace inferd::kernels
