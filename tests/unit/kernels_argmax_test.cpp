// range_max (greedy sampling's argmax) at every level this CPU runs, against
// the plain loop it replaces: the first index of the largest non-NaN value,
// ties to the lower index, -inf rows, all-NaN rows.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/argmax.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels_test_util.h"

namespace inferd::kernels {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// The reference: one index at a time.
RangeMax plain_range_max(const float* x, int64_t n) {
  RangeMax best{-kInf, -1};
  for (int64_t i = 0; i < n; ++i)
    if (x[i] > best.value || (best.index < 0 && x[i] == -kInf)) best = {x[i], i};
  return best;
}

void expect_same(const RangeMax& got, const RangeMax& want, const std::string& what) {
  EXPECT_EQ(got.index, want.index) << what;
  if (want.index >= 0) {
    EXPECT_EQ(got.value, want.value) << what;
  }
}

TEST(KernelsArgmax, EveryLevelFindsTheFirstLargestInLanesTailsTiesAndNaNs) {
  std::mt19937 rng(5);
  std::normal_distribution<float> dist;
  for (SimdLevel level : testing::runnable_levels()) {
    const KernelTable t = build_kernel_table(level);
    ASSERT_NE(t.ops.range_max, nullptr);
    for (int64_t n : {1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 1000, 49152}) {
      for (int trial = 0; trial < 40; ++trial) {
        std::vector<float> x(n);
        for (float& v : x) v = dist(rng);
        std::uniform_int_distribution<int64_t> pos(0, n - 1);
        const float top = 10.0f;
        // Trials place one to three equal maxima, NaNs and -infs at random
        // places (lanes, the tail, both): the first maximum must win.
        for (int k = 0; k < 1 + trial % 3; ++k) x[pos(rng)] = top;
        for (int k = 0; k < trial % 4; ++k) x[pos(rng)] = std::nanf("");
        for (int k = 0; k < trial % 5; ++k) x[pos(rng)] = -kInf;
        if (trial % 7 == 0) x[pos(rng)] = kInf;
        expect_same(t.ops.range_max(x.data(), n), plain_range_max(x.data(), n),
                    std::string(t.level) + " n " + std::to_string(n) + " trial " + std::to_string(trial));
      }
      // Rows with nothing above -inf: the first -inf; all NaN: none.
      std::vector<float> masked(n, std::nanf(""));
      masked[n / 2] = -kInf;
      if (n > 3) masked[n - 1] = -kInf;
      expect_same(t.ops.range_max(masked.data(), n), {-kInf, n / 2}, std::string(t.level) + " -inf row");
      const std::vector<float> nans(n, std::nanf(""));
      EXPECT_EQ(t.ops.range_max(nans.data(), n).index, -1) << t.level << " all NaN";
    }
  }
}

}  // namespace
}  // namespace inferd::kernels
