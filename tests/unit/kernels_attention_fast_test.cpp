// The fast tier's prefill attention (attention_fast.h): every token of a tile
// gets the bits of the scalar reference run for it alone (so a token's result
// does not depend on the tile it came in: batch invariance), at every level
// the machine runs; and the reference agrees with a softmax in double.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/cpu/attention_fast.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/quants.h"
#include "kernels_test_util.h"

namespace inferd::kernels {
namespace {

using testing::bits_of;
using testing::causal_ranges;
using testing::RandomPagedCache;

using TileFn = void (*)(const AttentionTile&, int64_t, const PagedKV&, int64_t, int64_t, float, const float*);

void tile_avx2(const AttentionTile& tile, int64_t n_heads, const PagedKV& kv, int64_t head_offset, int64_t D,
               float scale, const float* sinks) {
  detail::attend_heads_tile_fast_avx2(tile, n_heads, kv, head_offset, D, scale, sinks, nullptr);
}

void tile_avx512(const AttentionTile& tile, int64_t n_heads, const PagedKV& kv, int64_t head_offset, int64_t D,
                 float scale, const float* sinks) {
  detail::attend_heads_tile_fast_avx512(tile, n_heads, kv, head_offset, D, scale, sinks, nullptr);
}

std::vector<std::pair<std::string, TileFn>> fast_kernels() {
  std::vector<std::pair<std::string, TileFn>> fns = {{"dispatch", attend_heads_tile_fast}};
  if (best_simd_level() >= SimdLevel::kAvx2) fns.emplace_back("avx2", tile_avx2);
  if (best_simd_level() >= SimdLevel::kAvx512) fns.emplace_back("avx512", tile_avx512);
  return fns;
}

// Token i of a tile (q rows of n_heads * D) alone through the reference.
std::vector<float> alone(const std::vector<float>& q, int64_t i, int64_t n_heads, const PagedKV& kv, int64_t D,
                         int64_t head_offset, int64_t begin, int64_t end, float scale, const float* sinks) {
  std::vector<float> out(static_cast<size_t>(n_heads * D));
  const int64_t b[1] = {begin}, e[1] = {end};
  const AttentionTile one{q.data() + i * n_heads * D, n_heads * D, out.data(), n_heads * D, 1, b, e};
  detail::attend_heads_tile_fast_scalar(one, n_heads, kv, head_offset, D, scale, sinks, nullptr);
  return out;
}

// softmax(scale q.k) v in double over positions [b, e) of the head at
// head_offset, a sink (if given) joining the sum: the textbook formula.
std::vector<double> softmax_in_double(const float* q, const PagedKV& kv, int64_t head_offset, int64_t D, int64_t b,
                                      int64_t e, float scale, const float* sink) {
  std::vector<double> s;
  for (int64_t p = b; p < e; ++p) {
    const uint16_t* k = kv.k_f16() + kv.f16_slot(p) + head_offset;
    double d = 0;
    for (int64_t i = 0; i < D; ++i) d += double{q[i]} * f16_to_f32(k[i]);
    s.push_back(d * scale);
  }
  double mx = *std::max_element(s.begin(), s.end());
  if (sink) mx = std::max(mx, double{*sink});
  double sum = sink ? std::exp(*sink - mx) : 0.0;
  for (double& x : s) sum += (x = std::exp(x - mx));
  std::vector<double> out(static_cast<size_t>(D));
  for (int64_t i = 0; i < D; ++i)
    for (int64_t p = b; p < e; ++p) out[i] += s[p - b] / sum * f16_to_f32((kv.v_f16() + kv.f16_slot(p) + head_offset)[i]);
  return out;
}

// Tiles of 1 to 17 tokens (the executor gives 16), causal ranges from 0 and
// from inside a chunk, across chunk and block boundaries, sliding windows
// (the beginnings move too), sinks, sharp scores, groups of 1 to 9 query heads (more than a
// register block's 6), head sizes of whole 16-element blocks and not (40), in
// the KV cache's layout; and tiles of unrelated ranges with gaps between them.
TEST(KernelsAttentionFast, EachTokenOfATileGetsItsOwnBits) {
  std::mt19937 rng(41);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int64_t D : {64, 40, 128, 256}) {
    const int64_t n_pos = 700;
    const RandomPagedCache cache(D, n_pos, 16, 3, 2, rng);
    const PagedKV& kv = cache.kv;
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    for (int64_t n_heads : {1, 3, 6, 7, 9}) {
      std::vector<float> sinks(static_cast<size_t>(n_heads));
      for (float& s : sinks) s = 3.0f * dist(rng);
      struct Case {
        int64_t T, first, window;
        bool sink;
        float q_scale = 2.0f;  // 40: scores that spread past kFastAttentionExpFloor
      };
      for (const Case& k : {Case{1, 0, 0, false}, Case{5, 0, 0, false}, Case{16, 25, 0, false},
                            Case{17, 300, 0, true}, Case{16, 611, 100, false}, Case{9, 150, 37, true},
                            Case{13, 683, 0, false}, Case{16, 200, 0, true, 40.0f}}) {
        const auto [begin, end] = causal_ranges(k.T, k.first, k.window);
        std::vector<float> q(static_cast<size_t>(k.T * n_heads * D));
        for (float& x : q) x = k.q_scale * dist(rng);
        const float* sk = k.sink ? sinks.data() : nullptr;
        for (const auto& [name, fn] : fast_kernels()) {
          std::vector<float> got(q.size());
          const AttentionTile tile{q.data(), n_heads * D, got.data(), n_heads * D, k.T, begin.data(), end.data()};
          fn(tile, n_heads, kv, D, D, scale, sk);
          for (int64_t i = 0; i < k.T; ++i) {
            const std::vector<float> want = alone(q, i, n_heads, kv, D, D, begin[i], end[i], scale, sk);
            for (int64_t x = 0; x < n_heads * D; ++x)
              ASSERT_EQ(bits_of(got[i * n_heads * D + x]), bits_of(want[x]))
                  << name << " D " << D << " heads " << n_heads << " T " << k.T << " first " << k.first
                  << " window " << k.window << " token " << i << " head " << x / D << " i " << x % D;
          }
        }
      }
      // Unrelated ranges, out of order, with positions no token reads between them.
      const std::vector<int64_t> begin = {400, 0, 33, 650, 64}, end = {431, 17, 64, 700, 65};
      std::vector<float> q(static_cast<size_t>(begin.size() * n_heads * D));
      for (float& x : q) x = 2.0f * dist(rng);
      for (const auto& [name, fn] : fast_kernels()) {
        std::vector<float> got(q.size());
        const AttentionTile tile{q.data(), n_heads * D, got.data(), n_heads * D, static_cast<int64_t>(begin.size()),
                                 begin.data(), end.data()};
        fn(tile, n_heads, kv, D, D, scale, nullptr);
        for (size_t i = 0; i < begin.size(); ++i) {
          const std::vector<float> want = alone(q, i, n_heads, kv, D, D, begin[i], end[i], scale, nullptr);
          for (int64_t x = 0; x < n_heads * D; ++x)
            ASSERT_EQ(bits_of(got[i * n_heads * D + x]), bits_of(want[x])) << name << " unrelated token " << i;
        }
      }
    }
  }
}

// A value no finite weight can tame (an infinite f16, as an overflowed cache
// entry would hold) reaches the tokens that read its position and no other
// token of the tile: each token's bits stay its own.
TEST(KernelsAttentionFast, AValueReachesOnlyTheTokensThatReadIt) {
  std::mt19937 rng(47);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const int64_t D = 64, n_pos = 300, n_heads = 3;
  RandomPagedCache cache(D, n_pos, 16, 2, 1, rng);
  const PagedKV& kv = cache.kv;
  const int64_t bad = 250;  // read by the tile's last tokens only
  cache.v[static_cast<size_t>(kv.v_f16() - cache.v.data() + kv.f16_slot(bad) + 5)] = 0x7c00;  // +inf
  const auto [begin, end] = causal_ranges(16, 240, 0);
  std::vector<float> q(static_cast<size_t>(16 * n_heads * D));
  for (float& x : q) x = dist(rng);
  for (const auto& [name, fn] : fast_kernels()) {
    std::vector<float> got(q.size());
    const AttentionTile tile{q.data(), n_heads * D, got.data(), n_heads * D, 16, begin.data(), end.data()};
    fn(tile, n_heads, kv, 0, D, 0.125f, nullptr);
    for (int64_t i = 0; i < 16; ++i) {
      const std::vector<float> want = alone(q, i, n_heads, kv, D, 0, begin[i], end[i], 0.125f, nullptr);
      for (int64_t x = 0; x < n_heads * D; ++x) {
        ASSERT_EQ(bits_of(got[i * n_heads * D + x]), bits_of(want[x])) << name << " token " << i << " i " << x;
        if (end[i] <= bad) ASSERT_TRUE(std::isfinite(got[i * n_heads * D + x])) << name << " token " << i;
      }
    }
  }
}

// How far a prompt tile's result may be from softmax(scale q.k) v in double
// over the same f16 keys and values, from its integer codes' own error
// (attention_fast.h): each code within half a step (and a little float
// rounding) of its value, so a score within ds = scale * sum_d (|q_d| hk +
// |k_d| hq + hq hk) of its own (hq, hk: half the query's and key's steps),
// every weight within a factor e^(2 max ds) of its own share; each value
// element within half its step; and a chunk's 32 weight codes within half a
// step each, at most 32 * 4095 / (2 * 16383) < 4 times the chunk's largest
// weight times its value's step, which the sum of the weights (at least
// every chunk's largest) divides: 4 max step.
double code_error_bound(const float* q, const PagedKV& kv, int64_t head_offset, int64_t D, int64_t b, int64_t e,
                        float scale) {
  const int32_t KQ = fast_attention_key_max(D);
  auto amax_of = [D](auto get) {
    double a = 0;
    for (int64_t i = 0; i < D; ++i) a = std::max(a, std::fabs(double{get(i)}));
    return a;
  };
  const double hq = 0.5001 * amax_of([&](int64_t i) { return q[i]; }) / KQ;
  double q1 = 0;
  for (int64_t i = 0; i < D; ++i) q1 += std::fabs(q[i]);
  double ds = 0, vmax = 0, vstep = 0;
  for (int64_t p = b; p < e; ++p) {
    const uint16_t* k = kv.k_f16() + kv.f16_slot(p) + head_offset;
    const uint16_t* v = kv.v_f16() + kv.f16_slot(p) + head_offset;
    const double hk = 0.5001 * amax_of([&](int64_t i) { return f16_to_f32(k[i]); }) / KQ;
    double k1 = 0;
    for (int64_t i = 0; i < D; ++i) k1 += std::fabs(f16_to_f32(k[i]));
    ds = std::max(ds, scale * (q1 * hk + k1 * hq + D * hq * hk));
    const double va = amax_of([&](int64_t i) { return f16_to_f32(v[i]); });
    vmax = std::max(vmax, va);
    vstep = std::max(vstep, va / kFastAttentionValueMax);
  }
  return vmax * std::expm1(2 * ds) + 0.5001 * vstep + 4 * vstep;
}

// The reference against softmax(scale q.k) v in double over the same f16 keys
// and values (sinks joining the sum): within its codes' error
// (code_error_bound) and float rounding; and well inside that bound on
// average, a check a coding step that lost bits would fail.
TEST(KernelsAttentionFast, AgreesWithASoftmaxInDouble) {
  std::mt19937 rng(43);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const int64_t D = 64, n_pos = 900, n_heads = 2;
  const RandomPagedCache cache(D, n_pos, 16, 2, 1, rng);  // the view reads the second layer
  const PagedKV& kv = cache.kv;
  const float scale = 0.125f;
  const float sinks[2] = {1.5f, -2.0f};
  for (auto [b, e] : {std::pair<int64_t, int64_t>{0, 1}, {0, 900}, {123, 517}, {896, 900}}) {
    for (const float* sk : {static_cast<const float*>(nullptr), static_cast<const float*>(sinks)}) {
      std::vector<float> q(static_cast<size_t>(n_heads * D));
      for (float& x : q) x = 3.0f * dist(rng);
      const std::vector<float> got = alone(q, 0, n_heads, kv, D, 0, b, e, scale, sk);
      for (int64_t h = 0; h < n_heads; ++h) {
        const std::vector<double> want = softmax_in_double(q.data() + h * D, kv, 0, D, b, e, scale, sk ? sk + h : nullptr);
        const double bound = code_error_bound(q.data() + h * D, kv, 0, D, b, e, scale);
        double mean_error = 0;
        for (int64_t i = 0; i < D; ++i) {
          EXPECT_NEAR(got[h * D + i], want[i], bound + 1e-5 + 1e-4 * std::fabs(want[i]))
              << "[" << b << ", " << e << ") head " << h;
          mean_error += std::fabs(got[h * D + i] - want[i]) / D;
        }
        EXPECT_LT(mean_error, 0.01 * bound) << "[" << b << ", " << e << ") head " << h;
      }
    }
  }
}

// Decode split over the context: the parts' states, whether one call takes
// the whole range or threads take runs of parts apart, and their join are the
// same bits at every level; and the joined result (f32 products) agrees with
// a softmax in double.
TEST(KernelsAttentionFast, DecodePartsJoinToEachTokensResult) {
  std::mt19937 rng(53);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  using PartsFn = void (*)(const AttentionTile&, int64_t, const PagedKV&, int64_t, int64_t, float, const float*,
                           const FastAttentionState*);
  using JoinFn = void (*)(const FastAttentionState&, int64_t, int64_t, int64_t, const float*, float*);
  std::vector<std::tuple<std::string, PartsFn, JoinFn>> levels = {
      {"scalar", detail::attend_heads_tile_fast_scalar, detail::join_fast_attention_states_scalar}};
  if (best_simd_level() >= SimdLevel::kAvx2)
    levels.emplace_back("avx2", detail::attend_heads_tile_fast_avx2, detail::join_fast_attention_states_avx2);
  if (best_simd_level() >= SimdLevel::kAvx512)
    levels.emplace_back("avx512", detail::attend_heads_tile_fast_avx512, detail::join_fast_attention_states_avx2);
  const int64_t S = kFastDecodeSplit;
  for (int64_t D : {64, 40, 128}) {
    const int64_t n_pos = 700;
    const RandomPagedCache cache(D, n_pos, 16, 2, 2, rng);
    const PagedKV& kv = cache.kv;
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    for (int64_t n_heads : {1, 3, 7}) {
      std::vector<float> sinks(static_cast<size_t>(n_heads));
      for (float& x : sinks) x = 3.0f * dist(rng);
      for (auto [b, e] : {std::pair<int64_t, int64_t>{0, 1}, {0, S}, {0, S + 1}, {S - 1, S + 1}, {37, 700},
                          {0, 700}, {600, 601}, {3 * S, 5 * S}}) {
        const int64_t n_parts = fast_decode_parts(b, e);
        ASSERT_EQ(n_parts, (e - 1) / S - b / S + 1);
        std::vector<float> q(static_cast<size_t>(n_heads * D));
        for (float& x : q) x = 2.0f * dist(rng);
        const size_t rows = static_cast<size_t>(n_parts * n_heads);
        std::vector<float> want_m, want_lanes, want_o;
        for (const float* sk : {static_cast<const float*>(nullptr), static_cast<const float*>(sinks.data())}) {
          std::vector<float> want_out;
          for (const auto& [name, parts_fn, join_fn] : levels) {
            // The whole range in one call, then in runs of parts as threads would take them.
            std::vector<float> m(rows), lanes(8 * rows), o(rows * D);
            const AttentionTile tile{q.data(), n_heads * D, nullptr, 0, 1, &b, &e};
            const FastAttentionState whole{m.data(), lanes.data(), o.data()};
            parts_fn(tile, n_heads, kv, D, D, scale, nullptr, &whole);
            std::vector<float> m2(rows), lanes2(8 * rows), o2(rows * D);
            for (int64_t k0 = 0; k0 < n_parts; k0 += 2) {  // runs of two parts
              const int64_t rb = std::max(b, (b / S + k0) * S), re = std::min(e, (b / S + k0 + 2) * S);
              const AttentionTile run{q.data(), n_heads * D, nullptr, 0, 1, &rb, &re};
              const size_t r0 = static_cast<size_t>(k0 * n_heads);
              const FastAttentionState these{m2.data() + r0, lanes2.data() + 8 * r0, o2.data() + r0 * D};
              parts_fn(run, n_heads, kv, D, D, scale, nullptr, &these);
            }
            for (size_t r = 0; r < rows; ++r) ASSERT_EQ(bits_of(m[r]), bits_of(m2[r])) << name << " row " << r;
            for (size_t i = 0; i < lanes.size(); ++i) ASSERT_EQ(bits_of(lanes[i]), bits_of(lanes2[i])) << name;
            for (size_t i = 0; i < o.size(); ++i) ASSERT_EQ(bits_of(o[i]), bits_of(o2[i])) << name << " o " << i;
            if (want_m.empty()) want_m = m, want_lanes = lanes, want_o = o;
            for (size_t i = 0; i < o.size(); ++i) ASSERT_EQ(bits_of(o[i]), bits_of(want_o[i])) << name << " o " << i;
            for (size_t i = 0; i < lanes.size(); ++i) ASSERT_EQ(bits_of(lanes[i]), bits_of(want_lanes[i])) << name;
            for (size_t r = 0; r < rows; ++r) ASSERT_EQ(bits_of(m[r]), bits_of(want_m[r])) << name;

            std::vector<float> out(static_cast<size_t>(n_heads * D));
            join_fn(FastAttentionState{m.data(), lanes.data(), o.data()}, n_parts, n_heads, D, sk, out.data());
            if (want_out.empty()) want_out = out;
            for (size_t i = 0; i < out.size(); ++i)
              ASSERT_EQ(bits_of(out[i]), bits_of(want_out[i])) << name << " [" << b << ", " << e << ") i " << i;
          }
          // Against softmax(scale q.k) v in double, sinks joining the sum.
          for (int64_t h = 0; h < n_heads; ++h) {
            const std::vector<double> want =
                softmax_in_double(q.data() + h * D, kv, D, D, b, e, scale, sk ? sk + h : nullptr);
            for (int64_t i = 0; i < D; ++i)
              ASSERT_NEAR(want_out[h * D + i], want[i], 1e-5 + 1e-4 * std::fabs(want[i]))
                  << "D " << D << " heads " << n_heads << " [" << b << ", " << e << ") head " << h;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace inferd::kernels
