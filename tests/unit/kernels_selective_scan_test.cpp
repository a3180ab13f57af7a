// Mamba-2's selective scan (selective_scan.h): every level gives GGML's own
// bits for each of its builds (tests/data/kernels/ggml_ssm_scan_{avx512,avx2}.bin,
// from tools/reference/ggml_ssm_scan_reference.c) and the scalar reference's, the reference agrees with the scan computed naively in
// double, and a state carried from call to call gives the bits of one long
// call (what chunked prefill and decode steps rely on).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <vector>

#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/selective_scan.h"
#include "kernels_test_util.h"
#include "test_data.h"

namespace inferd::kernels {
namespace {

using testing::bits_of;
using testing::level_name;
using testing::random_floats;
using testing::runnable_levels;

void expect_same_bits(const std::vector<float>& want, const std::vector<float>& got, const std::string& what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(bits_of(want[i]), bits_of(got[i])) << what << " at " << i;
}

struct ScanInputs {
  int64_t n_tokens, n_heads, head_dim, n_groups, d_state;
  std::vector<float> x, dt, a, b, c, state;
};

ScanInputs make_scan_inputs(int64_t n_tokens, int64_t n_heads, int64_t head_dim, int64_t n_groups, int64_t d_state,
                            unsigned seed) {
  std::mt19937 rng(seed);
  ScanInputs s{n_tokens, n_heads, head_dim, n_groups, d_state, {}, {}, {}, {}, {}, {}};
  s.x = random_floats(rng, n_tokens * n_heads * head_dim);
  // Time steps on both sides of softplus's cut at 20, decays as -exp(A_log).
  std::uniform_real_distribution<float> dt(-4.0f, 3.0f), a_log(-2.0f, 1.0f);
  for (int64_t i = 0; i < n_tokens * n_heads; ++i) s.dt.push_back(i % 7 == 3 ? 21.0f + dt(rng) : dt(rng));
  for (int64_t h = 0; h < n_heads; ++h) s.a.push_back(-std::exp(a_log(rng)));
  s.b = random_floats(rng, n_tokens * n_groups * d_state);
  s.c = random_floats(rng, n_tokens * n_groups * d_state);
  s.state = random_floats(rng, n_heads * head_dim * d_state, 0.5f);
  return s;
}

// Tokens [t0, t0 + n) of s through fn, heads split in two ranges; state updated in place.
std::vector<float> run_scan(SelectiveScanFn fn, const ScanInputs& s, int64_t t0, int64_t n, std::vector<float>& state) {
  const int64_t HP = s.n_heads * s.head_dim, GN = s.n_groups * s.d_state;
  std::vector<float> y(static_cast<size_t>(n * HP), -1.0f);
  SelectiveScanArgs a;
  a.x = s.x.data() + t0 * HP, a.x_stride = HP;
  a.dt = s.dt.data() + t0 * s.n_heads, a.dt_stride = s.n_heads;
  a.a = s.a.data();
  a.b = s.b.data() + t0 * GN, a.c = s.c.data() + t0 * GN, a.bc_stride = GN;
  a.n_tokens = n, a.n_heads = s.n_heads, a.head_dim = s.head_dim, a.n_groups = s.n_groups, a.d_state = s.d_state;
  a.state = state.data(), a.y = y.data(), a.y_stride = HP;
  const int64_t mid = s.n_heads / 3;
  fn(a, 0, mid);
  fn(a, mid, s.n_heads);
  return y;
}

SelectiveScanFn scan_of(SimdLevel level, GgmlFlavour flavour) {
  return build_kernel_table(level).ops.selective_scan[static_cast<int>(flavour)];
}

// GGML's ssm_scan on the cases of ggml_ssm_scan_reference.c: per case its
// inputs, then GGML's y and final state.
struct GgmlScanCase {
  ScanInputs in;
  std::vector<float> y, state_after;
};

std::vector<GgmlScanCase> read_ggml_cases(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f) << "missing " << path;
  char magic[8] = {};
  int32_t n_cases = 0;
  f.read(magic, 8);
  f.read(reinterpret_cast<char*>(&n_cases), 4);
  EXPECT_EQ(std::string(magic, 8), "SSMSCAN1");
  auto floats = [&f](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * 4));
    return v;
  };
  std::vector<GgmlScanCase> cases;
  for (int32_t k = 0; k < n_cases && f; ++k) {
    int32_t dims[5];
    f.read(reinterpret_cast<char*>(dims), sizeof dims);
    GgmlScanCase c;
    ScanInputs& s = c.in;
    s.n_tokens = dims[0], s.n_heads = dims[1], s.head_dim = dims[2], s.n_groups = dims[3], s.d_state = dims[4];
    const int64_t T = s.n_tokens, HP = s.n_heads * s.head_dim, GN = s.n_groups * s.d_state;
    s.x = floats(T * HP);
    s.dt = floats(T * s.n_heads);
    s.a = floats(s.n_heads);
    s.b = floats(T * GN);
    s.c = floats(T * GN);
    s.state = floats(HP * s.d_state);
    c.y = floats(T * HP);
    c.state_after = floats(HP * s.d_state);
    cases.push_back(std::move(c));
  }
  EXPECT_TRUE(f) << path << " is truncated";
  EXPECT_EQ(static_cast<int32_t>(cases.size()), n_cases);
  return cases;
}

TEST(KernelsSelectiveScan, EveryLevelGivesGgmlsBitsOfEachBuild) {
  for (auto [file, flavour] : {std::pair{"ggml_ssm_scan_avx512.bin", GgmlFlavour::kAvx512},
                               std::pair{"ggml_ssm_scan_avx2.bin", GgmlFlavour::kAvx2}}) {
    const auto cases = read_ggml_cases(inferd::test::test_data_root() + "/kernels/" + file);
    ASSERT_GE(cases.size(), 7u) << file;
    for (const GgmlScanCase& c : cases) {
      for (SimdLevel level : runnable_levels()) {
        auto state = c.in.state;
        const auto y = run_scan(scan_of(level, flavour), c.in, 0, c.in.n_tokens, state);
        const std::string what = std::string(file) + " at level " + level_name(level) + ", d_state " +
                                 std::to_string(c.in.d_state) + " tokens " + std::to_string(c.in.n_tokens) +
                                 " groups " + std::to_string(c.in.n_groups);
        expect_same_bits(c.y, y, what);
        expect_same_bits(c.state_after, state, what + " state");
      }
    }
  }
}

TEST(KernelsSelectiveScan, MatchesTheScanInDouble) {
  // Four heads in two groups: heads 0-1 read group 0's B and C, heads 2-3 group 1's.
  const ScanInputs s = make_scan_inputs(6, 4, 8, 2, 48, 7);
  const int64_t P = s.head_dim, N = s.d_state, H = s.n_heads;
  for (GgmlFlavour flavour : {GgmlFlavour::kAvx512, GgmlFlavour::kAvx2}) {
    auto state = s.state;
    const auto y = run_scan(scan_of(SimdLevel::kScalar, flavour), s, 0, s.n_tokens, state);
    std::vector<double> st(s.state.begin(), s.state.end());
    for (int64_t t = 0; t < s.n_tokens; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        const double raw = s.dt[t * H + h];
        const double dt = raw > 20.0 ? raw : std::log1p(std::exp(raw));
        const double dA = std::exp(dt * s.a[h]);
        const int64_t g = h / (H / s.n_groups);
        for (int64_t i = 0; i < P; ++i) {
          double yi = 0.0;
          for (int64_t k = 0; k < N; ++k) {
            double& e = st[(h * P + i) * N + k];
            e = e * dA + s.b[(t * s.n_groups + g) * N + k] * s.x[(t * H + h) * P + i] * dt;
            yi += e * s.c[(t * s.n_groups + g) * N + k];
          }
          EXPECT_NEAR(y[(t * H + h) * P + i], yi, 1e-3 * (1.0 + std::fabs(yi)))
              << ggml_flavour_name(flavour) << " t" << t << " h" << h << " i" << i;
        }
      }
    }
    for (size_t e = 0; e < st.size(); ++e) ASSERT_NEAR(state[e], st[e], 1e-3 * (1.0 + std::fabs(st[e]))) << e;
  }
}

TEST(KernelsSelectiveScan, EveryLevelGivesTheScalarBitsOfEachBuild) {
  // State sizes below, at and past each build's vector step (32, 64), with a
  // tail, and Nemotron-H's 128; n_tokens 1 is a decode step.
  for (int64_t d_state : {16, 32, 40, 64, 96, 128}) {
    for (int64_t n_tokens : {1, 5}) {
      const ScanInputs s = make_scan_inputs(n_tokens, 6, 4, 3, d_state, static_cast<unsigned>(d_state * 10 + n_tokens));
      for (GgmlFlavour flavour : {GgmlFlavour::kAvx512, GgmlFlavour::kAvx2}) {
        auto ref_state = s.state;
        const auto want = run_scan(scan_of(SimdLevel::kScalar, flavour), s, 0, n_tokens, ref_state);
        for (SimdLevel level : runnable_levels()) {
          auto state = s.state;
          const auto got = run_scan(scan_of(level, flavour), s, 0, n_tokens, state);
          const std::string what = std::string(level_name(level)) + "/" + ggml_flavour_name(flavour) + " d_state " +
                                   std::to_string(d_state) + " tokens " + std::to_string(n_tokens);
          expect_same_bits(want, got, what);
          expect_same_bits(ref_state, state, what + " state");
        }
      }
    }
  }
}

TEST(KernelsSelectiveScan, TheTwoBuildsDifferOnlyInRounding) {
  const ScanInputs s = make_scan_inputs(4, 2, 16, 1, 128, 11);
  auto s512 = s.state, s2 = s.state;
  const auto a = run_scan(scan_of(SimdLevel::kScalar, GgmlFlavour::kAvx512), s, 0, 4, s512);
  const auto b = run_scan(scan_of(SimdLevel::kScalar, GgmlFlavour::kAvx2), s, 0, 4, s2);
  int differ = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(a[i], b[i], 1e-4 * (1.0 + std::fabs(a[i])));
    differ += bits_of(a[i]) != bits_of(b[i]);
  }
  EXPECT_GT(differ, 0) << "the two summation orders should round differently somewhere";
  expect_same_bits(s512, s2, "the state (no sum in it)");
}

TEST(KernelsSelectiveScan, CarriedStateEqualsOneLongCall) {
  const ScanInputs s = make_scan_inputs(9, 4, 8, 2, 64, 13);
  for (SimdLevel level : runnable_levels()) {
    for (GgmlFlavour flavour : {GgmlFlavour::kAvx512, GgmlFlavour::kAvx2}) {
      const SelectiveScanFn fn = scan_of(level, flavour);
      auto long_state = s.state;
      const auto whole = run_scan(fn, s, 0, s.n_tokens, long_state);
      auto state = s.state;
      std::vector<float> pieces;
      int64_t t = 0;
      for (int64_t len : {3, 1, 1, 4}) {  // a prompt in chunks, then decode steps
        const auto out = run_scan(fn, s, t, len, state);
        pieces.insert(pieces.end(), out.begin(), out.end());
        t += len;
      }
      ASSERT_EQ(t, s.n_tokens);
      const std::string what = std::string(level_name(level)) + "/" + ggml_flavour_name(flavour);
      expect_same_bits(whole, pieces, what);
      expect_same_bits(long_state, state, what + " state");
    }
  }
}

}  // namespace
}  // namespace inferd::kernels
