// Packed (row-interleaved) matmul: every SIMD level is bit-identical to the
// scalar reference, results do not depend on how many tokens share a call or
// how groups are split across threads, and they agree with the GGML-layout dot
// products up to float rounding.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/packed.h"
#include "kernels/cpu/quants.h"
#include "kernels_test_util.h"

namespace inferd::kernels {
namespace {

using testing::level_name;
using testing::quantize_ref;
using testing::random_floats;
using testing::runnable_levels;
using testing::Problem;
using testing::make_problem;

// All tokens of x[tok0, tok0 + n) at once, one thread.
std::vector<float> run(const KernelTable& table, const PackedMatrix& m, const Problem& p, int64_t tok0, int64_t n) {
  PackedActivations a;
  a.resize(n, p.cols);
  quantize_packed_rows(p.x.data() + tok0 * p.cols, 0, n, a);
  std::vector<float> y(static_cast<size_t>(n * p.rows), NAN);
  packed_matmul_groups_with(table, m, a, 0, m.groups(), y.data(), p.rows);
  return y;
}

const DType kPackable[] = {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q8_0, DType::MXFP4};

TEST(KernelsPacked, EveryLevelMatchesTheScalarReferenceBitForBit) {
  std::mt19937 rng(7);
  const KernelTable scalar = build_kernel_table(SimdLevel::kScalar);
  for (DType t : kPackable) {
    // 37 rows: two full groups and a partial one; 11 blocks; steps of 1 to 11
    // tokens (tiles of up to 8 and the rest).
    const Problem p = make_problem(rng, t, 37, 352, 11);
    const PackedMatrix m = PackedMatrix::pack(t, p.w.data(), p.rows, p.cols);
    for (int64_t n = 1; n <= p.n_tokens; ++n) {
      const std::vector<float> want = run(scalar, m, p, 0, n);
      for (SimdLevel level : runnable_levels()) {
        const std::vector<float> got = run(build_kernel_table(level), m, p, 0, n);
        for (size_t i = 0; i < want.size(); ++i) {
          ASSERT_EQ(testing::bits_of(got[i]), testing::bits_of(want[i]))
              << dtype_name(t) << " " << level_name(level) << " n=" << n << " element " << i;
        }
      }
    }
  }
}

// The activations' quantizer (Q8_1 into the packed fields) at every level
// against the reference block by block: the quants, d, s and the quant sums,
// on blocks of every scale, an all-zero block and exact ties (x.5 * d).
TEST(KernelsPacked, ActivationQuantizerMatchesTheReferenceAtEveryLevel) {
  std::mt19937 rng(11);
  const int64_t n_blocks = 40;
  std::vector<float> x = random_floats(rng, n_blocks * 32);
  for (int64_t b = 0; b < n_blocks; ++b) {
    const float scale = std::ldexp(1.0f, static_cast<int>(b % 20) - 10);
    for (int64_t i = 0; i < 32; ++i) x[b * 32 + i] *= scale;
  }
  std::fill(x.begin() + 3 * 32, x.begin() + 4 * 32, 0.0f);
  for (int64_t i = 0; i < 32; ++i) x[5 * 32 + i] = (i == 0 ? 127.0f : static_cast<float>(i % 7) + 0.5f);
  struct Out {
    std::vector<int8_t> qs = std::vector<int8_t>(n_blocks * 32);
    std::vector<float> d = std::vector<float>(n_blocks), s = std::vector<float>(n_blocks);
    std::vector<int32_t> sum = std::vector<int32_t>(n_blocks);
  };
  auto quantize = [&](const KernelTable& table) {
    Out o;
    table.packed_quantize(x.data(), n_blocks, o.qs.data(), o.d.data(), o.s.data(), o.sum.data());
    return o;
  };
  const Out want = quantize(build_kernel_table(SimdLevel::kScalar));
  EXPECT_EQ(want.qs[5 * 32 + 1], 2);  // 1.5 rounds to even
  EXPECT_EQ(want.qs[5 * 32 + 3], 4);  // 3.5 too
  for (SimdLevel level : runnable_levels()) {
    const Out got = quantize(build_kernel_table(level));
    EXPECT_EQ(got.qs, want.qs) << level_name(level);
    EXPECT_EQ(got.sum, want.sum) << level_name(level);
    for (int64_t b = 0; b < n_blocks; ++b) {
      EXPECT_EQ(testing::bits_of(got.d[b]), testing::bits_of(want.d[b])) << level_name(level) << " block " << b;
      EXPECT_EQ(testing::bits_of(got.s[b]), testing::bits_of(want.s[b])) << level_name(level) << " block " << b;
    }
  }
}

TEST(KernelsPacked, ResultsDoNotDependOnTheBatch) {
  std::mt19937 rng(8);
  for (SimdLevel level : runnable_levels()) {
    const KernelTable table = build_kernel_table(level);
    for (DType t : kPackable) {
      const Problem p = make_problem(rng, t, 48, 576, 13);
      const PackedMatrix m = PackedMatrix::pack(t, p.w.data(), p.rows, p.cols);
      const std::vector<float> all = run(table, m, p, 0, p.n_tokens);
      for (int64_t tok = 0; tok < p.n_tokens; ++tok) {
        const std::vector<float> one = run(table, m, p, tok, 1);
        for (int64_t r = 0; r < p.rows; ++r) {
          ASSERT_EQ(testing::bits_of(one[r]), testing::bits_of(all[tok * p.rows + r]))
              << dtype_name(t) << " " << level_name(level) << " token " << tok << " row " << r;
        }
      }
    }
  }
}

TEST(KernelsPacked, AgreesWithGgmlLayoutDotProducts) {
  std::mt19937 rng(9);
  for (DType t : kPackable) {
    const Problem p = make_problem(rng, t, 40, 576, 3);
    const PackedMatrix m = PackedMatrix::pack(t, p.w.data(), p.rows, p.cols);
    const std::vector<float> got = run(kernel_table(), m, p, 0, p.n_tokens);
    const size_t w_row = row_bytes(t, p.cols);
    std::vector<uint8_t> act(row_bytes(vec_dot_type(t), p.cols));
    for (int64_t tok = 0; tok < p.n_tokens; ++tok) {
      ref::quantize_row(vec_dot_type(t), p.x.data() + tok * p.cols, act.data(), p.cols);
      for (int64_t r = 0; r < p.rows; ++r) {
        const float want = ref::vec_dot(t, p.cols, p.w.data() + r * w_row, act.data());
        EXPECT_NEAR(got[tok * p.rows + r], want, 1e-5f * (1.0f + std::fabs(want)))
            << dtype_name(t) << " token " << tok << " row " << r;
      }
    }
  }
}

TEST(KernelsPacked, ThreadSplitDoesNotChangeResults) {
  std::mt19937 rng(10);
  for (DType t : kPackable) {
    const Problem p = make_problem(rng, t, 100, 192, 5);
    const PackedMatrix m = PackedMatrix::pack(p.type, p.w.data(), p.rows, p.cols);
    const std::vector<float> want = run(kernel_table(), m, p, 0, p.n_tokens);
    for (int threads : {1, 2, 3}) {
      ThreadPool pool(threads);
      PackedActivations scratch;
      std::vector<float> y(want.size(), NAN);
      packed_matmul(m, p.x.data(), p.n_tokens, y.data(), pool, scratch);
      for (size_t i = 0; i < y.size(); ++i) {
        ASSERT_EQ(testing::bits_of(y[i]), testing::bits_of(want[i])) << dtype_name(t) << " " << threads;
      }
    }
  }
}

// An arena sized by space_for() holds every matrix it was sized for, also
// when their sizes are not multiples of 64 (Q4_0: 288 bytes per block of a
// group), and a matrix packed into it gives the bits of one packed on its own.
TEST(KernelsPacked, ArenaSizedBySpaceForHoldsEveryMatrix) {
  std::mt19937 rng(9);
  std::vector<Problem> problems;
  size_t space = 0;
  for (DType t : kPackable) {
    problems.push_back(make_problem(rng, t, 37, 352, 3));
    space += PackedArena::space_for(PackedMatrix::packed_bytes(t, 37, 352));
  }
  PackedArena arena(space);
  const KernelTable table = build_kernel_table(SimdLevel::kScalar);
  for (const Problem& p : problems) {
    const PackedMatrix in_arena = PackedMatrix::pack(p.type, p.w.data(), p.rows, p.cols, &arena);
    const PackedMatrix own = PackedMatrix::pack(p.type, p.w.data(), p.rows, p.cols);
    EXPECT_EQ(in_arena.bytes(), own.bytes());
    const std::vector<float> want = run(table, own, p, 0, p.n_tokens), got = run(table, in_arena, p, 0, p.n_tokens);
    for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(testing::bits_of(got[i]), testing::bits_of(want[i])) << i;
  }
  EXPECT_EQ(arena.take(1), nullptr) << "a matrix was packed outside the arena";
}

// MXFP4 rows of random bytes, exponents from the subnormal scales (e = 0, 1)
// to large ones: rows % 8 == 0 packed in GGML's repacked order, the others in
// its vec_dot order, even and odd block counts (the vec_dot order's last odd
// block), 1 to 9 tokens. Every level gives the bits of the GGML-row kernels of
// the same orders (ref::vec_dot for ggml_vec_dot_mxfp4_q8_0, the table's
// repack_tile for the repacked gemv/gemm), on Q8_0 activations as GGML's CPU
// backend quantizes them.
TEST(KernelsPacked, Mxfp4MatchesTheGgmlRowOrdersAtEveryLevel) {
  std::mt19937 rng(21);
  const KernelTable scalar = build_kernel_table(SimdLevel::kScalar);
  for (int64_t rows : {48, 40, 37, 44, 8, 3}) {
    for (int64_t cols : {32, 64, 352, 576}) {
      Problem p = make_problem(rng, DType::MXFP4, rows, cols, 9);
      for (size_t i = 0; i < p.w.size(); ++i) p.w[i] = static_cast<uint8_t>(rng());
      for (size_t b = 0; b < p.w.size() / 17; ++b) {
        const uint32_t pick = rng() % 8;
        p.w[17 * b] = static_cast<uint8_t>(pick < 3 ? pick : 100 + rng() % 50);  // e
      }
      const PackedMatrix m = PackedMatrix::pack(DType::MXFP4, p.w.data(), p.rows, p.cols);
      EXPECT_EQ(m.vec_dot_order(), rows % 8 != 0);
      const size_t w_row = row_bytes(DType::MXFP4, cols), a_row = row_bytes(DType::Q8_0, cols);
      std::vector<uint8_t> act(a_row * p.n_tokens);
      for (int64_t t = 0; t < p.n_tokens; ++t)
        scalar.quantize_q8_0_cpu(p.x.data() + t * cols, act.data() + t * a_row, cols);
      const TypeKernels& k = scalar.type[static_cast<uint32_t>(DType::MXFP4)];
      std::vector<float> want(static_cast<size_t>(rows * p.n_tokens));
      for (int64_t t = 0; t < p.n_tokens; ++t) {
        for (int64_t r = 0; r < rows; ++r) {
          float& w = want[t * rows + r];
          if (rows % 8 == 0) {
            k.repack_tile(cols, p.w.data() + r * w_row, w_row, 1, act.data() + t * a_row, a_row, 1, &w, 1, 1);
          } else {
            w = ref::vec_dot(DType::MXFP4, cols, p.w.data() + r * w_row, act.data() + t * a_row);
          }
        }
      }
      for (SimdLevel level : runnable_levels()) {
        const KernelTable table = build_kernel_table(level);
        for (int64_t n : {int64_t{1}, int64_t{5}, p.n_tokens}) {
          const std::vector<float> got = run(table, m, p, 0, n);
          for (size_t i = 0; i < got.size(); ++i) {
            ASSERT_EQ(testing::bits_of(got[i]), testing::bits_of(want[i]))
                << level_name(level) << " rows=" << rows << " cols=" << cols << " n=" << n << " token " << i / rows
                << " row " << i % rows << ": " << got[i] << " want " << want[i];
          }
        }
      }
    }
  }
}

// The E8M0 scales as GGML makes them (ggml_e8m0_to_fp32_half): 2^(e - 128).
TEST(KernelsPacked, E8m0HalfIsAPowerOfTwo) {
  EXPECT_EQ(testing::bits_of(e8m0_to_f32_half(0)), 0x00200000u);  // 2^-128, subnormal
  EXPECT_EQ(testing::bits_of(e8m0_to_f32_half(1)), 0x00400000u);
  EXPECT_EQ(e8m0_to_f32_half(2), std::ldexp(1.0f, -126));
  EXPECT_EQ(e8m0_to_f32_half(128), 1.0f);
  EXPECT_EQ(e8m0_to_f32_half(127), 0.5f);
  EXPECT_EQ(e8m0_to_f32_half(254), std::ldexp(1.0f, 126));
}

TEST(KernelsPacked, PacksOnlyTheSimpleBlockFormats) {
  EXPECT_TRUE(can_pack(DType::Q4_0));
  EXPECT_TRUE(can_pack(DType::Q4_1));
  EXPECT_TRUE(can_pack(DType::Q5_0));
  EXPECT_TRUE(can_pack(DType::Q8_0));
  EXPECT_TRUE(can_pack(DType::MXFP4));
  EXPECT_FALSE(can_pack(DType::Q4_K));
  EXPECT_FALSE(can_pack(DType::F32));
}

}  // namespace
}  // namespace inferd::kernels
