// The fast tier's BF16 product (kernels/cpu/bf16_gemm.h) against a float
// reference: the F16/BF16 weights times the float activations, summed in
// double. Its error beyond float rounding is BF16's: every weight and every
// activation rounded to 8 significant bits (|x - bf16(x)| <= |x| 2^-9), whence
// the bound sum_k |w_k x_k| (2^-8 + 2^-18). Every level gives the scalar
// reference's bits (with AVX-512 BF16's dpbf16ps too, on CPUs that have it),
// and a token's row the same bits alone or in any batch.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/bf16_gemm.h"
#include "kernels/cpu/quants.h"
#include "kernels_test_util.h"

namespace inferd::kernels {
namespace {

using testing::level_name;

struct Problem {
  DType type;
  int64_t rows, cols, n_tokens;
  std::vector<uint16_t> w;  // F16 or BF16 bits
  std::vector<float> x;
};

float weight_value(DType t, uint16_t h) { return t == DType::F16 ? f16_to_f32(h) : bf16_bits_to_f32(h); }

Problem make(std::mt19937& rng, DType t, int64_t rows, int64_t cols, int64_t n_tokens) {
  Problem p{t, rows, cols, n_tokens, {}, testing::random_floats(rng, static_cast<size_t>(n_tokens * cols), 2.0f)};
  const std::vector<float> w = testing::random_floats(rng, static_cast<size_t>(rows * cols), 0.5f);
  for (float v : w) p.w.push_back(t == DType::F16 ? f32_to_f16(v) : f32_to_bf16_rne(v));
  return p;
}

Bf16Activations convert(const KernelTable& table, const Problem& p) {
  Bf16Activations a;
  a.resize(p.n_tokens, p.cols);
  for (int64_t t = 0; t < p.n_tokens; ++t)
    a.convert_blocks_with(table, p.x.data() + t * p.cols, t, 0, p.cols / kBf16ActBlock);
  return a;
}

std::vector<float> run(const KernelTable& table, const Bf16Matrix& m, const Bf16Activations& a, int64_t first,
                       int64_t n_tokens) {
  std::vector<float> y(static_cast<size_t>(n_tokens * m.rows()), NAN);
  bf16_matmul_groups_with(table, m, a, first, n_tokens, 0, m.groups(), y.data(), m.rows());
  return y;
}

TEST(Bf16Gemm, TakesF16AndBf16WeightsOnly) {
  EXPECT_TRUE(bf16_gemm_applies(DType::F16, 64));
  EXPECT_TRUE(bf16_gemm_applies(DType::BF16, 384));
  EXPECT_FALSE(bf16_gemm_applies(DType::F16, 48));  // not whole 32-column blocks
  for (DType t : {DType::F32, DType::Q8_0, DType::Q4_K}) EXPECT_FALSE(bf16_gemm_applies(t, 64)) << dtype_name(t);
}

// Rounding to nearest even, denormals to signed zero, NaN kept, infinities kept.
TEST(Bf16Gemm, RoundsFloatsToNearestEven) {
  const auto bits = [](float f) { return testing::bits_of(f); };
  EXPECT_EQ(f32_to_bf16_rne(1.0f), 0x3F80);
  uint32_t u = 0x3F808000;  // halfway between 0x3F80 and 0x3F81: even wins
  float f;
  std::memcpy(&f, &u, 4);
  EXPECT_EQ(f32_to_bf16_rne(f), 0x3F80);
  u = 0x3F818000;  // halfway between 0x3F81 and 0x3F82
  std::memcpy(&f, &u, 4);
  EXPECT_EQ(f32_to_bf16_rne(f), 0x3F82);
  EXPECT_EQ(f32_to_bf16_rne(-1e-40f), 0x8000);
  EXPECT_EQ(f32_to_bf16_rne(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_TRUE(std::isnan(bf16_bits_to_f32(f32_to_bf16_rne(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(bits(bf16_bits_to_f32(0x3F80)), bits(1.0f));
}

// The repacked weights are the file's, rounded to BF16 (exact for BF16 files).
TEST(Bf16Gemm, PacksTheWeightsRounded) {
  std::mt19937 rng(7);
  for (DType t : {DType::F16, DType::BF16}) {
    const Problem p = make(rng, t, 37, 96, 1);
    const Bf16Matrix m = Bf16Matrix::pack(t, p.w.data(), p.rows, p.cols);
    for (int64_t r = 0; r < p.rows; ++r)
      for (int64_t k = 0; k < p.cols; ++k) {
        const float w = weight_value(t, p.w[static_cast<size_t>(r * p.cols + k)]);
        ASSERT_EQ(testing::bits_of(m.weight(r, k)), testing::bits_of(bf16_bits_to_f32(f32_to_bf16_rne(w))))
            << dtype_name(t) << " " << r << " " << k;
      }
  }
}

class Bf16GemmLevel : public ::testing::TestWithParam<SimdLevel> {
 protected:
  void SetUp() override {
    if (GetParam() > best_simd_level())
      GTEST_SKIP() << "this CPU (or OS) does not run the " << level_name(GetParam()) << " level";
  }
};

TEST_P(Bf16GemmLevel, ConvertsActivationsAsTheReference) {
  const KernelTable table = build_kernel_table(GetParam());
  const KernelTable scalar = build_kernel_table(SimdLevel::kScalar);
  std::mt19937 rng(13);
  std::vector<float> x = testing::random_floats(rng, 32 * 8, 3.0f);
  x[3] = 1e-40f, x[4] = -0.0f, x[5] = std::numeric_limits<float>::infinity(), x[6] = 3.4e38f;
  uint32_t u = 0x3F808000;
  std::memcpy(&x[7], &u, 4);
  for (int64_t n_pairs : {int64_t{128}, int64_t{5}, int64_t{1}}) {
    std::vector<uint32_t> got(128, 0xDEADBEEF), want(128, 0xDEADBEEF);
    table.bf16_convert(x.data(), n_pairs, got.data());
    scalar.bf16_convert(x.data(), n_pairs, want.data());
    EXPECT_EQ(got, want) << n_pairs << " pairs";
  }
}

// Within BF16's rounding of the float product, and the scalar reference's
// bits, for token counts from 1 to 512 and a partial last group of rows.
TEST_P(Bf16GemmLevel, MatchesTheFloatProductWithinBf16Rounding) {
  const KernelTable table = build_kernel_table(GetParam());
  const KernelTable scalar = build_kernel_table(SimdLevel::kScalar);
  std::mt19937 rng(11);
  for (DType t : {DType::F16, DType::BF16}) {
    for (int64_t n_tokens : {1, 2, 3, 7, 8, 9, 15, 16, 17, 33, 100, 512}) {
      const int64_t rows = n_tokens == 512 ? 21 : 53, cols = n_tokens == 512 ? 128 : 384;
      const Problem p = make(rng, t, rows, cols, n_tokens);
      const Bf16Matrix m = Bf16Matrix::pack(t, p.w.data(), p.rows, p.cols);
      const Bf16Activations a = convert(table, p);
      const std::vector<float> y = run(table, m, a, 0, n_tokens);
      const std::vector<float> y_ref = run(scalar, m, a, 0, n_tokens);
      int bad = 0;
      for (int64_t i = 0; i < n_tokens; ++i) {
        for (int64_t r = 0; r < rows; ++r) {
          double exact = 0, magnitude = 0;
          for (int64_t k = 0; k < p.cols; ++k) {
            const double wk = weight_value(t, p.w[static_cast<size_t>(r * p.cols + k)]);
            const double xk = p.x[static_cast<size_t>(i * p.cols + k)];
            exact += wk * xk;
            magnitude += std::fabs(wk * xk);
          }
          // Two roundings to BF16 per product, then one float rounding per
          // step on partial sums no larger than the sum of magnitudes.
          const double bound = magnitude * (std::ldexp(1.0, -8) + double(p.cols) * std::ldexp(1.0, -24)) + 1e-30;
          const float got = y[static_cast<size_t>(i * rows + r)];
          const bool ok = std::fabs(got - exact) <= bound &&
                          testing::bits_of(got) == testing::bits_of(y_ref[static_cast<size_t>(i * rows + r)]);
          if (!ok && bad++ < 3)
            ADD_FAILURE() << dtype_name(t) << " tokens " << n_tokens << " token " << i << " row " << r << ": got "
                          << got << ", float product " << exact << " (bound " << bound << "), scalar "
                          << y_ref[static_cast<size_t>(i * rows + r)];
        }
      }
      EXPECT_EQ(bad, 0) << dtype_name(t) << " at " << level_name(GetParam()) << ", " << n_tokens << " tokens";
    }
  }
}

// AVX-512 without BF16 instructions: the same bits by fused multiply-adds
// (also checked on CPUs that would otherwise run dpbf16ps).
TEST(Bf16Gemm, Avx512FusedMultiplyAddsGiveTheReferenceBits) {
  if (best_simd_level() < SimdLevel::kAvx512) GTEST_SKIP() << "this CPU does not run the avx512 level";
  KernelTable fma = build_kernel_table(SimdLevel::kAvx512);
  fma.bf16_groups = bf16_groups_avx512(/*dpbf16=*/false);
  const KernelTable scalar = build_kernel_table(SimdLevel::kScalar);
  std::mt19937 rng(17);
  for (int64_t n_tokens : {1, 9, 33}) {
    const Problem p = make(rng, DType::F16, 53, 384, n_tokens);
    const Bf16Matrix m = Bf16Matrix::pack(p.type, p.w.data(), p.rows, p.cols);
    const Bf16Activations a = convert(scalar, p);
    const std::vector<float> y = run(fma, m, a, 0, n_tokens), y_ref = run(scalar, m, a, 0, n_tokens);
    for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(testing::bits_of(y[i]), testing::bits_of(y_ref[i])) << i;
  }
}

// A token's row computed alone and inside batches of several sizes, at
// several places in them (different tiles and tile positions): the same bits.
TEST_P(Bf16GemmLevel, ATokensRowDoesNotDependOnTheBatch) {
  const KernelTable table = build_kernel_table(GetParam());
  std::mt19937 rng(5);
  const Problem p = make(rng, DType::F16, 70, 256, 64);
  const Bf16Matrix m = Bf16Matrix::pack(p.type, p.w.data(), p.rows, p.cols);
  const Bf16Activations a = convert(table, p);
  for (int64_t token : {0, 5, 17, 63}) {
    const std::vector<float> alone = run(table, m, a, token, 1);
    for (int64_t first : {int64_t{0}, token / 2, token}) {
      for (int64_t n : {2, 5, 8, 16, 17, 40, 64}) {
        if (first > token || token >= first + n || first + n > p.n_tokens) continue;
        const std::vector<float> batch = run(table, m, a, first, n);
        for (int64_t r = 0; r < p.rows; ++r)
          ASSERT_EQ(testing::bits_of(alone[static_cast<size_t>(r)]),
                    testing::bits_of(batch[static_cast<size_t>((token - first) * p.rows + r)]))
              << "token " << token << " in a batch of " << n << " from " << first << ", row " << r;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Levels, Bf16GemmLevel,
                         ::testing::Values(SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512, SimdLevel::kAmx),
                         [](const ::testing::TestParamInfo<SimdLevel>& i) { return std::string(level_name(i.param)); });

}  // namespace
}  // namespace inferd::kernels
