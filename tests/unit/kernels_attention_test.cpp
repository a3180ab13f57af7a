// Paged attention: the AVX-512 kernel, and its arithmetic emulated with AVX2
// (attend_heads_avx2), give the scalar kernel's bits for both summation
// orders, and all agree with a plain softmax in double over a
// contiguous copy of the keys and values (rounding the query and the weights
// to f16 as the kernels do), for contexts that span several blocks and
// several 16- and 64-position lane groups; query heads that share a key/value
// head give the same bits computed together. Bit-exactness against llama.cpp
// itself is checked end to end by engine_llamacpp_reference_test (AVX-512
// build), and for the AVX2 flavour kernel by kernel against GGML's AVX2 build
// (tests/data/kernels/ggml_avx2_attention.txt, made by
// tools/reference/ggml_attention_reference.py).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/expf_poly.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/quants.h"
#include "kernels_test_util.h"
#include "test_data.h"

namespace inferd::kernels {
namespace {

using testing::bits_of;
using testing::causal_ranges;
using testing::RandomPagedCache;

struct Cache {
  int64_t D = 64, heads = 3, block_size = 16;
  std::vector<uint16_t> k, v;
  std::vector<int32_t> block_table;
  PagedKV view() const { return PagedKV{k.data(), v.data(), D * heads, block_size, block_table.data()}; }
};

// n_pos positions in shuffled blocks, values in f16.
Cache make_cache(std::mt19937& rng, int64_t n_pos, int64_t D = 64) {
  Cache c;
  c.D = D;
  const int64_t n_blocks = (n_pos + c.block_size - 1) / c.block_size;
  for (int64_t b = 0; b < n_blocks; ++b) c.block_table.push_back(static_cast<int32_t>(b));
  std::shuffle(c.block_table.begin(), c.block_table.end(), rng);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const size_t n = static_cast<size_t>(n_blocks * c.block_size * c.D * c.heads);
  for (size_t i = 0; i < n; ++i) c.k.push_back(f32_to_f16(dist(rng))), c.v.push_back(f32_to_f16(dist(rng)));
  return c;
}

float round_f16(double x) { return f16_to_f32(f32_to_f16(static_cast<float>(x))); }

// Softmax(scale q.k) v over [begin, end) in double, from the same f16 values,
// with the query and the normalized weights rounded to f16.
std::vector<double> naive(const Cache& c, const float* q_in, int64_t head, int64_t begin, int64_t end, float scale) {
  std::vector<float> q(q_in, q_in + c.D);
  for (float& x : q) x = round_f16(x);
  std::vector<double> s;
  for (int64_t p = begin; p < end; ++p) {
    const int64_t slot = int64_t{c.block_table[p / c.block_size]} * c.block_size + p % c.block_size;
    double d = 0;
    for (int64_t i = 0; i < c.D; ++i) d += q[i] * f16_to_f32(c.k[slot * c.D * c.heads + head * c.D + i]);
    s.push_back(d * scale);
  }
  const double mx = *std::max_element(s.begin(), s.end());
  double sum = 0;
  for (double& x : s) sum += (x = std::exp(x - mx));
  std::vector<double> out(static_cast<size_t>(c.D), 0.0);
  for (int64_t p = begin; p < end; ++p) {
    const int64_t slot = int64_t{c.block_table[p / c.block_size]} * c.block_size + p % c.block_size;
    for (int64_t i = 0; i < c.D; ++i)
      out[i] += round_f16(s[p - begin] / sum) * f16_to_f32(c.v[slot * c.D * c.heads + head * c.D + i]);
  }
  return out;
}

TEST(KernelsAttention, MatchesPlainSoftmaxAtEveryLevel) {
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int64_t n_pos : {1, 5, 16, 63, 64, 65, 200, 700}) {
    const Cache c = make_cache(rng, n_pos);
    std::vector<float> q(static_cast<size_t>(c.D));
    for (float& x : q) x = 2.0f * dist(rng);  // sharp enough that the max matters
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.D));
    for (int64_t begin : {int64_t{0}, n_pos / 3}) {
      const std::vector<double> want = naive(c, q.data(), 1, begin, n_pos, scale);
      for (AttentionPass pass : {AttentionPass::kDecode, AttentionPass::kPrefill}) {
        std::vector<float> scalar(static_cast<size_t>(c.D)), simd(static_cast<size_t>(c.D));
        detail::attend_one_head_scalar(q.data(), c.view(), c.D, c.D, begin, n_pos, scale, pass, scalar.data(), nullptr);
        attend_one_head(q.data(), c.view(), c.D, c.D, begin, n_pos, scale, pass, simd.data());
        std::vector<float> fma = scalar;
        std::vector<float> avx2 = scalar;
        if (best_simd_level() >= SimdLevel::kAvx2) {
          detail::attend_one_head_fma(q.data(), c.view(), c.D, c.D, begin, n_pos, scale, pass, fma.data(), nullptr);
          detail::attend_heads_avx2(q.data(), 1, c.view(), c.D, c.D, begin, n_pos, scale, pass, avx2.data(), nullptr);
        }
        if (best_simd_level() >= SimdLevel::kAvx512) {
          detail::attend_one_head_avx512(q.data(), c.view(), c.D, c.D, begin, n_pos, scale, pass, simd.data(), nullptr);
        }
        const char* name = pass == AttentionPass::kDecode ? "decode" : "prefill";
        for (int64_t i = 0; i < c.D; ++i) {
          EXPECT_NEAR(scalar[i], want[i], 2e-5) << name << " " << n_pos << " " << begin << " " << i;
          EXPECT_EQ(bits_of(simd[i]), bits_of(scalar[i])) << name << " " << n_pos << " " << begin << " " << i;
          EXPECT_EQ(bits_of(fma[i]), bits_of(scalar[i])) << name << " " << n_pos << " " << begin << " " << i;
          EXPECT_EQ(bits_of(avx2[i]), bits_of(scalar[i])) << name << " " << n_pos << " " << begin << " " << i;
        }
      }
    }
  }
}

template <auto kOneHead>
void each_head(const float* q, int64_t n_heads, const PagedKV& kv, int64_t head_offset, int64_t D, int64_t pos_begin,
               int64_t pos_end, float scale, AttentionPass pass, float* out, const float* sinks = nullptr) {
  for (int64_t h = 0; h < n_heads; ++h)
    kOneHead(q + h * D, kv, head_offset, D, pos_begin, pos_end, scale, pass, out + h * D, sinks ? sinks + h : nullptr);
}

// Every kernel of the AVX-512 flavour this machine can run but the scalar
// one, by name.
std::vector<std::pair<std::string, AttendHeadsFn>> avx512_flavour_kernels() {
  std::vector<std::pair<std::string, AttendHeadsFn>> fns;
  if (best_simd_level() >= SimdLevel::kAvx2) {
    fns.emplace_back("fma", each_head<detail::attend_one_head_fma>);
    fns.emplace_back("avx2", detail::attend_heads_avx2);
  }
  if (best_simd_level() >= SimdLevel::kAvx512) fns.emplace_back("avx512", detail::attend_heads_avx512);
  fns.emplace_back("dispatch", [](const float* q, int64_t n_heads, const PagedKV& kv, int64_t head_offset, int64_t D,
                                  int64_t pos_begin, int64_t pos_end, float scale, AttentionPass pass, float* out,
                                  const float* sinks) {
    attend_heads(q, n_heads, kv, head_offset, D, pos_begin, pos_end, scale, pass, out, GgmlFlavour::kAvx512, sinks);
  });
  return fns;
}

// Query heads that share a key/value head, computed together (attend_heads,
// and the AVX2 and AVX-512 group kernels directly), give each head's
// one-at-a-time bits: head sizes with and without a vector kernel, contexts
// within one 16-position chunk and across several (64-position) lane groups,
// ranges from 0, from inside a chunk (a sliding window) and of one position.
TEST(KernelsAttention, GroupedHeadsGiveEachHeadsBits) {
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int64_t D : {64, 128, 192, 256, 80, 96}) {
    for (int64_t n_pos : {1, 7, 9, 17, 33, 64, 65, 130, 300, 500}) {
      const Cache c = make_cache(rng, n_pos, D);
      for (int64_t n_heads : {1, 2, 3, 4, 5}) {
        std::vector<float> q(static_cast<size_t>(n_heads * D));
        for (float& x : q) x = 2.0f * dist(rng);
        const float scale = 1.0f / std::sqrt(static_cast<float>(D));
        for (int64_t begin : {int64_t{0}, n_pos / 3, std::max<int64_t>(0, n_pos - 41), n_pos - 1}) {
          for (AttentionPass pass : {AttentionPass::kDecode, AttentionPass::kPrefill}) {
            std::vector<float> want(q.size());
            each_head<detail::attend_one_head_scalar>(q.data(), n_heads, c.view(), 2 * D, D, begin, n_pos, scale,
                                                      pass, want.data());
            for (const auto& [name, fn] : avx512_flavour_kernels()) {
              std::vector<float> got(q.size());
              fn(q.data(), n_heads, c.view(), 2 * D, D, begin, n_pos, scale, pass, got.data(), nullptr);
              for (size_t i = 0; i < q.size(); ++i) {
                ASSERT_EQ(bits_of(got[i]), bits_of(want[i]))
                    << name << (pass == AttentionPass::kDecode ? " decode" : " prefill") << " D " << D << " n_pos "
                    << n_pos << " heads " << n_heads << " begin " << begin << " head " << i / D << " i " << i % D;
              }
            }
          }
        }
      }
    }
  }
}

// Sharp scores (a large scale): weights far below 1 take e^x's subnormal and
// saturated branches, and one or a few positions carry the sum.
TEST(KernelsAttention, SharpScoresGiveTheSameBitsAtEveryLevel) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int64_t D : {64, 128, 256}) {
    const Cache c = make_cache(rng, 200, D);
    std::vector<float> q(static_cast<size_t>(3 * D));
    for (float& x : q) x = 4.0f * dist(rng);
    for (float scale : {1.0f, 8.0f}) {
      for (AttentionPass pass : {AttentionPass::kDecode, AttentionPass::kPrefill}) {
        std::vector<float> want(q.size());
        each_head<detail::attend_one_head_scalar>(q.data(), 3, c.view(), 0, D, 5, 200, scale, pass, want.data());
        for (const auto& [name, fn] : avx512_flavour_kernels()) {
          std::vector<float> got(q.size());
          fn(q.data(), 3, c.view(), 0, D, 5, 200, scale, pass, got.data(), nullptr);
          for (size_t i = 0; i < q.size(); ++i)
            ASSERT_EQ(bits_of(got[i]), bits_of(want[i])) << name << " D " << D << " scale " << scale << " i " << i;
        }
      }
    }
  }
}

// The AVX2 kernel's softmax (before the f16 rounding, which would hide most
// last-bit differences of e^x) against the portable kernel's arithmetic:
// expf_poly per weight, the sum in double over 16-weight chunks, each summed
// as _mm512_reduce_add_ps; inputs down to -200 below the maximum so that e^x
// goes subnormal and saturates to 0, and a long row of subnormal weights
// (where rounding twice would show).
TEST(KernelsAttention, Avx2SoftmaxMatchesPortable) {
  if (best_simd_level() < SimdLevel::kAvx2) GTEST_SKIP() << "no AVX2";
  std::mt19937 rng(9);
  int tiny = 0;
  for (int64_t n : {16, 48, 256, 4096}) {
    std::uniform_real_distribution<float> dist(n == 4096 ? -106.0f : -200.0f, n == 4096 ? -86.0f : 0.0f);
    std::vector<float> w(static_cast<size_t>(n));
    for (float& x : w) x = dist(rng);
    w[3] = 0.5f;  // the maximum
    w[n - 1] = -std::numeric_limits<float>::infinity();  // masked
    std::vector<float> want = w;
    const float max = *std::max_element(w.begin(), w.end());
    double sum = 0;
    for (int64_t i = 0; i < n; i += 16) {
      float a[16], t3[8], t6[4];
      for (int l = 0; l < 16; ++l) a[l] = want[i + l] = expf_poly(want[i + l] - max);
      for (int l = 0; l < 8; ++l) t3[l] = a[l + 8] + a[l];
      for (int l = 0; l < 4; ++l) t6[l] = t3[l + 4] + t3[l];
      sum += static_cast<double>((t6[0] + t6[2]) + (t6[1] + t6[3]));
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (float& x : want) x *= inv, tiny += x > 0.0f && x < 1e-38f;
    detail::softmax_avx2(w.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(bits_of(w[i]), bits_of(want[i])) << "n " << n << " i " << i;
  }
  EXPECT_GT(tiny, 0);
}


// ---- the AVX2 flavour against GGML's AVX2 build ---------------------------

// The reference program's inputs (tools/reference/ggml_attention_reference.c).
uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
float gen_kv(uint64_t& s) { return static_cast<float>(static_cast<int32_t>(splitmix64(s) >> 53) - 1024) * 0x1p-10f; }
float gen_q(uint64_t& s) {
  return static_cast<float>(static_cast<int32_t>(splitmix64(s) >> 40) - (1 << 23)) * 0x1p-21f;
}

struct AttnCase {
  int64_t D = 0, n_head = 0, n_head_kv = 0, n_tokens = 0, n_past = 0, window = 0;
  float scale = 0;
  uint64_t seed = 0;
  std::vector<uint32_t> out;  // [token][head][D]
};

// A row of ggml_soft_max_ext: scores, mask (0 or -inf), weights (f32 bits).
struct SoftmaxRow {
  std::vector<uint32_t> in, mask, out;
};

struct AttentionReference {
  std::vector<AttnCase> cases;
  std::vector<SoftmaxRow> softmax;
};

AttentionReference load_attention_reference() {
  const std::string path = inferd::test::test_data_root() + "/kernels/ggml_avx2_attention.txt";
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "missing " << path;
  AttentionReference ref;
  std::string line, tag, word, last;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ss(line);
    ss >> tag;
    auto hex = [&](std::vector<uint32_t>& v) {
      while (ss >> word) v.push_back(static_cast<uint32_t>(std::stoul(word, nullptr, 16)));
    };
    if (tag == "attn") {
      AttnCase c;
      std::string scale_bits;
      ss >> c.D >> c.n_head >> c.n_head_kv >> c.n_tokens >> c.n_past >> c.window >> scale_bits >> c.seed;
      const uint32_t b = static_cast<uint32_t>(std::stoul(scale_bits, nullptr, 16));
      std::memcpy(&c.scale, &b, 4);
      ref.cases.push_back(c);
      last = tag;
    } else if (tag == "softmax") {
      ref.softmax.emplace_back();
      last = tag;
    } else if (tag == "in") {
      hex(ref.softmax.back().in);
    } else if (tag == "mask") {
      hex(ref.softmax.back().mask);
    } else if (tag == "out") {
      hex(last == "attn" ? ref.cases.back().out : ref.softmax.back().out);
    }
  }
  return ref;
}

// The case's keys and values in a paged cache of 16-position blocks in
// shuffled order, the same numbers GGML read from its contiguous cache.
Cache reference_cache(const AttnCase& c) {
  Cache cache;
  cache.D = c.D;
  cache.heads = c.n_head_kv;
  const int64_t n_pos = c.n_past + c.n_tokens;
  const int64_t n_blocks = (n_pos + cache.block_size - 1) / cache.block_size;
  for (int64_t b = 0; b < n_blocks; ++b) cache.block_table.push_back(static_cast<int32_t>(b));
  std::mt19937 rng(static_cast<uint32_t>(c.seed));
  std::shuffle(cache.block_table.begin(), cache.block_table.end(), rng);
  const int64_t stride = c.D * c.n_head_kv;
  cache.k.assign(static_cast<size_t>(n_blocks * cache.block_size * stride), 0);
  cache.v = cache.k;
  uint64_t sk = c.seed * 4 + 1, sv = c.seed * 4 + 2;
  for (int64_t p = 0; p < n_pos; ++p) {
    const int64_t slot = int64_t{cache.block_table[p / cache.block_size]} * cache.block_size + p % cache.block_size;
    for (int64_t i = 0; i < stride; ++i) {
      cache.k[slot * stride + i] = f32_to_f16(gen_kv(sk));
      cache.v[slot * stride + i] = f32_to_f16(gen_kv(sv));
    }
  }
  return cache;
}

// Every kernel of the AVX2 flavour this machine can run, by name.
std::vector<std::pair<std::string, AttendHeadsFn>> avx2_flavour_kernels() {
  std::vector<std::pair<std::string, AttendHeadsFn>> fns;
  fns.emplace_back("scalar", each_head<detail::attend_one_head_ggml_avx2_scalar>);
  if (best_simd_level() >= SimdLevel::kAvx2) {
    fns.emplace_back("fma", each_head<detail::attend_one_head_ggml_avx2_fma>);
    fns.emplace_back("avx2", detail::attend_heads_ggml_avx2);
  }
  fns.emplace_back("dispatch", [](const float* q, int64_t n_heads, const PagedKV& kv, int64_t head_offset, int64_t D,
                                  int64_t pos_begin, int64_t pos_end, float scale, AttentionPass pass, float* out,
                                  const float* sinks) {
    attend_heads(q, n_heads, kv, head_offset, D, pos_begin, pos_end, scale, pass, out, GgmlFlavour::kAvx2, sinks);
  });
  return fns;
}

TEST(KernelsAttention, Avx2FlavourMatchesGgmlAvx2Build) {
  const std::vector<AttnCase> cases = load_attention_reference().cases;
  ASSERT_GE(cases.size(), 40u);
  for (const AttnCase& c : cases) {
    ASSERT_EQ(static_cast<int64_t>(c.out.size()), c.n_tokens * c.n_head * c.D);
    const Cache cache = reference_cache(c);
    std::vector<float> q(static_cast<size_t>(c.n_tokens * c.n_head * c.D));
    uint64_t sq = c.seed * 4 + 3;
    for (float& x : q) x = gen_q(sq);
    // One token: llama.cpp's one-token step; several: its multi-token step.
    const AttentionPass pass = c.n_tokens == 1 ? AttentionPass::kDecode : AttentionPass::kPrefill;
    const int64_t group = c.n_head / c.n_head_kv;
    for (const auto& [name, fn] : avx2_flavour_kernels()) {
      int mismatches = 0;
      for (int64_t t = 0; t < c.n_tokens; ++t) {
        const int64_t pos = c.n_past + t;
        const int64_t begin = c.window > 0 ? std::max<int64_t>(0, pos - c.window + 1) : 0;
        for (int64_t hk = 0; hk < c.n_head_kv; ++hk) {
          const int64_t first = (t * c.n_head + hk * group) * c.D;
          std::vector<float> out(static_cast<size_t>(group * c.D));
          fn(q.data() + first, group, cache.view(), hk * c.D, c.D, begin, pos + 1, c.scale, pass, out.data(), nullptr);
          for (int64_t i = 0; i < group * c.D; ++i) {
            if (bits_of(out[i]) != c.out[first + i] && ++mismatches <= 3) {
              float want;
              std::memcpy(&want, &c.out[first + i], 4);
              ADD_FAILURE() << name << ": D " << c.D << " heads " << c.n_head << "/" << c.n_head_kv << " tokens "
                            << c.n_tokens << " past " << c.n_past << " window " << c.window << ": token " << t
                            << " head " << hk * group + i / c.D << " d " << i % c.D << " got " << out[i] << " want "
                            << want;
            }
          }
        }
      }
      EXPECT_EQ(mismatches, 0) << name << ": D " << c.D << " tokens " << c.n_tokens << " past " << c.n_past
                               << " window " << c.window;
    }
  }
}

// The softmax alone, before the f16 rounding of the weights (which would hide
// most last-bit differences of e^x): GGML's AVX2 build's weights to the bit.
TEST(KernelsAttention, Avx2FlavourSoftmaxMatchesGgmlAvx2Build) {
  const std::vector<SoftmaxRow> rows = load_attention_reference().softmax;
  ASSERT_GE(rows.size(), 6u);
  std::vector<std::pair<std::string, void (*)(float*, int64_t)>> fns = {{"scalar", detail::softmax_ggml_avx2_scalar}};
  if (best_simd_level() >= SimdLevel::kAvx2) fns.emplace_back("avx2", detail::softmax_ggml_avx2);
  int tiny = 0;  // weights that went through e^x's subnormal branch
  for (const SoftmaxRow& r : rows) {
    const size_t n = r.in.size();
    ASSERT_EQ(r.mask.size(), n);
    ASSERT_EQ(r.out.size(), n);
    std::vector<float> w(n);
    for (size_t i = 0; i < n; ++i) {
      float x;
      std::memcpy(&x, &r.in[i], 4);
      w[i] = r.mask[i] == 0 ? x : -std::numeric_limits<float>::infinity();
    }
    for (size_t i = 0; i < n; ++i) {
      float o;
      std::memcpy(&o, &r.out[i], 4);
      tiny += o > 0.0f && o < 1e-38f;
    }
    for (const auto& [name, fn] : fns) {
      std::vector<float> got = w;
      fn(got.data(), static_cast<int64_t>(n));
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(bits_of(got[i]), r.out[i]) << name << " n " << n << " i " << i;
    }
  }
  EXPECT_GT(tiny, 0);
}

// The AVX2 flavour on the shapes of the tests above: every kernel gives the
// portable kernel's bits (also for head sizes without a vector kernel, ranges
// that do not start at 0, and heads computed together), close to the plain
// softmax.
TEST(KernelsAttention, Avx2FlavourSameBitsAtEveryLevel) {
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int64_t D : {64, 128, 256, 80, 96}) {
    for (int64_t n_pos : {1, 7, 8, 9, 33, 64, 65, 300, 700}) {
      const Cache c = make_cache(rng, n_pos, D);
      for (int64_t n_heads : {1, 2, 3, 5}) {
        std::vector<float> q(static_cast<size_t>(n_heads * D));
        for (float& x : q) x = 2.0f * dist(rng);
        const float scale = 1.0f / std::sqrt(static_cast<float>(D));
        for (int64_t begin : {int64_t{0}, n_pos / 3, n_pos - 1}) {
          for (AttentionPass pass : {AttentionPass::kDecode, AttentionPass::kPrefill}) {
            std::vector<float> want(q.size());
            each_head<detail::attend_one_head_ggml_avx2_scalar>(q.data(), n_heads, c.view(), 2 * D, D, begin, n_pos,
                                                                scale, pass, want.data());
            if (n_heads == 1) {
              const std::vector<double> plain = naive(c, q.data(), 2, begin, n_pos, scale);
              for (int64_t i = 0; i < D; ++i) EXPECT_NEAR(want[i], plain[i], 2e-5) << D << " " << n_pos << " " << i;
            }
            for (const auto& [name, fn] : avx2_flavour_kernels()) {
              std::vector<float> got(q.size());
              fn(q.data(), n_heads, c.view(), 2 * D, D, begin, n_pos, scale, pass, got.data(), nullptr);
              for (size_t i = 0; i < q.size(); ++i) {
                ASSERT_EQ(bits_of(got[i]), bits_of(want[i]))
                    << name << (pass == AttentionPass::kDecode ? " decode" : " prefill") << " D " << D << " n_pos "
                    << n_pos << " heads " << n_heads << " begin " << begin << " i " << i;
              }
            }
          }
        }
      }
    }
  }
}

// The flavours are different arithmetic: on these inputs some outputs differ
// in the last bits (so neither test above can pass by running the other one).
TEST(KernelsAttention, FlavoursRoundDifferently) {
  std::mt19937 rng(13);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  const Cache c = make_cache(rng, 300, 64);
  std::vector<float> q(64);
  for (float& x : q) x = dist(rng);
  for (AttentionPass pass : {AttentionPass::kDecode, AttentionPass::kPrefill}) {
    std::vector<float> a(64), b(64);
    attend_one_head(q.data(), c.view(), 64, 64, 0, 300, 0.125f, pass, a.data(), GgmlFlavour::kAvx512);
    attend_one_head(q.data(), c.view(), 64, 64, 0, 300, 0.125f, pass, b.data(), GgmlFlavour::kAvx2);
    int differ = 0;
    for (int i = 0; i < 64; ++i) differ += bits_of(a[i]) != bits_of(b[i]);
    EXPECT_GT(differ, 0);
  }
}

// Attention sinks (gpt-oss): a per-head logit in the softmax's maximum and
// sum with no value. Every kernel of both flavours gives the portable
// kernel's bits with sinks below, among and above the scores (a sink that
// dominates shrinks the output); the portable kernel stays close to a plain
// softmax in double with the sink; a sink of -inf changes nothing.
TEST(KernelsAttention, SinksGiveTheSameBitsAtEveryLevel) {
  std::mt19937 rng(17);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int64_t D : {64, 128, 80}) {
    for (int64_t n_pos : {1, 9, 65, 300}) {
      const Cache c = make_cache(rng, n_pos, D);
      const int64_t n_heads = 3;
      std::vector<float> q(static_cast<size_t>(n_heads * D));
      for (float& x : q) x = 2.0f * dist(rng);
      const float scale = 1.0f / std::sqrt(static_cast<float>(D));
      for (float base : {-30.0f, 0.0f, 2.0f, 40.0f}) {
        const std::vector<float> sinks = {base, base + 0.5f, base - 1.5f};
        for (int64_t begin : {int64_t{0}, n_pos / 3}) {
          for (AttentionPass pass : {AttentionPass::kDecode, AttentionPass::kPrefill}) {
            for (GgmlFlavour flavour : {GgmlFlavour::kAvx512, GgmlFlavour::kAvx2}) {
              std::vector<float> want(q.size());
              if (flavour == GgmlFlavour::kAvx512) {
                each_head<detail::attend_one_head_scalar>(q.data(), n_heads, c.view(), 2 * D, D, begin, n_pos, scale,
                                                          pass, want.data(), sinks.data());
              } else {
                each_head<detail::attend_one_head_ggml_avx2_scalar>(q.data(), n_heads, c.view(), 2 * D, D, begin,
                                                                    n_pos, scale, pass, want.data(), sinks.data());
              }
              for (int64_t h = 0; h < n_heads; ++h) {
                // The plain softmax with the sink: scores s_p, weights e^(s_p - m) / (sum + e^(sink - m)).
                const std::vector<double> plain = naive(c, q.data() + h * D, 2, begin, n_pos, scale);
                std::vector<float> qh(q.begin() + h * D, q.begin() + (h + 1) * D);
                double mx = -INFINITY, sum = 0;
                std::vector<double> s;
                for (int64_t p = begin; p < n_pos; ++p) {
                  const int64_t slot = int64_t{c.block_table[p / c.block_size]} * c.block_size + p % c.block_size;
                  double d = 0;
                  for (int64_t i = 0; i < D; ++i)
                    d += round_f16(qh[i]) * f16_to_f32(c.k[slot * D * c.heads + 2 * D + i]);
                  s.push_back(d * scale);
                  mx = std::max(mx, d * scale);
                }
                for (double x : s) sum += std::exp(x - mx);
                // Without the sink the weights sum to 1; with it each is this much smaller.
                const double shrink = sum / (sum + std::exp(sinks[h] - mx));
                for (int64_t i = 0; i < D; ++i)
                  EXPECT_NEAR(want[h * D + i], plain[i] * shrink, 2e-3 + 2e-3 * std::fabs(plain[i]))
                      << "D " << D << " n_pos " << n_pos << " sink " << sinks[h] << " i " << i;
              }
              const auto fns = flavour == GgmlFlavour::kAvx512 ? avx512_flavour_kernels() : avx2_flavour_kernels();
              for (const auto& [name, fn] : fns) {
                std::vector<float> got(q.size());
                fn(q.data(), n_heads, c.view(), 2 * D, D, begin, n_pos, scale, pass, got.data(), sinks.data());
                for (size_t i = 0; i < q.size(); ++i)
                  ASSERT_EQ(bits_of(got[i]), bits_of(want[i]))
                      << name << " flavour " << static_cast<int>(flavour) << " D " << D << " n_pos " << n_pos
                      << " sink " << base << " begin " << begin << " i " << i;
              }
              // A sink of -inf is no sink.
              const std::vector<float> none(static_cast<size_t>(n_heads), -INFINITY);
              std::vector<float> with_none(q.size()), without(q.size());
              attend_heads(q.data(), n_heads, c.view(), 2 * D, D, begin, n_pos, scale, pass, with_none.data(), flavour,
                           none.data());
              attend_heads(q.data(), n_heads, c.view(), 2 * D, D, begin, n_pos, scale, pass, without.data(), flavour);
              for (size_t i = 0; i < q.size(); ++i) ASSERT_EQ(bits_of(with_none[i]), bits_of(without[i]));
            }
          }
        }
      }
    }
  }
}

// Latent attention (DeepSeek's MLA, absorbed): keys of Dk and values that are
// the keys' first Dv elements, in one store. Each output element is a
// weighted sum of its own dimension only, so it must have the bits of plain
// attention with D = Dk over a value store that holds the keys themselves
// (its first Dv elements), for both passes and both GGML builds, and agree
// with the plain softmax in double.
TEST(KernelsAttention, LatentHeadsReadTheirValuesFromTheKeys) {
  std::mt19937 rng(29);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (const auto [Dk, Dv] : {std::pair<int64_t, int64_t>{80, 64}, {112, 96}, {576, 512}}) {
    for (int64_t n_pos : {1, 17, 130}) {
      Cache c = make_cache(rng, n_pos, Dk);
      c.heads = 1;
      c.k.resize(c.block_table.size() * c.block_size * Dk);
      c.v = c.k;  // plain attention's view: values = keys
      const PagedKV latent{c.k.data(), c.k.data(), Dk, c.block_size, c.block_table.data()};
      const int64_t n_heads = 3;
      std::vector<float> q(static_cast<size_t>(n_heads * Dk));
      for (float& x : q) x = 0.5f * dist(rng);
      const float scale = 1.0f / std::sqrt(static_cast<float>(Dk - Dv / 2));
      for (AttentionPass pass : {AttentionPass::kDecode, AttentionPass::kPrefill}) {
        for (GgmlFlavour flavour : {GgmlFlavour::kAvx512, GgmlFlavour::kAvx2}) {
          std::vector<float> got(static_cast<size_t>(n_heads * Dv));
          attend_latent_heads(q.data(), n_heads, latent, Dk, Dv, 0, n_pos, scale, pass, got.data(), flavour);
          // The kernel compiled without FMA instructions gives the same bits.
          std::vector<float> portable(got.size());
          const auto scalar = flavour == GgmlFlavour::kAvx512 ? detail::attend_latent_heads_scalar<GgmlFlavour::kAvx512>
                                                              : detail::attend_latent_heads_scalar<GgmlFlavour::kAvx2>;
          scalar(q.data(), n_heads, latent, Dk, Dv, 0, n_pos, scale, pass, portable.data());
          ASSERT_EQ(std::memcmp(got.data(), portable.data(), got.size() * sizeof(float)), 0) << "Dk " << Dk;
          if (best_simd_level() >= SimdLevel::kAvx2) {  // and so do the FMA-compiled and AVX-512 ones
            std::vector<float> other(got.size());
            const auto fma = flavour == GgmlFlavour::kAvx512 ? detail::attend_latent_heads_fma<GgmlFlavour::kAvx512>
                                                             : detail::attend_latent_heads_fma<GgmlFlavour::kAvx2>;
            fma(q.data(), n_heads, latent, Dk, Dv, 0, n_pos, scale, pass, other.data());
            ASSERT_EQ(std::memcmp(got.data(), other.data(), got.size() * sizeof(float)), 0) << "fma, Dk " << Dk;
            if (best_simd_level() >= SimdLevel::kAvx512 && flavour == GgmlFlavour::kAvx512) {
              detail::attend_latent_heads_avx512(q.data(), n_heads, latent, Dk, Dv, 0, n_pos, scale, pass,
                                                 other.data());
              ASSERT_EQ(std::memcmp(got.data(), other.data(), got.size() * sizeof(float)), 0) << "avx512, Dk " << Dk;
            }
          }
          for (int64_t h = 0; h < n_heads; ++h) {
            std::vector<float> want(static_cast<size_t>(Dk));
            if (flavour == GgmlFlavour::kAvx512) {
              detail::attend_one_head_scalar(q.data() + h * Dk, c.view(), 0, Dk, 0, n_pos, scale, pass, want.data(),
                                             nullptr);
            } else {
              detail::attend_one_head_ggml_avx2_scalar(q.data() + h * Dk, c.view(), 0, Dk, 0, n_pos, scale, pass,
                                                       want.data(), nullptr);
            }
            const std::vector<double> plain = naive(c, q.data() + h * Dk, 0, 0, n_pos, scale);
            for (int64_t i = 0; i < Dv; ++i) {
              ASSERT_EQ(bits_of(got[h * Dv + i]), bits_of(want[i]))
                  << "Dk " << Dk << " n_pos " << n_pos << " head " << h << " i " << i;
              EXPECT_NEAR(got[h * Dv + i], plain[i], 2e-3 + 2e-3 * std::fabs(plain[i]));
            }
          }
        }
      }
    }
  }
}

// Long-context decode as the KV cache lays it out: blocks of 16 slots that
// hold several layers (PagedKV::block_stride), shuffled, read at layer 1;
// contexts of many value tiles (kValueTile, 128 positions) with a partial
// last one, ranges that start and end inside a block, a chunk and a tile;
// groups of more query heads than the AVX-512 kernel holds in registers.
// Every kernel of each flavour gives the portable kernel's bits.
TEST(KernelsAttention, LongContextDecodeGivesTheSameBits) {
  std::mt19937 rng(17);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  constexpr int64_t kBlock = 16, kLayers = 3, kKVHeads = 2;
  for (int64_t D : {64, 128, 256}) {
    const int64_t n_pos = 1347;
    const RandomPagedCache cache(D, n_pos, kBlock, kLayers, kKVHeads, rng);
    const PagedKV& kv = cache.kv;
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    for (int64_t n_heads : {1, 3, 4, 5, 7, 8}) {
      std::vector<float> q(static_cast<size_t>(n_heads * D));
      for (float& x : q) x = 2.0f * dist(rng);
      for (auto [begin, end] : {std::pair<int64_t, int64_t>{0, n_pos}, {37, 1301}, {301, 1000}, {0, 449}}) {
        for (GgmlFlavour flavour : {GgmlFlavour::kAvx512, GgmlFlavour::kAvx2}) {
          std::vector<float> want(q.size());
          if (flavour == GgmlFlavour::kAvx512) {
            each_head<detail::attend_one_head_scalar>(q.data(), n_heads, kv, D, D, begin, end, scale,
                                                      AttentionPass::kDecode, want.data());
          } else {
            each_head<detail::attend_one_head_ggml_avx2_scalar>(q.data(), n_heads, kv, D, D, begin, end, scale,
                                                                AttentionPass::kDecode, want.data());
          }
          const auto kernels = flavour == GgmlFlavour::kAvx512 ? avx512_flavour_kernels() : avx2_flavour_kernels();
          for (const auto& [name, fn] : kernels) {
            std::vector<float> got(q.size());
            fn(q.data(), n_heads, kv, D, D, begin, end, scale, AttentionPass::kDecode, got.data(), nullptr);
            for (size_t i = 0; i < q.size(); ++i) {
              ASSERT_EQ(bits_of(got[i]), bits_of(want[i]))
                  << ggml_flavour_name(flavour) << " " << name << " D " << D << " heads " << n_heads << " ["
                  << begin << ", " << end << ") head " << i / D << " i " << i % D;
            }
          }
        }
      }
    }
  }
}

// Prefill tiles (attend_heads_tile): each token of a tile gets the bits of
// the per-token kernel (attend_heads, kPrefill) run for it alone, and of the
// portable kernel, for tiles of 1 to 17 tokens (the AVX-512 kernel takes 16 at
// a time), causal ranges whose ends are one apart (the ragged end) starting
// at 0, inside a chunk and across a 256-position value block, sliding
// windows (the beginnings move too), sinks, groups of 1 to 9 query heads (more
// than the kernel's 8 at a time; groups of more than 4 over ranges of more
// than 4,096 positions, where the kernel tiles them), head sizes with and
// without a tiled kernel,
// in the KV cache's layout (shuffled 16-slot blocks of several layers); and
// tiles of unrelated ranges in any order.
TEST(KernelsAttention, PrefillTilesGiveEachTokensBits) {
  std::mt19937 rng(31);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  constexpr int64_t kBlock = 16, kLayers = 2, kKVHeads = 2;
  // Long ranges too: the AVX-512 kernel tiles groups of more than four heads
  // only from 4,096 positions on.
  for (const auto& [D, n_pos] : {std::pair<int64_t, int64_t>{64, 560}, {128, 560}, {256, 560}, {192, 560}, {80, 560},
                               {64, 4400}, {128, 4400}}) {
    const bool long_range = n_pos > 4096;
    const RandomPagedCache cache(D, n_pos, kBlock, kLayers, kKVHeads, rng);
    const PagedKV& kv = cache.kv;
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    for (int64_t n_heads : long_range ? std::vector<int64_t>{5, 7, 9} : std::vector<int64_t>{1, 3, 7, 9}) {
      constexpr int64_t kMaxTokens = 17;
      // Token rows wider than their heads (q_stride, out_stride), as a batch's.
      const int64_t stride = n_heads * D + 16;
      std::vector<float> q(static_cast<size_t>(kMaxTokens * stride));
      for (float& x : q) x = 2.0f * dist(rng);
      std::vector<float> sinks(static_cast<size_t>(n_heads));
      for (float& x : sinks) x = 3.0f * dist(rng);
      auto check = [&](const std::vector<int64_t>& begin, const std::vector<int64_t>& end, const float* sink,
                       bool scalar_too, const std::string& what) {
        const auto T = static_cast<int64_t>(begin.size());
        for (GgmlFlavour flavour : {GgmlFlavour::kAvx512, GgmlFlavour::kAvx2}) {
          std::vector<float> want(static_cast<size_t>(T * stride), 0.0f);
          for (int64_t i = 0; i < T; ++i)
            attend_heads(q.data() + i * stride, n_heads, kv, D, D, begin[i], end[i], scale, AttentionPass::kPrefill,
                         want.data() + i * stride, flavour, sink);
          if (scalar_too && flavour == GgmlFlavour::kAvx512) {
            std::vector<float> portable(want.size(), 0.0f);
            for (int64_t i = 0; i < T; ++i)
              each_head<detail::attend_one_head_scalar>(q.data() + i * stride, n_heads, kv, D, D, begin[i], end[i],
                                                        scale, AttentionPass::kPrefill, portable.data() + i * stride,
                                                        sink);
            for (size_t x = 0; x < want.size(); ++x)
              ASSERT_EQ(bits_of(want[x]), bits_of(portable[x])) << "per-token vs portable " << what;
          }
          std::vector<std::pair<std::string, AttendTileFn>> fns = {
              {"dispatch", [](const AttentionTile& t, int64_t nh, const PagedKV& c, int64_t ho, int64_t d, float sc,
                              const float* sk) { attend_heads_tile(t, nh, c, ho, d, sc, GgmlFlavour::kAvx512, sk); }}};
          if (flavour == GgmlFlavour::kAvx2) {
            fns[0].second = [](const AttentionTile& t, int64_t nh, const PagedKV& c, int64_t ho, int64_t d, float sc,
                               const float* sk) { attend_heads_tile(t, nh, c, ho, d, sc, GgmlFlavour::kAvx2, sk); };
            if (best_simd_level() >= SimdLevel::kAvx2) fns.emplace_back("avx2", detail::attend_heads_tile_ggml_avx2);
          } else {
            if (best_simd_level() >= SimdLevel::kAvx2) fns.emplace_back("avx2", detail::attend_heads_tile_avx2);
            if (best_simd_level() >= SimdLevel::kAvx512) fns.emplace_back("avx512", detail::attend_heads_tile_avx512);
          }
          for (const auto& [name, fn] : fns) {
            std::vector<float> got(want.size(), 0.0f);
            const AttentionTile tile{q.data(), stride, got.data(), stride, T, begin.data(), end.data()};
            fn(tile, n_heads, kv, D, D, scale, sink);
            for (int64_t i = 0; i < T; ++i)
              for (int64_t x = 0; x < n_heads * D; ++x)
                ASSERT_EQ(bits_of(got[i * stride + x]), bits_of(want[i * stride + x]))
                    << ggml_flavour_name(flavour) << " " << name << " " << what << " D " << D << " heads " << n_heads
                    << " token " << i << " of " << T << " [" << begin[i] << ", " << end[i] << ") head " << x / D
                    << " i " << x % D;
          }
        }
      };
      // Causal tiles: token i at position first + i reads [begin, first + i + 1).
      for (int64_t n_tokens : {1, 2, 5, 8, 16, 17}) {
        for (int64_t first : long_range ? std::vector<int64_t>{4300} : std::vector<int64_t>{0, 9, 250, 509}) {
          for (int64_t window : long_range ? std::vector<int64_t>{0, 4100} : std::vector<int64_t>{0, 37, 300}) {
            for (bool with_sinks : {false, true}) {
              if (with_sinks && window == 37) continue;
              const auto [begin, end] = causal_ranges(n_tokens, first, window);
              check(begin, end, with_sinks ? sinks.data() : nullptr,
                    !long_range && n_tokens == 5 && first == 509 && window != 37,
                    "tokens " + std::to_string(n_tokens) + " first " + std::to_string(first) + " window " +
                        std::to_string(window) + (with_sinks ? " sinks" : ""));
            }
          }
        }
      }
      // Unrelated ranges in any order, some of one position, some disjoint.
      std::uniform_int_distribution<int64_t> pos(0, n_pos - 1);
      for (int rep = 0; rep < 4; ++rep) {
        std::vector<int64_t> begin, end;
        for (int64_t i = 0; i < 7 + rep; ++i) {
          int64_t a = pos(rng), b = pos(rng);
          if (a > b) std::swap(a, b);
          if (i % 3 == 0) a = b;
          begin.push_back(a);
          end.push_back(b + 1);
        }
        check(begin, end, rep % 2 ? sinks.data() : nullptr, rep == 0 && !long_range,
              "random ranges " + std::to_string(rep));
      }
    }
  }
}

// The AVX2 tiled kernels (detail::attend_heads_tile_ggml_avx2, GGML's AVX2
// build, and detail::attend_heads_tile_avx2, its AVX-512 build on AVX2; called
// directly: tested whatever the dispatch picks) against their per-token
// kernels (kPrefill) run for each token alone, bit for bit: head sizes they
// tile and one they do not (96), groups of 1 to 8 query heads a key/value
// head, tiles of 1 to 8 tokens (and 17: the kernels take 16 a call), causal
// ranges whose ends cross 8- and 16-position chunks, 16-slot blocks and the
// kernels' value blocks (32 to 128 positions), sliding windows (the
// beginnings move across those too), sinks, shuffled blocks of several
// layers, and unrelated ranges in any order.
TEST(KernelsAttention, Avx2PrefillTilesGiveEachTokensBits) {
  if (best_simd_level() < SimdLevel::kAvx2) GTEST_SKIP() << "the CPU has no AVX2";
  std::mt19937 rng(43);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  constexpr int64_t kBlock = 16, kLayers = 2, kKVHeads = 2, kMaxTokens = 17, kPos = 700;
  struct Kernels {
    const char* name;
    AttendHeadsFn per_token;
    AttendTileFn tiled;
    std::vector<int64_t> head_sizes;
  };
  for (const Kernels& k : {Kernels{"ggml_avx2", detail::attend_heads_ggml_avx2, detail::attend_heads_tile_ggml_avx2,
                                   {64, 128, 256, 96}},
                           Kernels{"avx512 on avx2", detail::attend_heads_avx2, detail::attend_heads_tile_avx2,
                                   {64, 128, 192, 256, 96}}}) {
    for (int64_t D : k.head_sizes) {
      const RandomPagedCache cache(D, kPos, kBlock, kLayers, kKVHeads, rng);
      const PagedKV& kv = cache.kv;
      const float scale = 1.0f / std::sqrt(static_cast<float>(D));
      for (int64_t n_heads = 1; n_heads <= 8; ++n_heads) {
        const int64_t stride = n_heads * D + 8;  // rows wider than their heads, as a batch's
        std::vector<float> q(static_cast<size_t>(kMaxTokens * stride));
        for (float& x : q) x = 2.0f * dist(rng);
        std::vector<float> sinks(static_cast<size_t>(n_heads));
        for (float& x : sinks) x = 3.0f * dist(rng);
        auto check = [&](const std::vector<int64_t>& begin, const std::vector<int64_t>& end, const float* sink,
                         const std::string& what) {
          const auto T = static_cast<int64_t>(begin.size());
          // NaN where nothing is written, so a row the kernel skips shows.
          std::vector<float> want(static_cast<size_t>(T * stride), std::numeric_limits<float>::quiet_NaN());
          std::vector<float> got(want);
          for (int64_t i = 0; i < T; ++i)
            k.per_token(q.data() + i * stride, n_heads, kv, D, D, begin[i], end[i], scale, AttentionPass::kPrefill,
                        want.data() + i * stride, sink);
          const AttentionTile tile{q.data(), stride, got.data(), stride, T, begin.data(), end.data()};
          k.tiled(tile, n_heads, kv, D, D, scale, sink);
          for (int64_t i = 0; i < T; ++i)
            for (int64_t x = 0; x < n_heads * D; ++x)
              ASSERT_EQ(bits_of(got[i * stride + x]), bits_of(want[i * stride + x]))
                  << k.name << " " << what << " D " << D << " heads " << n_heads << " token " << i << " of " << T << " [" << begin[i]
                  << ", " << end[i] << ") head " << x / D << " i " << x % D;
        };
        int variant = 0;
        for (int64_t n_tokens : {1, 3, 8, 17}) {
          for (int64_t first : {0, 6, 13, 250, 683}) {
            for (int64_t window : {0, 5, 300}) {
              const bool with_sinks = ++variant % 2 == 0;
              const auto [begin, end] = causal_ranges(n_tokens, first, window);
              check(begin, end, with_sinks ? sinks.data() : nullptr,
                    "tokens " + std::to_string(n_tokens) + " first " + std::to_string(first) + " window " +
                        std::to_string(window) + (with_sinks ? " sinks" : ""));
            }
          }
        }
        std::uniform_int_distribution<int64_t> pos(0, kPos - 1);
        for (int rep = 0; rep < 4; ++rep) {
          std::vector<int64_t> begin, end;
          for (int64_t i = 0; i < 3 + 2 * rep; ++i) {
            int64_t a = pos(rng), b = pos(rng);
            if (a > b) std::swap(a, b);
            if (i % 3 == 0) a = b;  // one position
            begin.push_back(a);
            end.push_back(b + 1);
          }
          check(begin, end, rep % 2 ? sinks.data() : nullptr, "random ranges " + std::to_string(rep));
        }
      }
    }
  }
}

}  // namespace
}  // namespace inferd::kernels
