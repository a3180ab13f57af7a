// Block-quantized formats (bit-exact with GGML's layouts): conversion to f32,
// quantization of activations, and dot products between a quantized weight row
// and a quantized activation row.
//
// Each weight type W is paired with an activation type (vec_dot_type(W)):
// Q4_0/Q5_0/Q8_0/MXFP4 -> Q8_0, Q4_1/Q5_1 -> Q8_1, K-quants -> Q8_K, F16 -> F16,
// BF16 -> BF16, F32 -> F32. Activations are quantized once per row and reused
// for every weight row, which is what turns the dot products into integer
// arithmetic.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace inferd::kernels {

// f16 / bf16 scalar conversions (round-to-nearest-even).
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);
// An MXFP4 block's E8M0 scale halved, 2^(e - 128), as GGML's
// GGML_E8M0_TO_FP32_HALF gives it (e < 2: subnormal).
float e8m0_to_f32_half(uint8_t e);

bool is_supported_weight_type(DType t);
DType vec_dot_type(DType weight_type);

// Functions below take n as a multiple of the type's block size (32 or 256).

// dst[0..n) = src row of `n` elements of type t (any type listed in dtype.h).
void dequantize_row(DType t, const void* src, float* dst, int64_t n);
// Quantizes n f32 values into type t. Activation types (Q8_0, Q8_1, Q8_K, F16,
// BF16, F32) follow GGML bit for bit, SIMD or not: its reference quantizers for
// Q8_0 (d = amax/127, roundf) and Q8_K (d = max/-127 of the signed extreme,
// round-half-even), and for Q8_1, never stored in files, the CPU quantizer
// llama.cpp runs on activations (127/amax, round-half-even). The weight types get simple round-to-nearest quantizers
// that make valid blocks (for tests; not GGML's error-minimizing search).
void quantize_row(DType t, const float* src, void* dst, int64_t n);
// Dot product of n elements: a row of weight type t (is_supported_weight_type),
// b a row of type vec_dot_type(t). Integer dot product per block, then scaled.
float vec_dot(DType t, int64_t n, const void* a, const void* b);

// Scalar reference implementations, always compiled, used by tests to check
// the SIMD paths.
namespace ref {
void dequantize_row(DType t, const void* src, float* dst, int64_t n);
void quantize_row(DType t, const float* src, void* dst, int64_t n);
float vec_dot(DType t, int64_t n, const void* a, const void* b);
}  // namespace ref

// Which SIMD level the dispatcher picked ("amx", "avx512vnni", "avx2", "scalar"):
// the best the CPU supports, or INFERD_SIMD=scalar|avx2|avx512 if set (never
// above what the CPU supports). Chosen once, on first use of any kernel.
const char* simd_level();

}  // namespace inferd::kernels
