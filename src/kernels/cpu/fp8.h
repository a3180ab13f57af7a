// fp8 e4m3fn, as PyTorch's float8_e4m3fn and vLLM's fp8_e4m3 KV cache define
// it: 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits; no infinities;
// 0x7f and 0xff are NaN, so the largest finite magnitude is 448 (0x7e).
// Exponent 0 holds the subnormals m * 2^-9.
//
// Encoding rounds to nearest, ties to even, and saturates to +-448 (what
// vLLM's kernels do: they clamp before converting); NaN stays NaN. The KV
// cache stores K and V with a per-tensor scale of 1.0 (vLLM's default when
// no calibrated scales are given), so a value is its code's value.
#pragma once
#include <cstdint>

namespace inferd::kernels {

inline constexpr float kFp8E4m3Max = 448.0f;

uint8_t f32_to_fp8_e4m3(float x);
float fp8_e4m3_to_f32(uint8_t code);

// The 256 codes' values in code order (NaN for 0x7f, 0xff): what the SIMD
// attention kernels gather from.
const float* fp8_e4m3_values();

void quantize_row_fp8_e4m3(const float* src, void* dst, int64_t n);
void dequantize_row_fp8_e4m3(const void* src, float* dst, int64_t n);

}  // namespace inferd::kernels
