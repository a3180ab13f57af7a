// RMSNorm's lane sum keeps GGML's in-order result to the bit: every level sums
// the lanes alike, the error bound sends every row it cannot settle to the
// in-order sum, and a row built so that the lane sum alone rounds the other
// way shows the bound is what keeps the bits.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/rms_norm.h"
#include "kernels_test_util.h"

namespace inferd::kernels {
namespace {

using testing::bits_of;

// GGML's scale, computed the way GGML does.
float ggml_scale(const float* x, const float* h, int64_t n, float eps) {
  const float mean = static_cast<float>(detail::sum_squares_in_order(x, h, n) / static_cast<double>(n));
  return 1.0f / std::sqrt(mean + eps);
}

// Magnitudes spread over many binades, so that lane and in-order sums round
// differently in their last bits.
std::vector<float> wide_row(std::mt19937& rng, int64_t n) {
  std::uniform_real_distribution<float> exponent(-20.0f, 8.0f);
  std::bernoulli_distribution negative(0.5);
  std::vector<float> row(n);
  for (float& v : row) v = std::exp2(exponent(rng)) * (negative(rng) ? -1.0f : 1.0f);
  return row;
}

TEST(KernelsRmsNorm, LaneSumSameBitsAtEveryLevel) {
  if (best_simd_level() < SimdLevel::kAvx512) GTEST_SKIP() << "no AVX-512 here";
  std::mt19937 rng(1);
  for (int64_t n : {1, 15, 16, 17, 576, 577, 1000}) {
    const std::vector<float> x = wide_row(rng, n), h = wide_row(rng, n);
    for (const float* hp : {static_cast<const float*>(nullptr), h.data()}) {
      EXPECT_EQ(detail::sum_squares_lanes_avx512(x.data(), hp, n), detail::sum_squares_lanes_scalar(x.data(), hp, n))
          << n;
    }
  }
}

TEST(KernelsRmsNorm, ScaleIsGgmlsOnRandomRows) {
  std::mt19937 rng(2);
  int lane_sums_differ = 0;
  for (int row = 0; row < 20000; ++row) {
    const int64_t n = row % 3 == 0 ? 577 : 576;
    const std::vector<float> x = wide_row(rng, n), h = wide_row(rng, n);
    const float* hp = row % 2 ? h.data() : nullptr;
    lane_sums_differ += detail::sum_squares_lanes_scalar(x.data(), hp, n) != detail::sum_squares_in_order(x.data(), hp, n);
    ASSERT_EQ(bits_of(rms_norm_scale(x.data(), hp, n, 1e-5f)), bits_of(ggml_scale(x.data(), hp, n, 1e-5f))) << row;
  }
  // The rows do exercise the bound: most lane sums differ from GGML's sum.
  EXPECT_GT(lane_sums_differ, 10000);
}

// 64 terms: 1, 2^-24 and 62 of 2^-54. In order, each 2^-54 is less than half
// an ulp of the running sum and is lost, leaving 1 + 2^-24, and mean =
// (1 + 2^-24) / 64 is a tie between two floats that rounds to even, 2^-6. The
// lanes keep most of the small terms, and their mean rounds up instead.
TEST(KernelsRmsNorm, BoundSendsAnUnsettledRowToTheInOrderSum) {
  const int64_t n = 64;
  std::vector<float> x(n, 0x1p-27f);
  x[0] = 1.0f;
  x[1] = 0x1p-12f;
  const double in_order = detail::sum_squares_in_order(x.data(), nullptr, n);
  const double lanes = detail::sum_squares_lanes_scalar(x.data(), nullptr, n);
  ASSERT_EQ(in_order, 1.0 + 0x1p-24);
  ASSERT_GT(lanes, in_order);
  const float ggml_mean = static_cast<float>(in_order / n);
  ASSERT_EQ(ggml_mean, 0x1p-6f);
  ASSERT_NE(static_cast<float>(lanes / n), ggml_mean);  // the lane sum alone gets this bit wrong

  EXPECT_FALSE(detail::mean_square_if_settled(lanes, n).has_value());
  EXPECT_EQ(bits_of(rms_norm_scale(x.data(), nullptr, n, 0.0f)), bits_of(ggml_scale(x.data(), nullptr, n, 0.0f)));
  EXPECT_EQ(rms_norm_scale(x.data(), nullptr, n, 0.0f), 8.0f);
}

TEST(KernelsRmsNorm, NonFiniteRowsTakeTheInOrderSum) {
  std::vector<float> x(576, 0.5f);
  x[100] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(detail::mean_square_if_settled(detail::sum_squares_lanes_scalar(x.data(), nullptr, 576), 576));
  EXPECT_EQ(rms_norm_scale(x.data(), nullptr, 576, 1e-5f), 0.0f);
  x[100] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(rms_norm_scale(x.data(), nullptr, 576, 1e-5f)));
}

TEST(KernelsRmsNorm, RowWritesItsColumnsOfTheResidualAndTheNormalizedRow) {
  const int64_t n = 40;
  std::vector<float> x(n), h(n), w(n), x_out(n, -1.0f), out(n, -1.0f);
  for (int64_t i = 0; i < n; ++i) x[i] = 0.1f * i - 1.0f, h[i] = 0.05f * i, w[i] = 1.0f + 0.01f * i;
  rms_norm_row(x.data(), h.data(), w.data(), n, 1e-6f, 8, 24, x_out.data(), out.data());
  const float scale = ggml_scale(x.data(), h.data(), n, 1e-6f);
  for (int64_t i = 0; i < n; ++i) {
    const bool mine = i >= 8 && i < 24;
    const float v = x[i] + h[i];
    EXPECT_EQ(x_out[i], mine ? v : -1.0f) << i;
    EXPECT_EQ(out[i], mine ? v * scale * w[i] : -1.0f) << i;
  }
}

}  // namespace
}  // namespace inferd::kernels
