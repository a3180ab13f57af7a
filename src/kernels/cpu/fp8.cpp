#include "kernels/cpu/fp8.h"

#include <array>
#include <cmath>
#include <cstring>
#include <limits>

namespace inferd::kernels {

uint8_t f32_to_fp8_e4m3(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80);
  const uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) return sign | 0x7f;  // NaN
  // 2^-6, the smallest normal: below it the codes step by 2^-9.
  constexpr uint32_t kMinNormalBits = (127u - 6u) << 23;
  if (abs_bits < kMinNormalBits) {
    float a;
    std::memcpy(&a, &abs_bits, 4);
    // a * 512 is exact (a power of two); nearbyint rounds ties to even in the
    // default rounding mode. 8 lands on 0x08, the smallest normal.
    return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f));
  }
  // Normal: drop 20 of the 23 mantissa bits rounding to nearest even (a carry
  // moves into the exponent, as it should), then rebias 127 -> 7.
  const uint32_t rounded = (abs_bits + 0x7ffffu + ((abs_bits >> 20) & 1u)) >> 20;
  const uint32_t code = rounded - ((127u - 7u) << 3);
  return sign | static_cast<uint8_t>(code > 0x7eu ? 0x7eu : code);  // saturate (inf included)
}

float fp8_e4m3_to_f32(uint8_t code) { return fp8_e4m3_values()[code]; }

const float* fp8_e4m3_values() {
  static const std::array<float, 256> values = [] {
    std::array<float, 256> v{};
    for (int c = 0; c < 256; ++c) {
      const int e = (c >> 3) & 0xf, m = c & 7;
      float mag;
      if (e == 0xf && m == 7)
        mag = std::numeric_limits<float>::quiet_NaN();
      else if (e == 0)
        mag = std::ldexp(static_cast<float>(m), -9);
      else
        mag = std::ldexp(static_cast<float>(8 + m), e - 10);
      v[c] = (c & 0x80) ? -mag : mag;
    }
    return v;
  }();
  return values.data();
}

void quantize_row_fp8_e4m3(const float* src, void* dst, int64_t n) {
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n; ++i) out[i] = f32_to_fp8_e4m3(src[i]);
}

void dequantize_row_fp8_e4m3(const void* src, float* dst, int64_t n) {
  const float* values = fp8_e4m3_values();
  const auto* in = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = values[in[i]];
}

}  // namespace inferd::kernels
