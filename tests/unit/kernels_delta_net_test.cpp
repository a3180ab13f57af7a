// The kernels of a Gated DeltaNet layer (short_conv.h, gated_delta_rule.h, and
// silu / l2_norm_row): each level gives the scalar reference's bits for each
// GGML build, the reference agrees with the rule computed naively in double,
// and a state carried from call to call gives the bits of one long call
// (what chunked prefill and decode steps rely on).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/gated_delta_rule.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/rms_norm.h"
#include "kernels/cpu/short_conv.h"
#include "kernels_test_util.h"

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

// ---- short convolution ---------------------------------------------------

struct ConvCase {
  int64_t channels, taps, n_tokens;
};

std::vector<float> run_conv(ShortConvFn fn, const std::vector<float>& x, int64_t n_tokens, int64_t channels,
                            const std::vector<float>& w, int64_t taps, std::vector<float>& state) {
  std::vector<float> out(static_cast<size_t>(n_tokens * channels), -1.0f);
  ShortConvArgs a;
  a.x = x.data(), a.x_stride = channels, a.n_tokens = n_tokens, a.channels = channels;
  a.weight = w.data(), a.taps = taps, a.state = state.data(), a.out = out.data(), a.out_stride = channels;
  // Two channel ranges, as two threads would split them.
  const int64_t mid = channels / 3;
  fn(a, 0, mid);
  fn(a, mid, channels);
  return out;
}

// Row `row` of a convolution's window at channel c: the taps - 1 state rows,
// then the inputs.
float window_input(const std::vector<float>& state0, const std::vector<float>& x, int64_t channels, int64_t taps,
                   int64_t row, int64_t c) {
  return row < taps - 1 ? state0[row * channels + c] : x[(row - taps + 1) * channels + c];
}

TEST(KernelsShortConv, MatchesTheConvolutionInDouble) {
  std::mt19937 rng(1);
  const int64_t channels = 37, taps = 4, n = 9;
  const auto x = random_floats(rng, n * channels), w = random_floats(rng, taps * channels);
  auto state0 = random_floats(rng, (taps - 1) * channels);
  auto state = state0;
  const auto out = run_conv(detail::short_conv_scalar, x, n, channels, w, taps, state);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t c = 0; c < channels; ++c) {
      double want = 0.0;
      for (int64_t i = 0; i < taps; ++i) {
        const double in = window_input(state0, x, channels, taps, t + i, c);
        want += in * w[i * channels + c];
      }
      EXPECT_NEAR(out[t * channels + c], want, 1e-5 * (1.0 + std::fabs(want))) << t << "," << c;
    }
  }
  // The state is the window's last taps - 1 rows: the last inputs.
  for (int64_t r = 0; r < taps - 1; ++r)
    for (int64_t c = 0; c < channels; ++c) EXPECT_EQ(state[r * channels + c], x[(n - taps + 1 + r) * channels + c]);
}

// GGML's build (checked against llama.cpp's ssm_conv on tiny-qwen35: its
// 4-tap sums are fma chains) rounds the products of whole runs of 8 taps and
// fuses the rest: 4 taps all fused, 12 taps 8 rounded then 4 fused.
TEST(KernelsShortConv, FusesTheTapsPastWholeRunsOfEight) {
  std::mt19937 rng(5);
  for (const int64_t taps : {int64_t{4}, int64_t{12}}) {
    const int64_t channels = 19, n = 3;
    const auto x = random_floats(rng, n * channels), w = random_floats(rng, taps * channels);
    auto state0 = random_floats(rng, (taps - 1) * channels);
    auto state = state0;
    const auto out = run_conv(detail::short_conv_scalar, x, n, channels, w, taps, state);
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t c = 0; c < channels; ++c) {
        float want = 0.0f;
        for (int64_t i = 0; i < taps; ++i) {
          const float in = window_input(state0, x, channels, taps, t + i, c);
          if (i < taps - taps % 8) {
            volatile float product = in * w[i * channels + c];
            want += product;
          } else {
            want = std::fma(in, w[i * channels + c], want);
          }
        }
        EXPECT_EQ(out[t * channels + c], want) << "taps " << taps << ", token " << t << ", channel " << c;
      }
    }
  }
}

TEST(KernelsShortConv, EveryLevelGivesTheScalarBits) {
  for (const ConvCase cc : {ConvCase{5, 4, 1}, ConvCase{16, 4, 3}, ConvCase{67, 4, 7}, ConvCase{128, 3, 2},
                            ConvCase{33, 1, 4}, ConvCase{200, 4, 17}}) {
    std::mt19937 rng(static_cast<unsigned>(cc.channels * 31 + cc.n_tokens));
    const auto x = random_floats(rng, cc.n_tokens * cc.channels), w = random_floats(rng, cc.taps * cc.channels);
    const auto state0 = random_floats(rng, (cc.taps - 1) * cc.channels);
    auto ref_state = state0;
    const auto want = run_conv(detail::short_conv_scalar, x, cc.n_tokens, cc.channels, w, cc.taps, ref_state);
    for (SimdLevel level : runnable_levels()) {
      auto state = state0;
      const auto got = run_conv(build_kernel_table(level).ops.short_conv, x, cc.n_tokens, cc.channels, w, cc.taps, state);
      const std::string what = std::string(level_name(level)) + " channels " + std::to_string(cc.channels);
      expect_same_bits(want, got, what);
      expect_same_bits(ref_state, state, what + " state");
    }
  }
}

TEST(KernelsShortConv, CarriedStateEqualsOneLongCall) {
  std::mt19937 rng(3);
  const int64_t channels = 70, taps = 4, n = 11;
  const auto x = random_floats(rng, n * channels), w = random_floats(rng, taps * channels);
  for (SimdLevel level : runnable_levels()) {
    const ShortConvFn fn = build_kernel_table(level).ops.short_conv;
    std::vector<float> long_state((taps - 1) * channels, 0.0f);
    const auto whole = run_conv(fn, x, n, channels, w, taps, long_state);
    // The same tokens in pieces of 1, 2 (fewer than the window keeps) and more.
    std::vector<float> state((taps - 1) * channels, 0.0f), pieces;
    int64_t t = 0;
    for (int64_t len : {1, 2, 1, 4, 3}) {
      const std::vector<float> part(x.begin() + t * channels, x.begin() + (t + len) * channels);
      const auto out = run_conv(fn, part, len, channels, w, taps, state);
      pieces.insert(pieces.end(), out.begin(), out.end());
      t += len;
    }
    ASSERT_EQ(t, n);
    expect_same_bits(whole, pieces, level_name(level));
    expect_same_bits(long_state, state, std::string(level_name(level)) + " state");
  }
}

TEST(KernelsShortConv, TapMajorWeightsTransposeGgmlRows) {
  const std::vector<float> ggml = {1, 2, 3, 4, 5, 6};  // 2 channels of 3 taps
  std::vector<float> out(6);
  short_conv_weight_tap_major(ggml.data(), 3, 2, out.data());
  EXPECT_EQ(out, (std::vector<float>{1, 4, 2, 5, 3, 6}));
}

// ---- gated delta rule ----------------------------------------------------

struct DeltaInputs {
  int64_t n_tokens, n_k_heads, n_v_heads, size;
  std::vector<float> q, k, v, g, beta, state;
};

DeltaInputs make_delta_inputs(int64_t n_tokens, int64_t n_k_heads, int64_t n_v_heads, int64_t size, unsigned seed) {
  std::mt19937 rng(seed);
  DeltaInputs d{n_tokens, n_k_heads, n_v_heads, size, {}, {}, {}, {}, {}, {}};
  d.q = random_floats(rng, n_tokens * n_k_heads * size);
  d.k = random_floats(rng, n_tokens * n_k_heads * size);
  // q and k arrive L2-normalized in the model.
  for (int64_t r = 0; r < n_tokens * n_k_heads; ++r) {
    l2_norm_row(d.q.data() + r * size, size, 1e-6f);
    l2_norm_row(d.k.data() + r * size, size, 1e-6f);
  }
  d.v = random_floats(rng, n_tokens * n_v_heads * size);
  std::uniform_real_distribution<float> decay(-2.0f, 0.0f), strength(0.0f, 1.0f);
  for (int64_t i = 0; i < n_tokens * n_v_heads; ++i) d.g.push_back(decay(rng)), d.beta.push_back(strength(rng));
  d.state = random_floats(rng, n_v_heads * size * size, 0.1f);
  return d;
}

// Tokens [t0, t0 + n) of d through fn, heads split in two ranges; state updated in place.
std::vector<float> run_delta(GatedDeltaRuleFn fn, const DeltaInputs& d, int64_t t0, int64_t n, std::vector<float>& state) {
  const int64_t S = d.size;
  std::vector<float> out(static_cast<size_t>(n * d.n_v_heads * S), -1.0f);
  GatedDeltaArgs a;
  a.q = d.q.data() + t0 * d.n_k_heads * S, a.k = d.k.data() + t0 * d.n_k_heads * S;
  a.v = d.v.data() + t0 * d.n_v_heads * S;
  a.q_stride = a.k_stride = d.n_k_heads * S, a.v_stride = d.n_v_heads * S;
  a.g = d.g.data() + t0 * d.n_v_heads, a.beta = d.beta.data() + t0 * d.n_v_heads, a.gb_stride = d.n_v_heads;
  a.n_tokens = n, a.n_k_heads = d.n_k_heads, a.n_v_heads = d.n_v_heads, a.size = S;
  a.state = state.data(), a.out = out.data(), a.out_stride = d.n_v_heads * S;
  const int64_t mid = d.n_v_heads / 2;
  fn(a, 0, mid);
  fn(a, mid, d.n_v_heads);
  return out;
}

TEST(KernelsGatedDeltaRule, MatchesTheRuleInDouble) {
  // Two value heads per key head: value head h reads key head h % 2.
  const DeltaInputs d = make_delta_inputs(6, 2, 4, 24, 7);
  for (GgmlFlavour flavour : {GgmlFlavour::kAvx512, GgmlFlavour::kAvx2}) {
    auto state = d.state;
    const auto out = run_delta(build_kernel_table(SimdLevel::kScalar).ops.gated_delta_rule[static_cast<int>(flavour)], d,
                               0, d.n_tokens, state);
    const int64_t S = d.size;
    for (int64_t h = 0; h < d.n_v_heads; ++h) {
      // S[i][j] in double, from the transposed layout M[j][i].
      std::vector<double> st(S * S);
      for (int64_t j = 0; j < S; ++j)
        for (int64_t i = 0; i < S; ++i) st[i * S + j] = d.state[h * S * S + j * S + i];
      const int64_t hk = h % d.n_k_heads;
      for (int64_t t = 0; t < d.n_tokens; ++t) {
        const float* q = &d.q[(t * d.n_k_heads + hk) * S];
        const float* k = &d.k[(t * d.n_k_heads + hk) * S];
        const float* v = &d.v[(t * d.n_v_heads + h) * S];
        const double decay = std::exp(static_cast<double>(d.g[t * d.n_v_heads + h]));
        const double beta = d.beta[t * d.n_v_heads + h];
        for (double& e : st) e *= decay;
        for (int64_t j = 0; j < S; ++j) {
          double sk = 0.0;
          for (int64_t i = 0; i < S; ++i) sk += st[i * S + j] * k[i];
          const double delta = (v[j] - sk) * beta;
          for (int64_t i = 0; i < S; ++i) st[i * S + j] += k[i] * delta;
        }
        for (int64_t j = 0; j < S; ++j) {
          double o = 0.0;
          for (int64_t i = 0; i < S; ++i) o += st[i * S + j] * q[i];
          o /= std::sqrt(static_cast<double>(S));
          EXPECT_NEAR(out[(t * d.n_v_heads + h) * S + j], o, 1e-4) << ggml_flavour_name(flavour) << " h" << h << " t" << t;
        }
      }
      for (int64_t j = 0; j < S; ++j)
        for (int64_t i = 0; i < S; ++i) EXPECT_NEAR(state[h * S * S + j * S + i], st[i * S + j], 1e-4);
    }
  }
}

TEST(KernelsGatedDeltaRule, EveryLevelGivesTheScalarBitsOfEachBuild) {
  // Head sizes below, at and past a vector step (8, 16, 32, 64 lanes) and
  // Qwen3.5's 128; n_tokens 1 is a decode step.
  for (int64_t size : {8, 20, 32, 64, 100, 128}) {
    for (int64_t n_tokens : {1, 5}) {
      const DeltaInputs d = make_delta_inputs(n_tokens, 2, 4, size, static_cast<unsigned>(size * 10 + n_tokens));
      for (GgmlFlavour flavour : {GgmlFlavour::kAvx512, GgmlFlavour::kAvx2}) {
        const int f = static_cast<int>(flavour);
        auto ref_state = d.state;
        const auto want = run_delta(build_kernel_table(SimdLevel::kScalar).ops.gated_delta_rule[f], d, 0, n_tokens, ref_state);
        for (SimdLevel level : runnable_levels()) {
          auto state = d.state;
          const auto got = run_delta(build_kernel_table(level).ops.gated_delta_rule[f], d, 0, n_tokens, state);
          const std::string what = std::string(level_name(level)) + "/" + ggml_flavour_name(flavour) + " size " +
                                   std::to_string(size) + " tokens " + std::to_string(n_tokens);
          expect_same_bits(want, got, what);
          expect_same_bits(ref_state, state, what + " state");
        }
      }
    }
  }
}

TEST(KernelsGatedDeltaRule, TheTwoBuildsDifferOnlyInRounding) {
  const DeltaInputs d = make_delta_inputs(4, 1, 2, 128, 11);
  auto s512 = d.state, s2 = d.state;
  const FloatKernels ops = build_kernel_table(SimdLevel::kScalar).ops;
  const auto a = run_delta(ops.gated_delta_rule[static_cast<int>(GgmlFlavour::kAvx512)], d, 0, 4, s512);
  const auto b = run_delta(ops.gated_delta_rule[static_cast<int>(GgmlFlavour::kAvx2)], d, 0, 4, s2);
  int differ = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(a[i], b[i], 1e-5);
    differ += bits_of(a[i]) != bits_of(b[i]);
  }
  EXPECT_GT(differ, 0) << "the two summation orders should round differently somewhere";
}

TEST(KernelsGatedDeltaRule, CarriedStateEqualsOneLongCall) {
  const DeltaInputs d = make_delta_inputs(9, 2, 4, 64, 13);
  for (SimdLevel level : runnable_levels()) {
    for (GgmlFlavour flavour : {GgmlFlavour::kAvx512, GgmlFlavour::kAvx2}) {
      const GatedDeltaRuleFn fn = build_kernel_table(level).ops.gated_delta_rule[static_cast<int>(flavour)];
      auto long_state = d.state;
      const auto whole = run_delta(fn, d, 0, d.n_tokens, long_state);
      auto state = d.state;
      std::vector<float> pieces;
      int64_t t = 0;
      for (int64_t len : {3, 1, 1, 4}) {  // a prompt in chunks, then decode steps
        const auto out = run_delta(fn, d, t, len, state);
        pieces.insert(pieces.end(), out.begin(), out.end());
        t += len;
      }
      ASSERT_EQ(t, d.n_tokens);
      const std::string what = std::string(level_name(level)) + "/" + ggml_flavour_name(flavour);
      expect_same_bits(whole, pieces, what);
      expect_same_bits(long_state, state, what + " state");
    }
  }
}

// ---- silu and the L2 norm --------------------------------------------------

TEST(KernelsDeltaNetActivations, SiluEveryLevelGivesTheScalarBitsOfEachBuild) {
  std::mt19937 rng(17);
  for (int64_t n : {1, 7, 8, 15, 16, 33, 128, 200}) {
    const auto x = random_floats(rng, n, 4.0f);
    for (GgmlFlavour flavour : {GgmlFlavour::kAvx512, GgmlFlavour::kAvx2}) {
      const int f = static_cast<int>(flavour);
      std::vector<float> want(n);
      build_kernel_table(SimdLevel::kScalar).ops.silu[f](x.data(), want.data(), n);
      for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(want[i], x[i] / (1.0 + std::exp(-double(x[i]))), 1e-5 * (1 + std::fabs(x[i])));
      for (SimdLevel level : runnable_levels()) {
        std::vector<float> got(n);
        build_kernel_table(level).ops.silu[f](x.data(), got.data(), n);
        expect_same_bits(want, got, std::string(level_name(level)) + " n " + std::to_string(n));
      }
    }
  }
}

TEST(KernelsDeltaNetActivations, L2NormGivesUnitRows) {
  std::mt19937 rng(19);
  for (int64_t n : {3, 64, 128}) {
    auto x = random_floats(rng, n, 3.0f);
    l2_norm_row(x.data(), n, 1e-6f);
    double sq = 0.0;
    for (float v : x) sq += double(v) * v;
    EXPECT_NEAR(sq, 1.0, 1e-5) << n;
  }
  std::vector<float> zero(16, 0.0f);
  l2_norm_row(zero.data(), 16, 1e-6f);  // eps keeps a zero row finite
  for (float v : zero) EXPECT_EQ(v, 0.0f);
}

TEST(KernelsDeltaNetActivations, SigmoidAndSoftplus) {
  const std::vector<float> x = {-30.0f, -1.0f, 0.0f, 2.5f, 20.0f, 25.0f};
  std::vector<float> s(x.size()), p(x.size());
  sigmoid(x.data(), s.data(), static_cast<int64_t>(x.size()));
  softplus(x.data(), p.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_NEAR(s[i], 1.0 / (1.0 + std::exp(-double(x[i]))), 1e-7);
    EXPECT_NEAR(p[i], std::log1p(std::exp(double(x[i]))), 2e-6 * (1 + x[i] * (x[i] > 0)));
  }
  EXPECT_EQ(p[5], 25.0f);  // above 20 softplus is x itself
}

}  // namespace
}  // namespace inferd::kernels
