// SwiGLU and GEGLU and the exp polynomials behind SwiGLU (GGML's,
// kernels/cpu/expf_poly.h): every level gives the same bits, close to the exact
// function, with GGML's saturation at the ends of the range; the AVX2 flavour
// gives GGML's AVX2 build's bits (tests/data/kernels/ggml_avx2_activation.txt,
// made by tools/reference/ggml_attention_reference.py).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <random>
#include <vector>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/expf_poly.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/quants.h"
#include "kernels_test_util.h"
#include "test_data.h"

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
  if (best_simd_level() >= SimdLevel::kAvx512) detail::swiglu_avx512(gate.data(), up.data(), simd.data(), n);
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


TEST(KernelsActivation, ExpPolyAvx2IsCloseToExpAndSaturatesLikeGgml) {
  for (float x = -87.0f; x <= 88.0f; x += 0.37f) {
    const double want = std::exp(static_cast<double>(x));
    EXPECT_NEAR(expf_poly_avx2(x) / want, 1.0, 4e-7) << x;
  }
  // Subnormal results (|n| > 126) stay close too.
  for (float x = -103.0f; x < -87.5f; x += 0.25f) {
    const double want = std::exp(static_cast<double>(x));
    EXPECT_NEAR(expf_poly_avx2(x), want, 2e-45 + 1e-6 * want) << x;
  }
  EXPECT_EQ(expf_poly_avx2(0.0f), 1.0f);
  EXPECT_EQ(expf_poly_avx2(-200.0f), 0.0f);
  EXPECT_EQ(expf_poly_avx2(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_TRUE(std::isinf(expf_poly_avx2(200.0f)));
  EXPECT_TRUE(std::isinf(expf_poly_avx2(std::numeric_limits<float>::infinity())));
  // It is a different rounding from expf_poly: some inputs differ in the last bit.
  int differ = 0;
  for (float x = -20.0f; x < 20.0f; x += 0.001f) differ += bits_of(expf_poly_avx2(x)) != bits_of(expf_poly(x));
  EXPECT_GT(differ, 0);
}

// ---- against GGML's AVX2 build --------------------------------------------

struct GluRecord {
  std::string op;
  std::vector<float> gate, up, out;
};

struct ActivationReference {
  std::vector<GluRecord> glu;
  int64_t sweep_n = 0;
  std::vector<uint64_t> sweep_hashes;  // FNV-1a of geglu(x, 1) bits, per 4096 f16 patterns
};

float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

ActivationReference load_activation_reference() {
  const std::string path = inferd::test::test_data_root() + "/kernels/ggml_avx2_activation.txt";
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "missing " << path;
  ActivationReference ref;
  std::string line, tag, word;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ss(line);
    ss >> tag;
    auto hex_floats = [&](std::vector<float>& v) {
      while (ss >> word) v.push_back(float_of(static_cast<uint32_t>(std::stoul(word, nullptr, 16))));
    };
    if (tag == "swiglu" || tag == "geglu") {
      ref.glu.push_back(GluRecord{tag, {}, {}, {}});
    } else if (tag == "gate") {
      hex_floats(ref.glu.back().gate);
    } else if (tag == "up") {
      hex_floats(ref.glu.back().up);
    } else if (tag == "out") {
      hex_floats(ref.glu.back().out);
    } else if (tag == "geglu_f16_sweep") {
      ss >> ref.sweep_n;
      while (ss >> word) ref.sweep_hashes.push_back(std::stoull(word, nullptr, 16));
    }
  }
  return ref;
}

using GluFn = void (*)(const float*, const float*, float*, int64_t);

// The kernels of one operation in the AVX2 flavour this machine can run, by name.
std::vector<std::pair<std::string, GluFn>> avx2_flavour_kernels(const std::string& op) {
  std::vector<std::pair<std::string, GluFn>> fns;
  const bool avx2 = best_simd_level() >= SimdLevel::kAvx2;
  if (op == "swiglu") {
    fns.emplace_back("scalar", detail::swiglu_ggml_avx2_scalar);
    if (avx2) fns.emplace_back("avx2", detail::swiglu_ggml_avx2_fma);
    fns.emplace_back("dispatch", [](const float* g, const float* u, float* o, int64_t n) {
      swiglu(g, u, o, n, GgmlFlavour::kAvx2);
    });
  } else {
    fns.emplace_back("scalar", detail::geglu_scalar);
    if (avx2) fns.emplace_back("f16c", detail::geglu_f16c);
    fns.emplace_back("dispatch", [](const float* g, const float* u, float* o, int64_t n) {
      geglu(g, u, o, n, GgmlFlavour::kAvx2);
    });
    fns.emplace_back("dispatch-avx512-flavour", [](const float* g, const float* u, float* o, int64_t n) {
      geglu(g, u, o, n, GgmlFlavour::kAvx512);
    });
  }
  return fns;
}

TEST(KernelsActivation, Avx2FlavourMatchesGgmlAvx2Build) {
  const ActivationReference ref = load_activation_reference();
  ASSERT_EQ(ref.glu.size(), 2u);
  for (const GluRecord& r : ref.glu) {
    const int64_t n = static_cast<int64_t>(r.gate.size());
    ASSERT_EQ(r.up.size(), r.gate.size());
    ASSERT_EQ(r.out.size(), r.gate.size());
    for (const auto& [name, fn] : avx2_flavour_kernels(r.op)) {
      std::vector<float> got(static_cast<size_t>(n));
      fn(r.gate.data(), r.up.data(), got.data(), n);
      int mismatches = 0;
      for (int64_t i = 0; i < n; ++i) {
        if (bits_of(got[i]) != bits_of(r.out[i]) && ++mismatches <= 5) {
          ADD_FAILURE() << r.op << " " << name << " i " << i << " gate " << r.gate[i] << " up " << r.up[i]
                        << " got " << got[i] << " want " << r.out[i];
        }
      }
      EXPECT_EQ(mismatches, 0) << r.op << " " << name;
      // In place, as the model calls it.
      std::vector<float> in_place = r.gate;
      fn(in_place.data(), r.up.data(), in_place.data(), n);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(bits_of(in_place[i]), bits_of(got[i])) << r.op << " " << name << " " << i;
    }
  }
}

// geglu(x, 1) for every f16 x but NaNs: GGML's GELU table entry by entry
// (and its +-10 cut-offs), compared through per-4096-entry hashes.
TEST(KernelsActivation, GeluTableMatchesGgmlEntryForEntry) {
  const ActivationReference ref = load_activation_reference();
  std::vector<float> xs, ones;
  for (uint32_t h = 0; h < 65536; ++h) {
    if ((h & 0x7c00) == 0x7c00 && (h & 0x03ff) != 0) continue;
    xs.push_back(f16_to_f32(static_cast<uint16_t>(h)));
    ones.push_back(1.0f);
  }
  ASSERT_EQ(static_cast<int64_t>(xs.size()), ref.sweep_n);
  for (const auto& [name, fn] : avx2_flavour_kernels("geglu")) {
    std::vector<float> ys(xs.size());
    fn(xs.data(), ones.data(), ys.data(), static_cast<int64_t>(xs.size()));
    for (size_t seg = 0; seg < ref.sweep_hashes.size(); ++seg) {
      uint64_t hash = 0xcbf29ce484222325ull;
      for (size_t i = seg * 4096; i < ys.size() && i < (seg + 1) * 4096; ++i) {
        const uint32_t b = bits_of(ys[i]);
        for (int byte = 0; byte < 4; ++byte) hash = (hash ^ ((b >> (8 * byte)) & 0xff)) * 0x100000001b3ull;
      }
      EXPECT_EQ(hash, ref.sweep_hashes[seg]) << name << " f16 patterns from entry " << seg * 4096;
    }
  }
}

// gelu (the encoders' FFN) at every level: geglu(x, 1)'s bits, which the
// sweep above ties to GGML's table, for every f16 pattern and for floats
// between them (the rounding to f16 before the lookup), tails included.
TEST(KernelsActivation, GeluSameBitsAtEveryLevelAsGegluTimesOne) {
  std::vector<float> xs;
  for (uint32_t h = 0; h < 65536; ++h) xs.push_back(f16_to_f32(static_cast<uint16_t>(h)));
  std::mt19937 rng(21);
  std::normal_distribution<float> dist(0.0f, 4.0f);
  for (int i = 0; i < 4001; ++i) xs.push_back(dist(rng));
  const int64_t n = static_cast<int64_t>(xs.size());
  const std::vector<float> ones(xs.size(), 1.0f);
  std::vector<float> want(xs.size());
  detail::geglu_scalar(xs.data(), ones.data(), want.data(), n);
  std::vector<std::pair<const char*, void (*)(const float*, float*, int64_t)>> fns = {{"scalar", detail::gelu_scalar}};
  if (best_simd_level() >= SimdLevel::kAvx2) fns.emplace_back("f16c", detail::gelu_f16c);
  if (best_simd_level() >= SimdLevel::kAvx512) fns.emplace_back("avx512", detail::gelu_avx512);
  for (const auto& [name, fn] : fns) {
    std::vector<float> got(xs.size());
    fn(xs.data(), got.data(), n);
    int bad = 0;
    for (int64_t i = 0; i < n; ++i)
      if (!(std::isnan(want[i]) && std::isnan(got[i])) && bits_of(got[i]) != bits_of(want[i]) && bad++ < 3)
        ADD_FAILURE() << name << " x " << xs[i] << ": " << got[i] << " != " << want[i];
    EXPECT_EQ(bad, 0) << name;
  }
}

TEST(KernelsActivation, GegluIsCloseToGelu) {
  std::mt19937 rng(9);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  for (int i = 0; i < 2000; ++i) {
    const float x = dist(rng), u = dist(rng);
    float got;
    geglu(&x, &u, &got, 1, GgmlFlavour::kAvx2);
    const double g = 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    // f16 rounding of x and of the result, and tanh-vs-erf: a few 1e-3 relative.
    EXPECT_NEAR(got, g * u, 4e-3 * std::fabs(u) * (1.0 + std::fabs(g))) << x << " " << u;
  }
}

}  // namespace
}  // namespace inferd::kernels
