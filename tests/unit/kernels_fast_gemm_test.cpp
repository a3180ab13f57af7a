// The fast numerics tier's matrix product (kernels/cpu/fast_gemm.h) against a
// float reference: the weights as the project's GGML-exact dequantizer gives
// them, times the activations, summed in double. The fast tier quantizes the
// activations to int8 per 32 columns (or, for K-quants, per 256 as Q8_K), so
// its only error beyond float rounding is that quantization's: |x - q d| <=
// d / 2 per element, whence the bound sum_k |w_k| d_k / 2. Every SIMD level must give the scalar reference's
// bits, and a token's row the same bits alone or in any batch.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/fast_gemm.h"
#include "kernels/cpu/quants_blocks.h"
#include "kernels_test_util.h"

namespace inferd::kernels {
namespace {

using testing::level_name;
using testing::make_problem;
using testing::Problem;

const std::vector<DType>& fast_types() {
  static const std::vector<DType> types = {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1,
                                           DType::Q8_0, DType::Q2_K, DType::Q3_K, DType::Q4_K,
                                           DType::Q5_K, DType::Q6_K, DType::MXFP4};
  return types;
}

std::vector<float> dequantized(const Problem& p) {
  std::vector<float> w(static_cast<size_t>(p.rows * p.cols));
  const size_t rb = row_bytes(p.type, p.cols);
  for (int64_t r = 0; r < p.rows; ++r) ref::dequantize_row(p.type, p.w.data() + r * rb, w.data() + r * p.cols, p.cols);
  return w;
}

// The activation forms the kernels take for weights of type t: 32-column
// blocks, and for the K-quants also Q8_K super-blocks.
std::vector<FastActs> forms_of(DType t) {
  const bool k_quant = t == DType::Q2_K || t == DType::Q3_K || t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K;
  if (k_quant) return {FastActs::kBlocks32, FastActs::kSuperBlocks};
  return {FastActs::kBlocks32};
}

const char* form_name(FastActs f) { return f == FastActs::kSuperBlocks ? "Q8_K super-blocks" : "32-column blocks"; }

FastActivations quantize(const Problem& p, FastActs form = FastActs::kBlocks32) {
  FastActivations a;
  a.resize(p.n_tokens, p.cols, form);
  for (int64_t t = 0; t < p.n_tokens; ++t) a.quantize_blocks(p.x.data() + t * p.cols, t, 0, p.cols / a.block());
  return a;
}

std::vector<float> run(const KernelTable& table, const FastMatrix& m, const FastActivations& a, int64_t first,
                       int64_t n_tokens) {
  std::vector<float> y(static_cast<size_t>(n_tokens * m.rows()), NAN);
  fast_matmul_groups_with(table, m, a, first, n_tokens, 0, m.groups(), y.data(), m.rows());
  return y;
}

TEST(FastGemm, TakesTheBlockFormatsOnly) {
  for (DType t : fast_types()) EXPECT_TRUE(fast_gemm_applies(t)) << dtype_name(t);
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_K}) EXPECT_FALSE(fast_gemm_applies(t)) << dtype_name(t);
}

// The repacked codes stand for the weights the format's own dequantizer gives
// (to within one rounding: scale * u + min is fused here).
TEST(FastGemm, CodesAreTheFormatsValues) {
  std::mt19937 rng(7);
  for (DType t : fast_types()) {
    const Problem p = make_problem(rng, t, 37, 512, 1);
    const std::vector<float> w = dequantized(p);
    const FastMatrix m = FastMatrix::pack(t, p.w.data(), p.rows, p.cols);
    int bad = 0;
    for (int64_t r = 0; r < p.rows; ++r)
      for (int64_t k = 0; k < p.cols; ++k) {
        const float want = w[static_cast<size_t>(r * p.cols + k)], got = m.weight(r, k);
        if (std::fabs(got - want) > 1e-6f * (std::fabs(want) + 0.5f) && bad++ < 3)
          ADD_FAILURE() << dtype_name(t) << " row " << r << " col " << k << ": " << got << " != " << want;
      }
    EXPECT_EQ(bad, 0) << dtype_name(t);
  }
}

// The super-block form is GGML's Q8_K, bit for bit (the exact tier's activations for K-quants).
TEST(FastGemm, QuantizesSuperBlocksAsGgmlsQ8K) {
  std::mt19937 rng(19);
  const std::vector<float> x = testing::random_floats(rng, 1024, 2.0f);
  FastActivations a;
  a.resize(2, 512, FastActs::kSuperBlocks);
  a.quantize_blocks(x.data(), 0, 0, 2);
  a.quantize_blocks(x.data() + 512, 1, 0, 1);  // block by block, as threads share a row
  a.quantize_blocks(x.data() + 512, 1, 1, 2);
  std::vector<BlockQ8_K> want(4);
  ref::quantize_row(DType::Q8_K, x.data(), want.data(), 1024);
  const FastActsView v = a.view();
  for (int t = 0; t < 2; ++t)
    EXPECT_EQ(std::memcmp(v.super + t * v.super_row_bytes, want.data() + 2 * t, 2 * sizeof(BlockQ8_K)), 0) << t;
}

TEST(FastGemm, QuantizesActivationsPer32Columns) {
  std::mt19937 rng(3);
  const std::vector<float> x = testing::random_floats(rng, 256);
  FastActivations a;
  a.resize(1, 256);
  a.quantize_blocks(x.data(), 0, 0, 8);
  for (int b = 0; b < 8; ++b) {
    float amax = 0;
    for (int k = 0; k < 32; ++k) amax = std::max(amax, std::fabs(x[32 * b + k]));
    for (int k = 0; k < 32; ++k)
      EXPECT_LE(std::fabs(a.value(0, 32 * b + k) - x[32 * b + k]), amax / 127.0f / 2.0f * 1.0001f) << b << " " << k;
  }
}

class FastGemmLevel : public ::testing::TestWithParam<SimdLevel> {
 protected:
  void SetUp() override {
    if (GetParam() > best_simd_level())
      GTEST_SKIP() << "this CPU (or OS) does not run the " << level_name(GetParam()) << " level"
                   << (GetParam() == SimdLevel::kAmx ? " (no AMX-INT8, or the tile state is not granted)" : "");
  }
};

// The level's activation quantizer gives the scalar reference's bits.
TEST_P(FastGemmLevel, QuantizesActivationsAsTheReference) {
  const KernelTable table = build_kernel_table(GetParam());
  const KernelTable scalar = build_kernel_table(SimdLevel::kScalar);
  std::mt19937 rng(13);
  std::vector<float> x = testing::random_floats(rng, 32 * 64, 3.0f);
  for (int k = 0; k < 32; ++k) x[32 * 5 + k] = 0.0f;             // an all-zero block
  x[32 * 7 + 3] = 127.5f * (x[32 * 7] = 1.0f) / 127.0f;          // a tie at half a step
  // (64 blocks, and 37: a level may take blocks by sixteens, then the rest one by one.)
  const auto quantize_with = [&](const KernelTable& t, std::vector<int8_t>& q, std::vector<float>& fields,
                                 std::vector<int32_t>& sums) {
    q.assign(2 * x.size(), 0);
    fields.assign(2 * 64 * 4, 0.0f);
    sums.assign(2 * 64 * 2, -1);
    t.fast_quantize(x.data(), 64, q.data(), fields.data(), fields.data() + 64, fields.data() + 128, sums.data());
    t.fast_quantize(x.data(), 37, q.data() + x.size(), fields.data() + 256, fields.data() + 256 + 64,
                    fields.data() + 256 + 128, sums.data() + 128);
  };
  // Blocks whose product x / d rounds (in float) to exactly a half: the
  // reference rounds the product, then to the nearest even integer; a level
  // that fused the product into the rounding's add would round the unrounded
  // product up or down instead.
  int halves = 0;
  for (int b = 8; b < 64; ++b) {
    float* blk = x.data() + 32 * b;
    blk[0] = 3.0f;  // the block's largest, kept: the other values below are smaller
    float amax = 0.0f;
    for (int k = 0; k < 32; ++k) amax = std::max(amax, std::fabs(blk[k]));
    const float d = amax / 127.0f, id = 1.0f / d;
    for (int k = 1; k < 32; ++k) {
      const float target = (static_cast<float>(k) + 0.5f) * d;
      for (float c = std::nextafter(target, 0.0f); c < std::nextafter(std::nextafter(target, 1e9f), 1e9f);
           c = std::nextafter(c, 1e9f)) {
        if (std::fabs(c) < amax && c * id == static_cast<float>(k) + 0.5f &&
            static_cast<double>(c) * id != static_cast<double>(k) + 0.5) {
          blk[k] = c, ++halves;
          break;
        }
      }
    }
  }
  ASSERT_GT(halves, 20);
  std::vector<int8_t> q, q_ref;
  std::vector<float> f, f_ref;
  std::vector<int32_t> sums, sums_ref;
  quantize_with(table, q, f, sums);
  quantize_with(scalar, q_ref, f_ref, sums_ref);
  EXPECT_EQ(q, q_ref);
  for (size_t i = 0; i < f.size(); ++i) ASSERT_EQ(testing::bits_of(f[i]), testing::bits_of(f_ref[i])) << i;
  EXPECT_EQ(sums, sums_ref);
  // The integer sums are the quants' own, per 16 columns.
  for (int b = 0; b < 64; ++b)
    for (int h = 0; h < 2; ++h) {
      int32_t sum = 0;
      for (int k = 0; k < 16; ++k) sum += q_ref[static_cast<size_t>(32 * b + 16 * h + k)];
      ASSERT_EQ(sums_ref[static_cast<size_t>(2 * b + h)], sum) << b;
    }
}

// Within the activation quantization's error of the float product, and the
// scalar reference's bits, for token counts from 1 to 512 and a partial
// last group of rows.
TEST_P(FastGemmLevel, MatchesTheFloatProductWithinTheActivationError) {
  const KernelTable table = build_kernel_table(GetParam());
  const KernelTable scalar = build_kernel_table(SimdLevel::kScalar);
  std::mt19937 rng(11);
  for (DType t : fast_types()) {
   for (FastActs form : forms_of(t)) {
    // Every remainder of the levels' token tiles (2, 3, 5, 8, 16) and chunks (16, 32, 40, 48).
    for (int64_t n_tokens : {1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 15, 16, 17, 33, 39, 40, 41, 49, 83, 100, 512}) {
      const int64_t rows = n_tokens == 512 ? 21 : 37;
      const Problem p = make_problem(rng, t, rows, 512, n_tokens);
      const std::vector<float> w = dequantized(p);
      const FastMatrix m = FastMatrix::pack(t, p.w.data(), p.rows, p.cols, nullptr, {}, form);
      const FastActivations a = quantize(p, form);
      const int64_t ab = a.block();
      const std::vector<float> y = run(table, m, a, 0, n_tokens);
      const std::vector<float> y_ref = run(scalar, m, a, 0, n_tokens);
      int bad = 0;
      for (int64_t i = 0; i < n_tokens; ++i) {
        for (int64_t r = 0; r < rows; ++r) {
          double exact = 0, quantized = 0, quant_err = 0, magnitude = 0;
          for (int64_t k = 0; k < p.cols; ++k) {
            const double wk = w[static_cast<size_t>(r * p.cols + k)], xk = p.x[static_cast<size_t>(i * p.cols + k)];
            const double xq = a.value(i, k);
            exact += wk * xk;
            quantized += wk * xq;
            double amax = 0;
            for (int64_t j = k / ab * ab; j < k / ab * ab + ab; ++j)
              amax = std::max(amax, std::fabs(double(p.x[static_cast<size_t>(i * p.cols + j)])));
            quant_err += std::fabs(wk) * amax / 127.0 / 2.0;
            magnitude += (std::fabs(wk) + std::fabs(double(m.weight(r, k) - wk)) + 1e-3) * std::fabs(xq);
          }
          // Float steps: two fused roundings and one product's per block, on
          // partial sums no larger than the sum of magnitudes (over-counted
          // by including the min's offsets at 1e-3 a weight).
          const double float_err = 4.0 * double(p.cols / 16) * std::ldexp(1.0, -24) * magnitude + 1e-7;
          const float got = y[static_cast<size_t>(i * rows + r)];
          const bool ok = std::fabs(got - quantized) <= float_err && std::fabs(got - exact) <= quant_err + float_err &&
                          testing::bits_of(got) == testing::bits_of(y_ref[static_cast<size_t>(i * rows + r)]);
          if (!ok && bad++ < 3)
            ADD_FAILURE() << dtype_name(t) << " (" << form_name(form) << ") tokens " << n_tokens << " token " << i << " row " << r << ": got "
                          << got << ", float product " << exact << " (bound " << quant_err + float_err
                          << "), with the quantized activations " << quantized << " (bound " << float_err
                          << "), scalar " << y_ref[static_cast<size_t>(i * rows + r)];
        }
      }
      EXPECT_EQ(bad, 0) << dtype_name(t) << " (" << form_name(form) << ") at " << level_name(GetParam()) << ", "
                        << n_tokens << " tokens";
    }
   }
  }
}

// A token's row computed alone and inside batches of several sizes, at
// several places in them (so in different tiles and tile positions), gives
// the same bits.
TEST_P(FastGemmLevel, ATokensRowDoesNotDependOnTheBatch) {
  const KernelTable table = build_kernel_table(GetParam());
  std::mt19937 rng(5);
  for (DType t : {DType::Q4_1, DType::Q4_K, DType::Q6_K, DType::Q8_0, DType::Q5_K})
   for (FastActs form : forms_of(t)) {
    const Problem p = make_problem(rng, t, 40, 256, 64);
    const FastMatrix m = FastMatrix::pack(t, p.w.data(), p.rows, p.cols, nullptr, {}, form);
    const FastActivations a = quantize(p, form);
    for (int64_t token : {0, 5, 17, 63}) {
      const std::vector<float> alone = run(table, m, a, token, 1);
      for (int64_t first : {int64_t{0}, token / 2, token}) {
        for (int64_t n : {2, 5, 8, 16, 17, 40, 64}) {
          if (first > token || token >= first + n || first + n > p.n_tokens) continue;
          const std::vector<float> batch = run(table, m, a, first, n);
          for (int64_t r = 0; r < p.rows; ++r)
            ASSERT_EQ(testing::bits_of(alone[static_cast<size_t>(r)]),
                      testing::bits_of(batch[static_cast<size_t>((token - first) * p.rows + r)]))
                << dtype_name(t) << " (" << form_name(form) << ") token " << token << " in a batch of " << n << " from " << first << ", row "
                << r;
        }
      }
    }
  }
}

// Sets every code of a GGML row of type t to its largest value (the format's
// scales kept): what makes a kernel's partial integer sums largest.
void max_codes(DType t, uint8_t* row, int64_t cols) {
  const auto each = [&](auto* blocks, int64_t per, auto&& set) {
    for (int64_t i = 0; i < cols / per; ++i) set(blocks[i]);
  };
  switch (t) {
    case DType::Q4_0: each(reinterpret_cast<BlockQ4_0*>(row), kQK, [](auto& b) { std::memset(b.qs, 0xFF, sizeof b.qs); }); return;
    case DType::Q4_1: each(reinterpret_cast<BlockQ4_1*>(row), kQK, [](auto& b) { std::memset(b.qs, 0xFF, sizeof b.qs); }); return;
    case DType::Q5_0:
      each(reinterpret_cast<BlockQ5_0*>(row), kQK, [](auto& b) { std::memset(b.qs, 0xFF, sizeof b.qs), std::memset(b.qh, 0xFF, sizeof b.qh); });
      return;
    case DType::Q5_1:
      each(reinterpret_cast<BlockQ5_1*>(row), kQK, [](auto& b) { std::memset(b.qs, 0xFF, sizeof b.qs), std::memset(b.qh, 0xFF, sizeof b.qh); });
      return;
    case DType::Q8_0: each(reinterpret_cast<BlockQ8_0*>(row), kQK, [](auto& b) { std::memset(b.qs, 0x7F, sizeof b.qs); }); return;
    case DType::MXFP4: each(reinterpret_cast<BlockMXFP4*>(row), kQK, [](auto& b) { std::memset(b.qs, 0x77, sizeof b.qs); }); return;
    case DType::Q2_K: each(reinterpret_cast<BlockQ2_K*>(row), kQK_K, [](auto& b) { std::memset(b.qs, 0xFF, sizeof b.qs); }); return;
    case DType::Q3_K:
      each(reinterpret_cast<BlockQ3_K*>(row), kQK_K, [](auto& b) { std::memset(b.qs, 0xFF, sizeof b.qs), std::memset(b.hmask, 0xFF, sizeof b.hmask); });
      return;
    case DType::Q4_K: each(reinterpret_cast<BlockQ4_K*>(row), kQK_K, [](auto& b) { std::memset(b.qs, 0xFF, sizeof b.qs); }); return;
    case DType::Q5_K:
      each(reinterpret_cast<BlockQ5_K*>(row), kQK_K, [](auto& b) { std::memset(b.qs, 0xFF, sizeof b.qs), std::memset(b.qh, 0xFF, sizeof b.qh); });
      return;
    case DType::Q6_K:
      each(reinterpret_cast<BlockQ6_K*>(row), kQK_K, [](auto& b) { std::memset(b.ql, 0xFF, sizeof b.ql), std::memset(b.qh, 0xFF, sizeof b.qh); });
      return;
    default: FAIL() << dtype_name(t);
  }
}

// Every code at its largest against activations all at +127 or all at -127
// (and half and half): the partial sums a level keeps in int16 are at their
// largest there, so a run one vector too long would saturate. Every level's
// bits must stay the scalar reference's, whose sums are int32.
TEST_P(FastGemmLevel, LargestCodesAndActivationsDoNotSaturate) {
  const KernelTable table = build_kernel_table(GetParam());
  const KernelTable scalar = build_kernel_table(SimdLevel::kScalar);
  std::mt19937 rng(17);
  for (DType t : fast_types())
   for (FastActs form : forms_of(t)) {
    Problem p = make_problem(rng, t, 19, 512, 9);
    const size_t rb = row_bytes(t, p.cols);
    for (int64_t r = 0; r < p.rows; ++r) max_codes(t, p.w.data() + r * rb, p.cols);
    for (int64_t i = 0; i < p.n_tokens; ++i)
      for (int64_t k = 0; k < p.cols; ++k)
        p.x[static_cast<size_t>(i * p.cols + k)] = i % 3 == 0 ? 1.5f : i % 3 == 1 ? -1.5f : (k < 256 ? 2.0f : -2.0f);
    const FastMatrix m = FastMatrix::pack(t, p.w.data(), p.rows, p.cols, nullptr, {}, form);
    const FastActivations a = quantize(p, form);
    ASSERT_NEAR(a.value(0, 0), 1.5f, 1e-6f);
    const std::vector<float> y = run(table, m, a, 0, p.n_tokens), y_ref = run(scalar, m, a, 0, p.n_tokens);
    for (size_t i = 0; i < y.size(); ++i)
      ASSERT_EQ(testing::bits_of(y[i]), testing::bits_of(y_ref[i]))
          << dtype_name(t) << " (" << form_name(form) << ") output " << i << ": " << y[i] << " != " << y_ref[i];
  }
}

INSTANTIATE_TEST_SUITE_P(Levels, FastGemmLevel,
                         ::testing::Values(SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512, SimdLevel::kAmx),
                         [](const ::testing::TestParamInfo<SimdLevel>& i) { return std::string(level_name(i.param)); });

}  // namespace
}  // namespace inferd::kernels
