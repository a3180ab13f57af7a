// Packed (row-interleaved) matmul: every SIMD level is bit-identical to the
// scalar reference, results do not depend on how many tokens share a call or
// how groups are split across threads, and they agree with the GGML-layout dot
// products up to float rounding.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/packed.h"
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

const DType kPackable[] = {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q8_0};

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

TEST(KernelsPacked, PacksOnlyTheSimpleBlockFormats) {
  EXPECT_TRUE(can_pack(DType::Q4_0));
  EXPECT_TRUE(can_pack(DType::Q4_1));
  EXPECT_TRUE(can_pack(DType::Q5_0));
  EXPECT_TRUE(can_pack(DType::Q8_0));
  EXPECT_FALSE(can_pack(DType::Q4_K));
  EXPECT_FALSE(can_pack(DType::F32));
}

}  // namespace
}  // namespace inferd::kernels
