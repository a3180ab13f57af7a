// Block formats: f16/bf16 conversions, layouts checked against the gguf Python
// package, quantize->dequantize error bounds, and every SIMD kernel against the
// scalar reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "kernels/cpu/quants_blocks.h"
#include "kernels_test_util.h"
#include "test_data.h"

namespace inferd::kernels {
namespace {

using testing::all_types;
using testing::bits_of;
using testing::dequantize_ref;
using testing::level_name;
using testing::quantize_ref;
using testing::random_floats;
using testing::runnable_levels;
using testing::weight_types;

uint16_t compiler_f16(float f) {
  _Float16 h = static_cast<_Float16>(f);  // libgcc's conversion: round to nearest even
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// ---- f16 / bf16 ----------------------------------------------------------------

TEST(KernelsF16, EveryHalfConvertsExactlyAndBack) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    _Float16 ch;
    const uint16_t h16 = static_cast<uint16_t>(h);
    std::memcpy(&ch, &h16, 2);
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(static_cast<float>(ch))) << h;
      const uint16_t back = f32_to_f16(f);
      EXPECT_EQ(back & 0x7c00, 0x7c00) << h;
      EXPECT_NE(back & 0x03ff, 0) << h;
      EXPECT_EQ(back & 0x8000, h & 0x8000) << h;
      continue;
    }
    ASSERT_EQ(bits_of(f), bits_of(static_cast<float>(ch))) << "half " << h;
    ASSERT_EQ(f32_to_f16(f), h) << "half " << h;
  }
}

TEST(KernelsF16, RoundsToNearestEvenLikeTheCompiler) {
  const float edge[] = {65504.0f, 65519.996f, 65520.0f, 65536.0f, 1e10f, -65520.0f,
                        std::ldexp(1.0f, -24), std::ldexp(1.0f, -25), std::ldexp(1.0000001f, -25),
                        std::ldexp(1.5f, -24), std::ldexp(2.5f, -24), std::ldexp(1.0f, -14),
                        std::ldexp(1023.5f, -24), std::ldexp(1.0f, -30), 0.0f, -0.0f,
                        1.0f + std::ldexp(1.0f, -11), 1.0f + std::ldexp(3.0f, -11),
                        INFINITY, -INFINITY};
  for (float f : edge) EXPECT_EQ(f32_to_f16(f), compiler_f16(f)) << f;
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.5f, -24)), 2);  // tie between subnormals 1 and 2 -> even
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0);  // tie between 0 and 1 -> even

  std::mt19937 rng(7);
  for (int i = 0; i < 2000000; ++i) {
    // Exponents spread over the whole f16 range and beyond.
    const uint32_t u = (rng() & 0x807fffffu) | ((90u + rng() % 60u) << 23);
    const float f = from_bits(u);
    ASSERT_EQ(f32_to_f16(f), compiler_f16(f)) << std::hexfloat << f;
  }
}

TEST(KernelsBF16, RoundsToNearestEvenAndQuietsNans) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808000u)), 0x3f80);  // tie, keep even
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f818000u)), 0x3f82);  // tie, round up to even
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808001u)), 0x3f81);
  EXPECT_EQ(f32_to_bf16(from_bits(0x00018000u)), 0x0002);  // subnormal tie
  EXPECT_EQ(f32_to_bf16(from_bits(0x7f7fffffu)), 0x7f80);  // max float rounds to inf
  EXPECT_EQ(f32_to_bf16(INFINITY), 0x7f80);
  EXPECT_EQ(f32_to_bf16(-INFINITY), 0xff80);
  const uint16_t nan = f32_to_bf16(from_bits(0x7f800001u));  // signalling nan, payload in low bits
  EXPECT_EQ(nan & 0x7f80, 0x7f80);
  EXPECT_NE(nan & 0x007f, 0);
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = bf16_to_f32(static_cast<uint16_t>(h));
    EXPECT_EQ(bits_of(f), h << 16);
    if (!std::isnan(f)) {
      ASSERT_EQ(f32_to_bf16(f), h);
    }
  }
}

// ---- layouts, checked against the gguf Python package -----------------------------

struct PyRecord {
  std::string kind;  // dequant | quant | row
  std::vector<std::string> header;
  std::vector<uint8_t> bytes;
  std::vector<float> values;
};

DType type_from_name(const std::string& name) {
  for (DType t : all_types()) {
    if (name == dtype_name(t)) return t;
  }
  ADD_FAILURE() << "unknown type " << name;
  return DType::F32;
}

std::vector<uint8_t> parse_hex(const std::string& hex) {
  std::vector<uint8_t> out(hex.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  return out;
}

std::vector<PyRecord> load_py_reference() {
  const std::string path = inferd::test::test_data_root() + "/kernels/gguf_py_reference.txt";
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "missing " << path;
  std::vector<PyRecord> records;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ss(line);
    std::string word;
    ss >> word;
    if (word == "bytes") {
      std::string hex;
      ss >> hex;
      records.back().bytes = parse_hex(hex);
    } else if (word == "values") {
      std::string v;
      while (ss >> v) records.back().values.push_back(std::strtof(v.c_str(), nullptr));
    } else {
      PyRecord r;
      r.kind = word;
      while (ss >> word) r.header.push_back(word);
      records.push_back(std::move(r));
    }
  }
  return records;
}

void expect_same_floats(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size() && bad < 5; ++i) {
    if (bits_of(got[i]) != bits_of(want[i])) {
      ADD_FAILURE() << what << " element " << i << ": got " << got[i] << ", gguf-py says " << want[i];
      ++bad;
    }
  }
}

TEST(KernelsGgufPyReference, DequantizeMatchesBitForBit) {
  int checked = 0;
  for (const PyRecord& r : load_py_reference()) {
    if (r.kind != "dequant") continue;
    const DType t = type_from_name(r.header.at(0));
    const int64_t n = std::stoll(r.header.at(1));
    ASSERT_EQ(r.bytes.size(), row_bytes(t, n)) << r.header[0];
    expect_same_floats(dequantize_ref(t, r.bytes.data(), n), r.values, std::string("ref ") + r.header[0]);
    std::vector<float> fast(static_cast<size_t>(n));
    dequantize_row(t, r.bytes.data(), fast.data(), n);
    expect_same_floats(fast, r.values, std::string("dispatched ") + r.header[0]);
    ++checked;
  }
  EXPECT_EQ(checked, 12);
}

TEST(KernelsGgufPyReference, QuantizeMatchesByteForByte) {
  int checked = 0;
  for (const PyRecord& r : load_py_reference()) {
    if (r.kind != "quant") continue;
    const DType t = type_from_name(r.header.at(0));
    EXPECT_EQ(quantize_ref(t, r.values), r.bytes) << r.header[0];
    for (SimdLevel level : runnable_levels()) {
      const KernelTable table = build_kernel_table(level);
      std::vector<uint8_t> q(row_bytes(t, static_cast<int64_t>(r.values.size())));
      table.type[static_cast<uint32_t>(t)].quantize_row(r.values.data(), q.data(),
                                                        static_cast<int64_t>(r.values.size()));
      EXPECT_EQ(q, r.bytes) << r.header[0] << " at " << level_name(level);
    }
    ++checked;
  }
  EXPECT_EQ(checked, 7);
}

TEST(KernelsLayout, HandMadeBlocksDecodeAsDocumented) {
  // Q4_0: element j is the low nibble of qs[j], element j+16 the high one, minus 8.
  BlockQ4_0 q4{};
  q4.d = f32_to_f16(0.5f);
  for (int j = 0; j < 16; ++j) q4.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  std::vector<float> y = dequantize_ref(DType::Q4_0, &q4, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.5f * (j - 8));
    EXPECT_EQ(y[j + 16], 0.5f * (7 - j));
  }
  // Q8_K: d * qs.
  BlockQ8_K q8{};
  q8.d = 0.25f;
  for (int j = 0; j < 256; ++j) q8.qs[j] = static_cast<int8_t>(j - 128);
  y = dequantize_ref(DType::Q8_K, &q8, 256);
  for (int j = 0; j < 256; ++j) EXPECT_EQ(y[j], 0.25f * (j - 128));
}

// ---- quantize -> dequantize error --------------------------------------------------

// Bound on RMS(x - dequant(quant(x))) / RMS(x) for normal data: about 1.3x
// what the quantizers measure (e.g. Q4_0 0.087, Q4_K 0.080, Q6_K 0.019); a
// wrong layout or scale gives errors near 1.
double rms_bound(DType t) {
  switch (t) {
    case DType::F32: return 0.0;
    case DType::F16: return 3e-4;
    case DType::BF16: return 2.5e-3;
    case DType::Q8_0: case DType::Q8_1: return 7.5e-3;
    case DType::Q8_K: return 9.5e-3;
    case DType::Q6_K: return 0.025;
    case DType::Q5_0: return 0.055;
    case DType::Q5_1: case DType::Q5_K: return 0.05;
    case DType::Q4_0: return 0.11;
    case DType::Q4_1: case DType::Q4_K: return 0.10;
    case DType::Q3_K: return 0.26;
    case DType::Q2_K: return 0.42;
    default: return 0.0;
  }
}

TEST(KernelsRoundTrip, ErrorWithinBoundsForEveryType) {
  std::mt19937 rng(42);
  for (DType t : all_types()) {
    for (float scale : {1e-3f, 1.0f, 300.0f}) {
      const std::vector<float> x = random_floats(rng, 4096, scale);
      const std::vector<float> y = dequantize_ref(t, quantize_ref(t, x).data(), 4096);
      double err = 0, ref = 0;
      for (size_t i = 0; i < x.size(); ++i) err += (x[i] - y[i]) * (x[i] - y[i]), ref += x[i] * x[i];
      const double rel = std::sqrt(err / ref);
      EXPECT_LE(rel, rms_bound(t)) << dtype_name(t) << " scale " << scale;
    }
    // All zeros stay zeros.
    const std::vector<float> zeros(512, 0.0f);
    for (float v : dequantize_ref(t, quantize_ref(t, zeros).data(), 512)) ASSERT_EQ(v, 0.0f) << dtype_name(t);
  }
}

TEST(KernelsRoundTrip, ActivationQuantizersKeepEveryElementWithinHalfAStep) {
  std::mt19937 rng(3);
  const std::vector<float> x = random_floats(rng, 1024, 2.0f);
  {
    const std::vector<uint8_t> q = quantize_ref(DType::Q8_0, x);
    const BlockQ8_0* b = reinterpret_cast<const BlockQ8_0*>(q.data());
    for (int i = 0; i < 1024; ++i) {
      const BlockQ8_0& blk = b[i / 32];
      float amax = 0;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[i / 32 * 32 + j]));
      const float d = amax / 127;
      EXPECT_LE(std::fabs(x[i] - d * blk.qs[i % 32]), 0.5f * d * 1.0001f);
      EXPECT_NEAR(f16_to_f32(blk.d), d, d * 1e-3);
    }
  }
  {
    const std::vector<uint8_t> q = quantize_ref(DType::Q8_1, x);
    const BlockQ8_1* b = reinterpret_cast<const BlockQ8_1*>(q.data());
    for (int i = 0; i < 1024 / 32; ++i) {
      int sum = 0;
      float amax = 0;
      for (int j = 0; j < 32; ++j) sum += b[i].qs[j], amax = std::max(amax, std::fabs(x[i * 32 + j]));
      EXPECT_EQ(b[i].s, f32_to_f16(static_cast<float>(sum) * (amax / 127)));  // s = d * sum(qs)
    }
  }
  {
    const std::vector<uint8_t> q = quantize_ref(DType::Q8_K, x);
    const BlockQ8_K* b = reinterpret_cast<const BlockQ8_K*>(q.data());
    for (int i = 0; i < 1024 / 256; ++i) {
      for (int g = 0; g < 16; ++g) {
        int sum = 0;
        for (int j = 0; j < 16; ++j) sum += b[i].qs[16 * g + j];
        EXPECT_EQ(b[i].bsums[g], sum);
      }
      for (int j = 0; j < 256; ++j) {
        EXPECT_LE(std::abs(b[i].qs[j]), 127);
        EXPECT_LE(std::fabs(x[i * 256 + j] - b[i].d * b[i].qs[j]), 0.5f * std::fabs(b[i].d) * 1.0001f);
      }
    }
  }
}

// ---- SIMD against the scalar reference ------------------------------------------------

// Activation rows with awkward cases: ties at .5 after scaling, a +/- tie for the
// largest magnitude, an all-zero block, and tiny and huge scales.
std::vector<float> tricky_activations(std::mt19937& rng, int64_t n) {
  std::vector<float> x = random_floats(rng, n);
  if (n >= 512) {
    // Block of 32 with amax 127: scale exactly 1, so x.5 values are ties (roundf: away from 0).
    x[0] = 127.0f;
    for (int j = 1; j < 32; ++j) x[j] = static_cast<float>(j % 7) - 3.5f;
    for (int j = 32; j < 64; ++j) x[j] = 0.0f;  // an all-zero block of 32
    // Super-block whose largest magnitudes are -127 (first) and +127: Q8_K's
    // scale is -127/-127 = 1, so x.5 values are ties (nearest_int: to even).
    for (int j = 256; j < 512; ++j) x[j] = static_cast<float>(j % 7) - 3.5f;
    x[256] = -127.0f;
    x[300] = 127.0f;
  }
  for (int64_t j = 512; j < n; ++j) x[j] *= (j / 256 % 2) ? 1e-4f : 1e3f;
  if (n >= 1024) {
    for (int j = 512; j < 768; ++j) x[j] = 0.0f;  // an all-zero super-block
  }
  return x;
}

TEST(KernelsSimdQuantize, ActivationQuantizersAreBitExactWithReference) {
  std::mt19937 rng(11);
  for (SimdLevel level : runnable_levels()) {
    const KernelTable table = build_kernel_table(level);
    for (DType t : {DType::Q8_0, DType::Q8_1, DType::Q8_K, DType::F16, DType::BF16, DType::F32}) {
      for (int64_t n : {256, 512, 2048, 4096}) {
        const std::vector<float> x = tricky_activations(rng, n);
        std::vector<uint8_t> got(row_bytes(t, n));
        table.type[static_cast<uint32_t>(t)].quantize_row(x.data(), got.data(), n);
        EXPECT_EQ(got, quantize_ref(t, x)) << dtype_name(t) << " n=" << n << " at " << level_name(level);
      }
    }
  }
}

// Weight rows of type t: quantized from random floats, or random bytes with
// sane scale fields (covers every bit pattern of the quant fields).
std::vector<uint8_t> random_weights(std::mt19937& rng, DType t, int64_t n, bool raw_bytes) {
  if (!raw_bytes || !info(t).quantized) return quantize_ref(t, random_floats(rng, n));
  std::vector<uint8_t> q(row_bytes(t, n));
  for (uint8_t& b : q) b = static_cast<uint8_t>(rng());
  std::vector<int> f16_fields;
  switch (t) {
    case DType::Q4_0: case DType::Q5_0: case DType::Q8_0: f16_fields = {0}; break;
    case DType::Q4_1: case DType::Q5_1: case DType::Q4_K: case DType::Q5_K: f16_fields = {0, 2}; break;
    case DType::Q2_K: f16_fields = {80, 82}; break;
    case DType::Q3_K: f16_fields = {108}; break;
    case DType::Q6_K: f16_fields = {208}; break;
    default: break;
  }
  std::uniform_real_distribution<float> scale(-0.1f, 0.1f);
  for (size_t b = 0; b < q.size(); b += static_cast<size_t>(info(t).block_bytes)) {
    if (t == DType::MXFP4) q[b] = static_cast<uint8_t>(rng() % 4 == 0 ? rng() % 3 : 100 + rng() % 50);  // E8M0
    for (int off : f16_fields) {
      const uint16_t h = f32_to_f16(scale(rng));
      std::memcpy(&q[b + off], &h, 2);
    }
  }
  return q;
}

std::vector<int64_t> row_lengths(DType t) {
  if (!info(t).quantized) return {1, 7, 16, 31, 64, 100, 576, 1000};
  if (info(t).block_size == 256) return {256, 512, 1024, 2048};
  return {32, 64, 96, 576, 1536};
}

TEST(KernelsSimdVecDot, EveryKernelMatchesReference) {
  std::mt19937 rng(5);
  for (SimdLevel level : runnable_levels()) {
    const KernelTable table = build_kernel_table(level);
    for (DType t : weight_types()) {
      const DType at = vec_dot_type(t);
      for (int64_t n : row_lengths(t)) {
        for (bool raw : {false, true}) {
          const std::vector<uint8_t> a = random_weights(rng, t, n, raw);
          const std::vector<uint8_t> b = quantize_ref(at, tricky_activations(rng, n));
          const float want = ref::vec_dot(t, n, a.data(), b.data());
          const float got = table.type[static_cast<uint32_t>(t)].vec_dot(n, a.data(), b.data());
          const std::vector<float> da = dequantize_ref(t, a.data(), n), db = dequantize_ref(at, b.data(), n);
          double mag = 0;
          for (int64_t i = 0; i < n; ++i) mag += std::fabs(static_cast<double>(da[i]) * db[i]);
          EXPECT_NEAR(got, want, 1e-6 * mag + 1e-30)
              << dtype_name(t) << " n=" << n << (raw ? " raw" : "") << " at " << level_name(level);
          // Every level follows GGML's vec_dot order, so the bits too; Q4_1's
          // vec_dot only (Linear runs it packed, in GGML's order there).
          if (level == SimdLevel::kScalar || t != DType::Q4_1) {
            EXPECT_EQ(bits_of(got), bits_of(want))
                << dtype_name(t) << " n=" << n << (raw ? " raw" : "") << " at " << level_name(level);
          }
        }
      }
    }
  }
}

TEST(KernelsSimdVecDot, ReferenceMatchesDequantizedDot) {
  // The integer block arithmetic of the reference equals the plain dot product
  // of the dequantized rows up to float rounding (and Q8_1's f16-rounded sum).
  std::mt19937 rng(8);
  for (DType t : weight_types()) {
    const DType at = vec_dot_type(t);
    const int64_t n = info(t).block_size == 256 ? 1024 : 576;
    const std::vector<uint8_t> a = random_weights(rng, t, n, false);
    const std::vector<uint8_t> b = quantize_ref(at, random_floats(rng, n));
    const std::vector<float> da = dequantize_ref(t, a.data(), n), db = dequantize_ref(at, b.data(), n);
    double want = 0, mag = 0;
    for (int64_t i = 0; i < n; ++i) want += static_cast<double>(da[i]) * db[i], mag += std::fabs(static_cast<double>(da[i]) * db[i]);
    const double tol = (at == DType::Q8_1 ? 2e-3 : 1e-5) * mag;
    EXPECT_NEAR(ref::vec_dot(t, n, a.data(), b.data()), want, tol) << dtype_name(t);
  }
}

TEST(KernelsSimdVecDot, TileKernelsAreBitIdenticalToVecDot) {
  std::mt19937 rng(9);
  for (SimdLevel level : runnable_levels()) {
    const KernelTable table = build_kernel_table(level);
    for (DType t : weight_types()) {
      const TypeKernels& k = table.type[static_cast<uint32_t>(t)];
      if (k.gemm_tile == nullptr) continue;
      const DType at = vec_dot_type(t);
      const int64_t n = info(t).block_size == 256 ? 1024 : 608;
      const int max_rows = 5, max_tokens = 6;  // beyond the largest tile: the kernel cuts them
      const size_t a_stride = row_bytes(t, n), b_stride = row_bytes(at, n);
      std::vector<uint8_t> a, b;
      for (int r = 0; r < max_rows; ++r) {
        const std::vector<uint8_t> row = random_weights(rng, t, n, r % 2 == 1);
        a.insert(a.end(), row.begin(), row.end());
      }
      for (int r = 0; r < max_tokens; ++r) {
        const std::vector<uint8_t> row = quantize_ref(at, random_floats(rng, n));
        b.insert(b.end(), row.begin(), row.end());
      }
      for (int nr = 1; nr <= max_rows; ++nr) {
        for (int nt = 1; nt <= max_tokens; ++nt) {
          // Output as y[token][row] with a row stride of 7, like matmul's layout.
          std::vector<float> out(7 * max_tokens, NAN);
          k.gemm_tile(n, a.data(), a_stride, nr, b.data(), b_stride, nt, out.data(), 1, 7);
          for (int r = 0; r < nr; ++r) {
            for (int tok = 0; tok < nt; ++tok) {
              const float want = k.vec_dot(n, a.data() + r * a_stride, b.data() + tok * b_stride);
              ASSERT_EQ(bits_of(out[tok * 7 + r]), bits_of(want))
                  << dtype_name(t) << " tile " << nr << "x" << nt << " row " << r << " token " << tok
                  << " at " << level_name(level);
            }
          }
        }
      }
    }
  }
}

// The prefill tiles (AVX2 Q4_0/Q5_0 rows unpacked once per call, then 4x2
// register tiles; matmul hands them up to tile_rows x tile_tokens) at shapes
// past every edge: each pair still gets vec_dot's bits.
TEST(KernelsSimdVecDot, LargeTilesAreBitIdenticalToVecDot) {
  std::mt19937 rng(10);
  for (SimdLevel level : runnable_levels()) {
    const KernelTable table = build_kernel_table(level);
    for (DType t : weight_types()) {
      const TypeKernels& k = table.type[static_cast<uint32_t>(t)];
      if (k.gemm_tile == nullptr) continue;
      const DType at = vec_dot_type(t);
      const int64_t n = info(t).block_size == 256 ? 512 : 352;
      const int max_rows = 19, max_tokens = 70;
      const size_t a_stride = row_bytes(t, n), b_stride = row_bytes(at, n);
      std::vector<uint8_t> a, b;
      for (int r = 0; r < max_rows; ++r) {
        const std::vector<uint8_t> row = random_weights(rng, t, n, r % 2 == 1);
        a.insert(a.end(), row.begin(), row.end());
      }
      for (int r = 0; r < max_tokens; ++r) {
        const std::vector<uint8_t> row = quantize_ref(at, random_floats(rng, n));
        b.insert(b.end(), row.begin(), row.end());
      }
      for (int nr : {1, 3, 4, 5, 16, 19}) {
        for (int nt : {4, 5, 8, 33, 64, 70}) {
          std::vector<float> out(static_cast<size_t>(max_rows) * max_tokens, NAN);
          k.gemm_tile(n, a.data(), a_stride, nr, b.data(), b_stride, nt, out.data(), 1, max_rows);
          for (int r = 0; r < nr; ++r) {
            for (int tok = 0; tok < nt; ++tok) {
              const float want = k.vec_dot(n, a.data() + r * a_stride, b.data() + tok * b_stride);
              ASSERT_EQ(bits_of(out[tok * max_rows + r]), bits_of(want))
                  << dtype_name(t) << " tile " << nr << "x" << nt << " row " << r << " token " << tok
                  << " at " << level_name(level);
            }
          }
        }
      }
    }
  }
}

TEST(KernelsDispatch, ReportsTheChosenLevel) {
  const std::string level = simd_level();
  EXPECT_TRUE(level == "scalar" || level == "avx2" || level == "avx512vnni" || level == "amx") << level;
  const char* env = std::getenv("INFERD_SIMD");
  if (env == nullptr) {
    EXPECT_EQ(level, build_kernel_table(best_simd_level()).level);
  } else if (std::string(env) == "scalar") {
    EXPECT_EQ(level, "scalar");
  }
  for (DType t : weight_types()) EXPECT_TRUE(is_supported_weight_type(t));
  EXPECT_FALSE(is_supported_weight_type(DType::Q8_K));
  EXPECT_EQ(vec_dot_type(DType::Q4_1), DType::Q8_1);
  EXPECT_EQ(vec_dot_type(DType::Q5_0), DType::Q8_0);
  EXPECT_EQ(vec_dot_type(DType::Q6_K), DType::Q8_K);
  EXPECT_EQ(vec_dot_type(DType::BF16), DType::BF16);
}

}  // namespace
}  // namespace inferd::kernels
