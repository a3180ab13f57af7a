// fp8 e4m3fn (kernels/cpu/fp8.h) against references written from the format's
// definition alone: every one of the 256 codes decodes to sign * 2^(e-7) *
// (1 + m/8) (e > 0) or sign * m * 2^-9 (e = 0), NaN for 0x7f/0xff; encoding a
// sweep of floats gives the code whose value is nearest, ties to the even
// code, after clamping to +-448, found by searching all finite codes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cpu/quants.h"

namespace inferd::kernels {
namespace {

double defined_value(int code) {
  const int sign = code >> 7, e = (code >> 3) & 0xf, m = code & 7;
  const double mag = e == 0 ? m * std::pow(2.0, -9) : std::pow(2.0, e - 7) * (1.0 + m / 8.0);
  return sign ? -mag : mag;
}

bool is_nan_code(int code) { return (code & 0x7f) == 0x7f; }

// The nearest finite code to x clamped to [-448, 448]; on a tie the code with
// an even mantissa. Zero keeps x's sign.
uint8_t nearest_code(float x) {
  if (std::isnan(x)) return std::signbit(x) ? 0xff : 0x7f;
  const double c = std::fmax(-448.0, std::fmin(448.0, double{x}));
  int best = -1;
  double best_err = 0;
  for (int code = 0; code < 256; ++code) {
    if (is_nan_code(code)) continue;
    if (((code >> 7) != 0) != std::signbit(x)) continue;  // the sign is x's (so -0.0 -> 0x80)
    const double err = std::fabs(defined_value(code) - c);
    if (best < 0 || err < best_err || (err == best_err && (code & 1) == 0)) best = code, best_err = err;
  }
  return static_cast<uint8_t>(best);
}

TEST(KernelsFp8, EveryCodeDecodesToItsDefinedValue) {
  int nans = 0;
  for (int code = 0; code < 256; ++code) {
    const float got = fp8_e4m3_to_f32(static_cast<uint8_t>(code));
    if (is_nan_code(code)) {
      EXPECT_TRUE(std::isnan(got)) << code;
      ++nans;
      continue;
    }
    EXPECT_EQ(double{got}, defined_value(code)) << "code " << code;
    EXPECT_EQ(std::signbit(got), code >= 0x80) << "code " << code;
  }
  EXPECT_EQ(nans, 2);
  EXPECT_EQ(fp8_e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x01), 0.001953125f);  // 2^-9, the smallest subnormal
  EXPECT_EQ(fp8_e4m3_to_f32(0x08), 0.015625f);     // 2^-6, the smallest normal
}

TEST(KernelsFp8, EncodeIsNearestEvenWithSaturation) {
  std::vector<float> sweep = {0.0f, -0.0f, 448.0f, -448.0f, 449.0f, 463.99f, 464.0f, 465.0f, 1e9f, -1e9f,
                              std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                              std::numeric_limits<float>::denorm_min(), 1e-30f, std::numeric_limits<float>::max()};
  // Every code's value, the midpoints between neighbours (the ties) and the
  // floats one ulp either side of each.
  for (int code = 0; code < 256; ++code) {
    if (is_nan_code(code)) continue;
    const float v = static_cast<float>(defined_value(code));
    const float next = code == 0x7e || code == 0xfe ? v : static_cast<float>(defined_value(code + 1));
    for (float x : {v, 0.5f * (v + next)}) {
      sweep.push_back(x);
      sweep.push_back(std::nextafter(x, std::numeric_limits<float>::infinity()));
      sweep.push_back(std::nextafter(x, -std::numeric_limits<float>::infinity()));
    }
  }
  // And random floats over the whole range of magnitudes (random bit patterns).
  std::mt19937 rng(3);
  for (int i = 0; i < 200000; ++i) {
    uint32_t bits = rng();
    bits = (bits & 0x80000000u) | (((bits >> 23) % 40 + 100) << 23) | (bits & 0x7fffff);  // 2^-27 .. 2^12
    float x;
    std::memcpy(&x, &bits, 4);
    sweep.push_back(x);
  }
  for (float x : sweep) ASSERT_EQ(int{f32_to_fp8_e4m3(x)}, int{nearest_code(x)}) << "x = " << x;
  EXPECT_TRUE(is_nan_code(f32_to_fp8_e4m3(std::numeric_limits<float>::quiet_NaN())));
}

TEST(KernelsFp8, RowsRoundTripThroughTheTypeTable) {
  EXPECT_EQ(row_bytes(DType::F8_E4M3, 64), 64u);
  EXPECT_FALSE(is_supported_weight_type(DType::F8_E4M3));
  std::vector<float> x(64), back(64);
  for (int i = 0; i < 64; ++i) x[i] = (i - 32) * 0.37f;
  std::vector<uint8_t> codes(64);
  quantize_row(DType::F8_E4M3, x.data(), codes.data(), 64);
  dequantize_row(DType::F8_E4M3, codes.data(), back.data(), 64);
  for (int i = 0; i < 64; ++i) {
    EXPECT_EQ(codes[i], nearest_code(x[i])) << i;
    EXPECT_EQ(double{back[i]}, defined_value(codes[i])) << i;
  }
}

}  // namespace
}  // namespace inferd::kernels
