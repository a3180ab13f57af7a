// Paged attention over Q8_0, Q4_0, BF16 and fp8 e4m3 keys and values
// (attention_quant.h): at
// every SIMD level, against a plain softmax in double over the dequantized
// keys and values (and, for Q8_0 and Q4_0, the query as quantized to Q8_0); the same bits for both passes; each head's bits the same
// whether it is computed alone or with the other heads of its group.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_quant.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/quants.h"
#include "kernels/cpu/quants_blocks.h"
#include "kernels_test_util.h"

namespace inferd::kernels {
namespace {

using testing::bits_of;
using testing::level_name;
using testing::runnable_levels;

constexpr int64_t kKVHeads = 2;  // the tests read head 1, so the head offset is exercised
constexpr DType kDTypes[] = {DType::Q8_0, DType::Q4_0, DType::BF16, DType::F8_E4M3};

// n elements of dtype from base (whole 32-element blocks), in double.
std::vector<double> dequantized(DType dtype, const uint8_t* base, int64_t n) {
  std::vector<double> x(static_cast<size_t>(n));
  if (dtype == DType::BF16) {  // the top half of an f32
    const auto* e = reinterpret_cast<const uint16_t*>(base);
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t bits = uint32_t{e[i]} << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      x[i] = f;
    }
    return x;
  }
  if (dtype == DType::F8_E4M3) {  // sign, 4 exponent bits (bias 7), 3 mantissa bits
    for (int64_t i = 0; i < n; ++i) {
      const int code = base[i], e = (code >> 3) & 0xf, m = code & 7;
      const double mag = e == 0 ? m * std::ldexp(1.0, -9) : std::ldexp(1.0 + m / 8.0, e - 7);
      x[i] = code & 0x80 ? -mag : mag;
    }
    return x;
  }
  for (int64_t b = 0; b < n / kQK; ++b) {
    if (dtype == DType::Q8_0) {
      const auto* blk = reinterpret_cast<const BlockQ8_0*>(base) + b;
      for (int i = 0; i < kQK; ++i) x[b * kQK + i] = double{f16_to_f32(blk->d)} * blk->qs[i];
    } else {
      const auto* blk = reinterpret_cast<const BlockQ4_0*>(base) + b;
      for (int i = 0; i < kQK / 2; ++i) {
        x[b * kQK + i] = double{f16_to_f32(blk->d)} * ((blk->qs[i] & 0x0F) - 8);
        x[b * kQK + i + kQK / 2] = double{f16_to_f32(blk->d)} * ((blk->qs[i] >> 4) - 8);
      }
    }
  }
  return x;
}

// A paged cache of n_pos positions in shuffled blocks, keys and values
// quantized from normal samples.
struct QuantCache {
  DType dtype = DType::Q8_0;
  int64_t D = 64, block_size = 16;
  std::vector<uint8_t> k, v;
  std::vector<int32_t> block_table;
  PagedKV view() const { return PagedKV{k.data(), v.data(), D * kKVHeads, block_size, block_table.data(), dtype}; }

  // Head `head`'s keys (or values) at position p, dequantized in double.
  std::vector<double> row(const std::vector<uint8_t>& bytes, int64_t head, int64_t p) const {
    const int64_t slot = int64_t{block_table[p / block_size]} * block_size + p % block_size;
    return dequantized(dtype, bytes.data() + row_bytes(dtype, slot * D * kKVHeads + head * D), D);
  }
};

QuantCache make_cache(std::mt19937& rng, DType dtype, int64_t n_pos, int64_t D, int64_t block_size) {
  QuantCache c;
  c.dtype = dtype, c.D = D, c.block_size = block_size;
  const int64_t n_blocks = (n_pos + block_size - 1) / block_size;
  for (int64_t b = 0; b < n_blocks; ++b) c.block_table.push_back(static_cast<int32_t>(b));
  std::shuffle(c.block_table.begin(), c.block_table.end(), rng);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const int64_t elements = n_blocks * block_size * D * kKVHeads;
  std::vector<float> x(static_cast<size_t>(elements));
  for (auto* bytes : {&c.k, &c.v}) {
    for (float& e : x) e = dist(rng);
    bytes->resize(row_bytes(dtype, elements));
    quantize_row(dtype, x.data(), bytes->data(), elements);
  }
  return c;
}

// The query as the kernels dot it with the keys: for Q8_0 and Q4_0 caches
// quantized to Q8_0 blocks and dequantized (llama.cpp's vec_dot_type for
// these key types), for the others as it is.
std::vector<double> query_as_dotted(DType dtype, const float* q, int64_t D) {
  std::vector<double> out(q, q + D);
  if (dtype == DType::Q8_0 || dtype == DType::Q4_0) {
    std::vector<uint8_t> blocks(row_bytes(DType::Q8_0, D));
    quantize_row(DType::Q8_0, q, blocks.data(), D);
    out = dequantized(DType::Q8_0, blocks.data(), D);
  }
  return out;
}

// softmax(scale q.k, sink) v over [begin, end) in double, from the
// dequantized keys and values.
std::vector<double> reference(const QuantCache& c, const float* q_in, int64_t head, int64_t begin, int64_t end,
                              float scale, const float* sink) {
  const std::vector<double> q = query_as_dotted(c.dtype, q_in, c.D);
  std::vector<double> s;
  for (int64_t p = begin; p < end; ++p) {
    const std::vector<double> k = c.row(c.k, head, p);
    double d = 0;
    for (int64_t i = 0; i < c.D; ++i) d += q[i] * k[i];
    s.push_back(d * scale);
  }
  double mx = *std::max_element(s.begin(), s.end());
  if (sink) mx = std::max(mx, double{*sink});
  double sum = sink ? std::exp(*sink - mx) : 0.0;
  for (double& x : s) sum += (x = std::exp(x - mx));
  std::vector<double> out(static_cast<size_t>(c.D), 0.0);
  for (int64_t p = begin; p < end; ++p) {
    const std::vector<double> v = c.row(c.v, head, p);
    for (int64_t i = 0; i < c.D; ++i) out[i] += s[p - begin] / sum * v[i];
  }
  return out;
}

struct Level {
  std::string name;
  AttendHeadsFn fn;
};

// Each runnable level's kernel as its table holds it, and the dispatching
// entry point (attend_heads, which must pick the quantized kernels by dtype).
std::vector<Level> levels() {
  std::vector<Level> out;
  for (SimdLevel l : runnable_levels()) {
    if (l == SimdLevel::kAmx) continue;  // AVX-512's table entry
    out.push_back({level_name(l), build_kernel_table(l).ops.attend_heads_quant});
  }
  out.push_back({"dispatch", [](const float* q, int64_t n_heads, const PagedKV& kv, int64_t head_offset, int64_t D,
                                int64_t pos_begin, int64_t pos_end, float scale, AttentionPass pass, float* out,
                                const float* sinks) {
                   attend_heads(q, n_heads, kv, head_offset, D, pos_begin, pos_end, scale, pass, out,
                                GgmlFlavour::kAvx512, sinks);
                 }});
  return out;
}

TEST(KernelsAttentionQuant, TableHoldsEachLevelsKernel) {
  EXPECT_EQ(build_kernel_table(SimdLevel::kScalar).ops.attend_heads_quant, detail::attend_heads_quant_scalar);
  if (best_simd_level() >= SimdLevel::kAvx2)
    EXPECT_EQ(build_kernel_table(SimdLevel::kAvx2).ops.attend_heads_quant, detail::attend_heads_quant_avx2);
  if (best_simd_level() >= SimdLevel::kAvx512)
    EXPECT_EQ(build_kernel_table(SimdLevel::kAvx512).ops.attend_heads_quant, detail::attend_heads_quant_avx512);
  EXPECT_TRUE(attention_reads_kv(DType::Q8_0));
  EXPECT_TRUE(attention_reads_kv(DType::Q4_0));
  EXPECT_TRUE(attention_reads_kv(DType::BF16));
  EXPECT_TRUE(attention_reads_kv(DType::F8_E4M3));
  EXPECT_FALSE(attention_reads_kv(DType::Q4_1));
}

// The tolerance: the kernels sum in f32 what the reference sums in double
// from the same dequantized values. A score is a sum of D <= 256 products of
// |q| <~ 8 and |k| <~ 4, scaled by 1/sqrt(D): its f32 rounding error is a few
// 1e-7; the weights inherit it as a relative error (e^x adds 1-2 ulp), their
// sum adds about sqrt(n_pos) * 2^-24 (a random walk; <= 2e-6 at 4000
// positions), and the output is a convex combination of values |v| <~ 4, so
// its error is a few 1e-6 (2.6e-6 measured at most). 2e-5 leaves room for
// other seeds and still catches any real mistake (a wrong block, nibble,
// scale or position moves the output by 1e-2 or more).
constexpr double kTolerance = 2e-5;

struct Shape {
  DType dtype;
  int64_t D, group, block_size;
};

TEST(KernelsAttentionQuant, MatchesDoubleReferenceAtEveryLevel) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const std::vector<Level> fns = levels();
  double worst = 0;
  for (DType dtype : kDTypes)
    for (int64_t D : {64, 128, 256})
      for (int64_t group : {1, 4, 8})
        for (int64_t block_size : {16, 32})
          for (int64_t n_pos : {1, 15, 16, 17, 31, 32, 33, 100, 257, 700}) {
            if (D == 256 && n_pos == 700 && group > 1) continue;  // time; 700 positions run at the other shapes
            const QuantCache c = make_cache(rng, dtype, n_pos, D, block_size);
            std::vector<float> q(static_cast<size_t>(group * D)), sinks(static_cast<size_t>(group));
            for (float& x : q) x = 2.0f * dist(rng);  // sharp enough that the max matters
            for (float& x : sinks) x = 2.0f * dist(rng);
            const float scale = 1.0f / std::sqrt(static_cast<float>(D));
            for (int64_t begin : {int64_t{0}, n_pos / 3}) {  // all positions, a window
              for (const float* sink : {static_cast<const float*>(nullptr), static_cast<const float*>(sinks.data())}) {
                std::vector<std::vector<double>> want;
                for (int64_t h = 0; h < group; ++h)
                  want.push_back(reference(c, q.data() + h * D, 1, begin, n_pos, scale, sink ? sink + h : nullptr));
                for (const Level& level : fns) {
                  std::vector<float> got(static_cast<size_t>(group * D), NAN);
                  level.fn(q.data(), group, c.view(), D, D, begin, n_pos, scale, AttentionPass::kDecode, got.data(),
                           sink);
                  for (int64_t h = 0; h < group; ++h)
                    for (int64_t i = 0; i < D; ++i) {
                      const double err = std::fabs(got[h * D + i] - want[h][i]);
                      worst = std::max(worst, err);
                      ASSERT_LE(err, kTolerance)
                          << level.name << " " << dtype_name(dtype) << " D " << D << " group " << group << " block "
                          << block_size << " n_pos " << n_pos << " begin " << begin << " sink " << (sink != nullptr)
                          << " head " << h << " element " << i << ": " << got[h * D + i] << " vs " << want[h][i];
                    }
                }
              }
            }
          }
  std::printf("largest difference from the double reference: %.3g\n", worst);
}

// One order for both passes, and per head whatever else is grouped with it:
// the same bits for a head computed alone, in its group, and in either pass.
TEST(KernelsAttentionQuant, SameBitsForEitherPassAndAnyGrouping) {
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (const Level& level : levels())
    for (DType dtype : kDTypes)
      for (int64_t D : {64, 128, 256})
        for (int64_t group : {4, 8, 12}) {  // 12: more than one chunk of grouped heads
          const int64_t n_pos = 77, block_size = 16;
          const QuantCache c = make_cache(rng, dtype, n_pos, D, block_size);
          std::vector<float> q(static_cast<size_t>(group * D)), sinks(static_cast<size_t>(group));
          for (float& x : q) x = 2.0f * dist(rng);
          for (float& x : sinks) x = dist(rng);
          const float scale = 1.0f / std::sqrt(static_cast<float>(D));
          for (const float* sink : {static_cast<const float*>(nullptr), static_cast<const float*>(sinks.data())})
            for (int64_t begin : {int64_t{0}, int64_t{30}}) {
              std::vector<float> decode(static_cast<size_t>(group * D)), prefill(decode.size()), alone(decode.size()),
                  halves(decode.size());
              level.fn(q.data(), group, c.view(), D, D, begin, n_pos, scale, AttentionPass::kDecode, decode.data(), sink);
              level.fn(q.data(), group, c.view(), D, D, begin, n_pos, scale, AttentionPass::kPrefill, prefill.data(),
                       sink);
              for (int64_t h = 0; h < group; ++h)
                level.fn(q.data() + h * D, 1, c.view(), D, D, begin, n_pos, scale, AttentionPass::kPrefill,
                         alone.data() + h * D, sink ? sink + h : nullptr);
              const int64_t first = group / 2 + 1;  // an uneven split
              level.fn(q.data(), first, c.view(), D, D, begin, n_pos, scale, AttentionPass::kDecode, halves.data(), sink);
              level.fn(q.data() + first * D, group - first, c.view(), D, D, begin, n_pos, scale,
                       AttentionPass::kDecode, halves.data() + first * D, sink ? sink + first : nullptr);
              for (size_t i = 0; i < decode.size(); ++i) {
                const std::string where = level.name + " " + dtype_name(dtype) + " D " + std::to_string(D) +
                                          " group " + std::to_string(group) + " element " + std::to_string(i);
                ASSERT_EQ(bits_of(prefill[i]), bits_of(decode[i])) << where;
                ASSERT_EQ(bits_of(alone[i]), bits_of(decode[i])) << where;
                ASSERT_EQ(bits_of(halves[i]), bits_of(decode[i])) << where;
              }
            }
        }
}

// The levels agree with each other within the reference's tolerance on a
// long context (where the lane orders differ most).
TEST(KernelsAttentionQuant, LevelsAgreeOnALongContext) {
  std::mt19937 rng(13);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const int64_t D = 64, n_pos = 4000;
  for (DType dtype : kDTypes) {
    const QuantCache c = make_cache(rng, dtype, n_pos, D, 16);
    std::vector<float> q(static_cast<size_t>(D));
    for (float& x : q) x = dist(rng);
    const std::vector<double> want = reference(c, q.data(), 1, 0, n_pos, 0.125f, nullptr);
    for (const Level& level : levels()) {
      std::vector<float> got(static_cast<size_t>(D));
      level.fn(q.data(), 1, c.view(), D, D, 0, n_pos, 0.125f, AttentionPass::kDecode, got.data(), nullptr);
      for (int64_t i = 0; i < D; ++i) EXPECT_NEAR(got[i], want[i], kTolerance) << level.name << " " << i;
    }
  }
}


// Latent attention (attend_latent_heads over a quantized latent cache): one
// latent head of Dk elements a slot, the values its first Dv.
struct LatentCache {
  DType dtype = DType::Q8_0;
  int64_t Dk = 0, block_size = 16;
  std::vector<uint8_t> rows;
  std::vector<int32_t> block_table;
  PagedKV view() const { return PagedKV{rows.data(), rows.data(), Dk, block_size, block_table.data(), dtype}; }
  std::vector<double> row(int64_t p) const {
    const int64_t slot = int64_t{block_table[p / block_size]} * block_size + p % block_size;
    return dequantized(dtype, rows.data() + row_bytes(dtype, slot * Dk), Dk);
  }
};

LatentCache make_latent_cache(std::mt19937& rng, DType dtype, int64_t n_pos, int64_t Dk, int64_t block_size) {
  LatentCache c;
  c.dtype = dtype, c.Dk = Dk, c.block_size = block_size;
  const int64_t n_blocks = (n_pos + block_size - 1) / block_size;
  for (int64_t b = 0; b < n_blocks; ++b) c.block_table.push_back(static_cast<int32_t>(b));
  std::shuffle(c.block_table.begin(), c.block_table.end(), rng);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n_blocks * block_size * Dk));
  for (float& e : x) e = dist(rng);
  c.rows.resize(row_bytes(dtype, static_cast<int64_t>(x.size())));
  quantize_row(dtype, x.data(), c.rows.data(), static_cast<int64_t>(x.size()));
  return c;
}

// softmax(scale q.k) over [begin, end) of the first Dv elements, in double
// from the dequantized rows.
std::vector<double> latent_reference(const LatentCache& c, const float* q_in, int64_t Dv, int64_t begin, int64_t end,
                                     float scale) {
  const std::vector<double> q = query_as_dotted(c.dtype, q_in, c.Dk);
  std::vector<double> s;
  std::vector<std::vector<double>> rows;
  for (int64_t p = begin; p < end; ++p) {
    rows.push_back(c.row(p));
    double d = 0;
    for (int64_t i = 0; i < c.Dk; ++i) d += q[i] * rows.back()[i];
    s.push_back(d * scale);
  }
  const double mx = *std::max_element(s.begin(), s.end());
  double sum = 0;
  for (double& x : s) sum += (x = std::exp(x - mx));
  std::vector<double> out(static_cast<size_t>(Dv), 0.0);
  for (size_t r = 0; r < rows.size(); ++r)
    for (int64_t i = 0; i < Dv; ++i) out[i] += s[r] / sum * rows[r][i];
  return out;
}

struct LatentLevel {
  std::string name;
  AttendLatentFn fn;
};

std::vector<LatentLevel> latent_levels() {
  std::vector<LatentLevel> out;
  for (SimdLevel l : runnable_levels()) {
    if (l == SimdLevel::kAmx) continue;
    out.push_back({level_name(l), build_kernel_table(l).ops.attend_latent_quant});
  }
  out.push_back({"dispatch", [](const float* q, int64_t n_heads, const PagedKV& kv, int64_t Dk, int64_t Dv,
                                int64_t pos_begin, int64_t pos_end, float scale, AttentionPass pass, float* out) {
                   attend_latent_heads(q, n_heads, kv, Dk, Dv, pos_begin, pos_end, scale, pass, out);
                 }});
  return out;
}

TEST(KernelsAttentionQuantLatent, TableHoldsEachLevelsKernel) {
  EXPECT_EQ(build_kernel_table(SimdLevel::kScalar).ops.attend_latent_quant, detail::attend_latent_heads_quant_scalar);
  if (best_simd_level() >= SimdLevel::kAvx2) {
    EXPECT_EQ(build_kernel_table(SimdLevel::kAvx2).ops.attend_latent_quant, detail::attend_latent_heads_quant_avx2);
  }
  if (best_simd_level() >= SimdLevel::kAvx512) {
    EXPECT_EQ(build_kernel_table(SimdLevel::kAvx512).ops.attend_latent_quant,
              detail::attend_latent_heads_quant_avx512);
  }
}

// Widths: tiny-deepseek2 (latent 96 + RoPE 16, padded to 128),
// tiny-deepseek2-lite (64 + 16 -> 96) and DeepSeek-V2-Lite / V3 (512 + 64).
constexpr int64_t kLatentShapes[][2] = {{128, 96}, {96, 64}, {576, 512}};

TEST(KernelsAttentionQuantLatent, MatchesDoubleReferenceAtEveryLevel) {
  std::mt19937 rng(17);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const std::vector<LatentLevel> fns = latent_levels();
  double worst = 0;
  for (DType dtype : kDTypes)
    for (const auto& [Dk, Dv] : kLatentShapes)
      for (int64_t n_heads : {1, 3, 16})  // 16: two chunks of grouped heads
        for (int64_t n_pos : {1, 16, 17, 100, 300}) {
          const LatentCache c = make_latent_cache(rng, dtype, n_pos, Dk, 16);
          std::vector<float> q(static_cast<size_t>(n_heads * Dk));
          for (float& x : q) x = 2.0f * dist(rng);
          const float scale = 1.0f / std::sqrt(static_cast<float>(Dk));
          for (int64_t begin : {int64_t{0}, n_pos / 3}) {
            std::vector<std::vector<double>> want;
            for (int64_t h = 0; h < n_heads; ++h)
              want.push_back(latent_reference(c, q.data() + h * Dk, Dv, begin, n_pos, scale));
            for (const LatentLevel& level : fns) {
              std::vector<float> got(static_cast<size_t>(n_heads * Dv), NAN);
              level.fn(q.data(), n_heads, c.view(), Dk, Dv, begin, n_pos, scale, AttentionPass::kDecode, got.data());
              for (int64_t h = 0; h < n_heads; ++h)
                for (int64_t i = 0; i < Dv; ++i) {
                  const double err = std::fabs(got[h * Dv + i] - want[h][i]);
                  worst = std::max(worst, err);
                  // Dk up to 576: a score's f32 error grows as sqrt(Dk), still
                  // well inside the tolerance (see kTolerance).
                  ASSERT_LE(err, kTolerance) << level.name << " " << dtype_name(dtype) << " Dk " << Dk << " Dv " << Dv
                                             << " heads " << n_heads << " n_pos " << n_pos << " begin " << begin
                                             << " head " << h << " element " << i;
                }
            }
          }
        }
  std::printf("largest difference from the double reference: %.3g\n", worst);
}

// The latent kernel is the attention kernel with values cut short: its bits
// are attend_heads' over the same rows as keys and values (D = Dk), first Dv
// elements; and the same for either pass and any grouping of heads.
TEST(KernelsAttentionQuantLatent, IsTheAttentionKernelsFirstValueElements) {
  std::mt19937 rng(19);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const std::vector<Level> full = levels();
  const std::vector<LatentLevel> latent = latent_levels();
  for (size_t li = 0; li < latent.size(); ++li)
    for (DType dtype : kDTypes)
      for (const auto& [Dk, Dv] : kLatentShapes) {
        const int64_t n_heads = 10, n_pos = 77;
        const LatentCache c = make_latent_cache(rng, dtype, n_pos, Dk, 16);
        std::vector<float> q(static_cast<size_t>(n_heads * Dk));
        for (float& x : q) x = 2.0f * dist(rng);
        const float scale = 1.0f / std::sqrt(static_cast<float>(Dk));
        std::vector<float> got(static_cast<size_t>(n_heads * Dv)), prefill(got.size()), alone(got.size());
        std::vector<float> whole(static_cast<size_t>(n_heads * Dk));
        latent[li].fn(q.data(), n_heads, c.view(), Dk, Dv, 5, n_pos, scale, AttentionPass::kDecode, got.data());
        latent[li].fn(q.data(), n_heads, c.view(), Dk, Dv, 5, n_pos, scale, AttentionPass::kPrefill, prefill.data());
        for (int64_t h = 0; h < n_heads; ++h)
          latent[li].fn(q.data() + h * Dk, 1, c.view(), Dk, Dv, 5, n_pos, scale, AttentionPass::kDecode,
                        alone.data() + h * Dv);
        full[li].fn(q.data(), n_heads, c.view(), 0, Dk, 5, n_pos, scale, AttentionPass::kDecode, whole.data(), nullptr);
        for (int64_t h = 0; h < n_heads; ++h)
          for (int64_t i = 0; i < Dv; ++i) {
            const std::string where = latent[li].name + " " + dtype_name(dtype) + " Dk " + std::to_string(Dk) +
                                      " head " + std::to_string(h) + " element " + std::to_string(i);
            ASSERT_EQ(bits_of(got[h * Dv + i]), bits_of(whole[h * Dk + i])) << where;
            ASSERT_EQ(bits_of(prefill[h * Dv + i]), bits_of(got[h * Dv + i])) << where;
            ASSERT_EQ(bits_of(alone[h * Dv + i]), bits_of(got[h * Dv + i])) << where;
          }
      }
}

}  // namespace
}  // namespace inferd::kernels
