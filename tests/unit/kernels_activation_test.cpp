// SwiGLU and the exp polynomial behind it (GGML's, kernels/cpu/expf_poly.h):
// every level gives the same bits, close to the exact function, with GGML's
// saturation at the ends of the range.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/expf_poly.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels_test_util.h"

namespace inferd::kernels {
namespace {

using testing::bits_of;

TEST(KernelsActivation, ExpPolyIsCloseToExpAndSaturatesLikeGgml) {
  for (float x = -87.0f; x <= 88.0f; x += 0.37f) {
    const double want = std::exp(static_cast<double>(x));
    EXPECT_NEAR(expf_poly(x) / want, 1.0, 4e-7) << x;
  }
  EXPECT_EQ(expf_poly(0.0f), 1.0f);
  EXPECT_EQ(expf_poly(-200.0f), 0.0f);  // |n| > 192: 0 below, infinity above
  EXPECT_EQ(expf_poly(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_TRUE(std::isinf(expf_poly(200.0f)));
}

TEST(KernelsActivation, SwigluSameBitsAtEveryLevel) {
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 4.0f);
  const int64_t n = 1000;  // not a multiple of 16: the AVX-512 tail runs too
  std::vector<float> gate(n), up(n);
  for (int64_t i = 0; i < n; ++i) gate[i] = dist(rng), up[i] = dist(rng);
  gate[0] = -120.0f, gate[1] = 120.0f, gate[2] = 0.0f;
  std::vector<float> scalar(n), fma(n), simd(n);
  detail::swiglu_scalar(gate.data(), up.data(), scalar.data(), n);
  fma = scalar;
  simd = scalar;
  if (best_simd_level() >= SimdLevel::kAvx2) detail::swiglu_fma(gate.data(), up.data(), fma.data(), n);
  if (best_simd_level() == SimdLevel::kAvx512) detail::swiglu_avx512(gate.data(), up.data(), simd.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i], want = g / (1.0 + std::exp(-g)) * up[i];
    EXPECT_NEAR(scalar[i], want, 1e-6 * (1.0 + std::fabs(want))) << i;
    EXPECT_EQ(bits_of(fma[i]), bits_of(scalar[i])) << i;
    EXPECT_EQ(bits_of(simd[i]), bits_of(scalar[i])) << i;
  }
  // In place, as the model calls it.
  std::vector<float> in_place = gate;
  swiglu(in_place.data(), up.data(), in_place.data(), n);
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(bits_of(in_place[i]), bits_of(scalar[i])) << i;
}

}  // namespace
}  // namespace inferd::kernels
