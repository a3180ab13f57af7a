// The float kernels (attention, SwiGLU/GeGLU, RMSNorm's lane sums, RoPE) as the
// kernel table hands them out: every level this CPU runs gives the scalar
// level's bits, in each GGML flavour, and the public entry points use the table
// in force. The kernels' own numerics are tested in their files; this checks
// the wiring that picks them.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/quants.h"
#include "kernels/cpu/rms_norm.h"
#include "kernels/cpu/rope.h"
#include "kernels_test_util.h"

namespace inferd::kernels {
namespace {

std::vector<uint32_t> bits_of(const std::vector<float>& v) {
  std::vector<uint32_t> b;
  for (float x : v) b.push_back(testing::bits_of(x));
  return b;
}

std::vector<SimdLevel> levels_here() {
  std::vector<SimdLevel> v = {SimdLevel::kScalar};
  if (best_simd_level() >= SimdLevel::kAvx2) v.push_back(SimdLevel::kAvx2);
  if (best_simd_level() >= SimdLevel::kAvx512) v.push_back(SimdLevel::kAvx512);
  return v;
}

std::vector<float> random_floats(std::mt19937& rng, int64_t n, float sd = 1.0f) {
  std::normal_distribution<float> dist(0.0f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

TEST(KernelsFloatTable, EveryLevelFillsEveryFloatKernel) {
  for (SimdLevel level : levels_here()) {
    const KernelTable t = build_kernel_table(level);
    for (int f = 0; f < kNumGgmlFlavours; ++f) {
      EXPECT_NE(t.ops.attend_heads[f], nullptr);
      EXPECT_NE(t.ops.swiglu[f], nullptr);
    }
    EXPECT_NE(t.ops.geglu, nullptr);
    EXPECT_NE(t.ops.sum_squares_lanes, nullptr);
    EXPECT_NE(t.ops.rope_head, nullptr);
    EXPECT_NE(t.ops.range_max, nullptr);
  }
}

TEST(KernelsFloatTable, EveryLevelGivesTheScalarBitsInEachFlavour) {
  std::mt19937 rng(11);
  const KernelTable scalar = build_kernel_table(SimdLevel::kScalar);
  // Odd lengths reach the kernels' tails.
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{64}, int64_t{333}, int64_t{2048}}) {
    const std::vector<float> gate = random_floats(rng, n, 3.0f), up = random_floats(rng, n);
    for (SimdLevel level : levels_here()) {
      const KernelTable t = build_kernel_table(level);
      SCOPED_TRACE(std::string(t.level) + ", n " + std::to_string(n));
      for (int f = 0; f < kNumGgmlFlavours; ++f) {
        std::vector<float> want(n), got(n);
        scalar.ops.swiglu[f](gate.data(), up.data(), want.data(), n);
        t.ops.swiglu[f](gate.data(), up.data(), got.data(), n);
        EXPECT_EQ(bits_of(got), bits_of(want)) << "swiglu, flavour " << f;
      }
      std::vector<float> want(n), got(n);
      scalar.ops.geglu(gate.data(), up.data(), want.data(), n);
      t.ops.geglu(gate.data(), up.data(), got.data(), n);
      EXPECT_EQ(bits_of(got), bits_of(want)) << "geglu";
      // The lane sums may round differently by level; what RMSNorm takes from
      // them (the settled mean, else the in-order sum) may not.
      const float a = detail::mean_square_if_settled(t.ops.sum_squares_lanes(gate.data(), up.data(), n), n)
                          .value_or(static_cast<float>(detail::sum_squares_in_order(gate.data(), up.data(), n) / n));
      const float b = detail::mean_square_if_settled(scalar.ops.sum_squares_lanes(gate.data(), up.data(), n), n)
                          .value_or(static_cast<float>(detail::sum_squares_in_order(gate.data(), up.data(), n) / n));
      EXPECT_EQ(testing::bits_of(a), testing::bits_of(b)) << "rms mean";
    }
  }
  for (int64_t rope_dim : {int64_t{64}, int64_t{128}}) {
    const std::vector<float> x = random_floats(rng, rope_dim), cos_t = random_floats(rng, rope_dim / 2),
                             sin_t = random_floats(rng, rope_dim / 2);
    for (RopePairs pairs : {RopePairs::kAdjacent, RopePairs::kHalves}) {
      std::vector<float> want = x;
      scalar.ops.rope_head(want.data(), rope_dim, pairs, cos_t.data(), sin_t.data());
      for (SimdLevel level : levels_here()) {
        std::vector<float> got = x;
        build_kernel_table(level).ops.rope_head(got.data(), rope_dim, pairs, cos_t.data(), sin_t.data());
        EXPECT_EQ(bits_of(got), bits_of(want));
      }
    }
  }
}

TEST(KernelsFloatTable, AttentionFromTheTableGivesTheScalarBitsInEachFlavour) {
  std::mt19937 rng(5);
  const int64_t D = 64, heads = 2, bs = 16, n_pos = 300;
  const int64_t n_blocks = (n_pos + bs - 1) / bs;
  std::vector<int32_t> table(n_blocks);
  for (int64_t b = 0; b < n_blocks; ++b) table[b] = static_cast<int32_t>(n_blocks - 1 - b);
  std::vector<uint16_t> k, v;
  for (const float x : random_floats(rng, n_blocks * bs * D * heads)) k.push_back(f32_to_f16(x));
  for (const float x : random_floats(rng, n_blocks * bs * D * heads)) v.push_back(f32_to_f16(x));
  const PagedKV kv{k.data(), v.data(), D * heads, bs, table.data()};
  const std::vector<float> q = random_floats(rng, 2 * D);
  const KernelTable scalar = build_kernel_table(SimdLevel::kScalar);
  for (AttentionPass pass : {AttentionPass::kDecode, AttentionPass::kPrefill}) {
    for (int f = 0; f < kNumGgmlFlavours; ++f) {
      std::vector<float> want(2 * D);
      scalar.ops.attend_heads[f](q.data(), 2, kv, D, D, 37, n_pos, 0.125f, pass, want.data(), nullptr);
      for (SimdLevel level : levels_here()) {
        std::vector<float> got(2 * D);
        build_kernel_table(level).ops.attend_heads[f](q.data(), 2, kv, D, D, 37, n_pos, 0.125f, pass, got.data(), nullptr);
        EXPECT_EQ(bits_of(got), bits_of(want)) << "flavour " << f << ", level " << static_cast<int>(level);
      }
      // The public entry point runs the table in force.
      std::vector<float> pub(2 * D);
      attend_heads(q.data(), 2, kv, D, D, 37, n_pos, 0.125f, pass, pub.data(), static_cast<GgmlFlavour>(f));
      EXPECT_EQ(bits_of(pub), bits_of(want));
    }
  }
}

}  // namespace
}  // namespace inferd::kernels
