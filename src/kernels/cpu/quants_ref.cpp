// Scalar reference for every block format: conversions, quantizers and dot
// products. This is the specification the SIMD paths are tested against, so it
// favours clarity over speed. The arithmetic follows GGML's reference code
// (integer dot product per block, then one float scale per block) so results
// track llama.cpp's closely.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/fp8.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/quants.h"
#include "kernels/cpu/quants_blocks.h"

namespace inferd::kernels {

// ---- f16 / bf16 ------------------------------------------------------------

namespace {
uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
}  // namespace

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ff;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24 is exact in f32.
    const float mag = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return bits_float(sign | float_bits(mag));
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (mant << 13));  // inf / nan
  return bits_float(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t f32_to_f16(float f) {
  const uint32_t x = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return sign | 0x7e00 | ((ax >> 13) & 0x3ff);  // quiet nan
  if (ax >= 0x477ff000u) return sign | 0x7c00;  // rounds past 65504: inf
  if (ax < 0x38800000u) {
    // Below the smallest normal f16 (2^-14): result is round(|f| * 2^24).
    const uint32_t e = ax >> 23;
    if (e < 102) return sign;  // below 2^-25 (at most half the smallest subnormal)
    const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;  // 14..24
    uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t h = (ax >> 13) - (112u << 10);  // rebias exponent, keep 10 mantissa bits
  const uint32_t rem = ax & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) ++h;  // a carry bumps the exponent: fine
  return static_cast<uint16_t>(sign | h);
}

float bf16_to_f32(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

uint16_t f32_to_bf16(float f) {
  const uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40);  // quiet nan
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}

float e8m0_to_f32_half(uint8_t e) {
  // GGML's ggml_e8m0_to_fp32_half: 2^(e - 128); below e = 2 the subnormal patterns.
  return bits_float(e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23);
}

bool is_supported_weight_type(DType t) {
  switch (t) {
    case DType::F32: case DType::F16: case DType::BF16:
    case DType::Q4_0: case DType::Q4_1: case DType::Q5_0: case DType::Q5_1: case DType::Q8_0:
    case DType::Q2_K: case DType::Q3_K: case DType::Q4_K: case DType::Q5_K: case DType::Q6_K:
    case DType::MXFP4:
      return true;
    default:
      return false;
  }
}

DType vec_dot_type(DType t) {
  switch (t) {
    case DType::Q4_0: case DType::Q5_0: case DType::Q8_0: case DType::MXFP4: return DType::Q8_0;
    case DType::Q4_1: case DType::Q5_1: return DType::Q8_1;
    case DType::Q2_K: case DType::Q3_K: case DType::Q4_K: case DType::Q5_K: case DType::Q6_K:
    case DType::Q8_K:
      return DType::Q8_K;
    case DType::F16: return DType::F16;
    case DType::BF16: return DType::BF16;
    default: return DType::F32;
  }
}

namespace ref {
namespace {

float fp16(uint16_t h) { return f16_to_f32(h); }

// Round half to even, like GGML's nearest_int (valid for |v| < 2^22).
int nearest_int(float v) {
  float t = v + 12582912.f;  // 1.5 * 2^23: the fraction bits fall off with RNE
  int32_t i;
  std::memcpy(&i, &t, 4);
  return (i & 0x007fffff) - 0x00400000;
}

int clampi(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

// GGML's horizontal sum of eight float lanes (hsum_float_8 / tinyBLAS hsum):
// upper half onto lower half, then pairs two apart, then the last two.
float hsum8(const float* a) {
  const float s0 = a[4] + a[0], s1 = a[5] + a[1], s2 = a[6] + a[2], s3 = a[7] + a[3];
  return (s0 + s2) + (s1 + s3);
}

// ---- legacy 32-element formats -------------------------------------------

// Value of the signed extreme (the element with the largest magnitude, first
// one on ties), as GGML's symmetric quantizers pick it.
float signed_absmax(const float* x, int n) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < n; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

void quantize_q4_0(const float* x, BlockQ4_0* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    const float d = signed_absmax(x, kQK) / -8;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_f16(d);
    for (int j = 0; j < kQK / 2; ++j) {
      const int q0 = std::min(15, static_cast<int>(static_cast<int8_t>(x[j] * id + 8.5f)));
      const int q1 = std::min(15, static_cast<int>(static_cast<int8_t>(x[j + 16] * id + 8.5f)));
      y[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

// GGML's quantize_row_mxfp4_ref: e from the block's largest magnitude, each
// element the nearest of the sixteen values (the first of equals).
void quantize_mxfp4(const float* x, BlockMXFP4* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
    const uint8_t e = amax > 0.0f ? static_cast<uint8_t>(std::floor(std::log2(amax)) - 2 + 127) : 0;
    const float d = e8m0_to_f32_half(e);
    auto best = [d](float v) {
      int best_i = 0;
      float best_err = std::fabs(kMxfp4Values[0] * d - v);
      for (int k = 1; k < 16; ++k) {
        const float err = std::fabs(kMxfp4Values[k] * d - v);
        if (err < best_err) best_i = k, best_err = err;
      }
      return best_i;
    };
    y[i].e = e;
    for (int j = 0; j < kQK / 2; ++j) y[i].qs[j] = static_cast<uint8_t>(best(x[j]) | (best(x[j + 16]) << 4));
  }
}

void quantize_q4_1(const float* x, BlockQ4_1* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float lo = x[0], hi = x[0];
    for (int j = 1; j < kQK; ++j) lo = std::min(lo, x[j]), hi = std::max(hi, x[j]);
    const float d = (hi - lo) / 15;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_f16(d);
    y[i].m = f32_to_f16(lo);
    for (int j = 0; j < kQK / 2; ++j) {
      const int q0 = std::min(15, static_cast<int>(static_cast<int8_t>((x[j] - lo) * id + 0.5f)));
      const int q1 =
          std::min(15, static_cast<int>(static_cast<int8_t>((x[j + 16] - lo) * id + 0.5f)));
      y[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

void quantize_q5_0(const float* x, BlockQ5_0* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    const float d = signed_absmax(x, kQK) / -16;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_f16(d);
    uint32_t qh = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      const int q0 = std::min(31, static_cast<int>(static_cast<int8_t>(x[j] * id + 16.5f)));
      const int q1 = std::min(31, static_cast<int>(static_cast<int8_t>(x[j + 16] * id + 16.5f)));
      y[i].qs[j] = static_cast<uint8_t>((q0 & 0xf) | ((q1 & 0xf) << 4));
      qh |= static_cast<uint32_t>((q0 >> 4) & 1) << j;
      qh |= static_cast<uint32_t>((q1 >> 4) & 1) << (j + 16);
    }
    std::memcpy(y[i].qh, &qh, 4);
  }
}

void quantize_q5_1(const float* x, BlockQ5_1* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float lo = x[0], hi = x[0];
    for (int j = 1; j < kQK; ++j) lo = std::min(lo, x[j]), hi = std::max(hi, x[j]);
    const float d = (hi - lo) / 31;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_f16(d);
    y[i].m = f32_to_f16(lo);
    uint32_t qh = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      const int q0 = std::min(31, static_cast<int>((x[j] - lo) * id + 0.5f));
      const int q1 = std::min(31, static_cast<int>((x[j + 16] - lo) * id + 0.5f));
      y[i].qs[j] = static_cast<uint8_t>((q0 & 0xf) | ((q1 & 0xf) << 4));
      qh |= static_cast<uint32_t>((q0 >> 4) & 1) << j;
      qh |= static_cast<uint32_t>((q1 >> 4) & 1) << (j + 16);
    }
    std::memcpy(y[i].qh, &qh, 4);
  }
}

// Q8_0 with d = amax/127 rounded to f16 and quants rounded from x * inverse:
// kCpu false is GGML's reference quantizer (as gguf-py writes Q8_0): 1/d,
// half away from zero (roundf); kCpu true is its CPU backend's quantizer of
// activations (quantize_row_q8_0 on x86): 127/amax, ties to even. The matmuls
// that follow GGML use the latter.
template <bool kCpu>
void quantize_q8_0_as(const float* x, BlockQ8_0* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127;
    const float id = kCpu ? (amax != 0.0f ? 127.0f / amax : 0.0f) : (d != 0.0f ? 1.0f / d : 0.0f);
    y[i].d = f32_to_f16(d);
    for (int j = 0; j < kQK; ++j)
      y[i].qs[j] = static_cast<int8_t>(kCpu ? std::nearbyint(x[j] * id) : std::round(x[j] * id));
  }
}

void quantize_q8_0(const float* x, BlockQ8_0* y, int64_t nb) { quantize_q8_0_as<false>(x, y, nb); }
void quantize_q8_0_cpu(const float* x, BlockQ8_0* y, int64_t nb) { quantize_q8_0_as<true>(x, y, nb); }

// Q8_1 only ever holds activations (of Q4_1/Q5_1 products), so it follows
// GGML's CPU quantizer, not its reference one: 127 / amax rather than 1 / d,
// and rounding to nearest with ties to even. The two differ in the last bit of
// some quants, and such a difference grows through the layers (docs/design.md,
// "Logit tolerance").
void quantize_q8_1(const float* x, BlockQ8_1* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    y[i].d = f32_to_f16(d);
    int sum = 0;
    for (int j = 0; j < kQK; ++j) {
      y[i].qs[j] = static_cast<int8_t>(std::nearbyint(x[j] * id));
      sum += y[i].qs[j];
    }
    y[i].s = f32_to_f16(static_cast<float>(sum) * d);
  }
}

// GGML's reference Q8_K quantizer (the one its CPU backend runs on x86): the
// scale comes from the first element of largest magnitude, with its sign.
// kPositiveWins: the variant of the repacked GEMM's 4-row activation blocks
// (ggml_quantize_mat_q8_K_4x8), which takes the positive extreme whenever
// +amax occurs in the block; the two differ only on a tie of +amax and -amax.
template <bool kPositiveWins>
void quantize_q8_k(const float* x, BlockQ8_K* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    float max = signed_absmax(x, kQK_K);
    if (kPositiveWins) {
      for (int j = 0; j < kQK_K; ++j) {
        if (x[j] == std::fabs(max)) max = x[j];
      }
    }
    std::memset(&y[i], 0, sizeof(BlockQ8_K));
    if (max == 0.0f) continue;
    const float iscale = -127.f / max;
    for (int j = 0; j < kQK_K; ++j) {
      y[i].qs[j] = static_cast<int8_t>(std::min(127, nearest_int(iscale * x[j])));
    }
    for (int g = 0; g < kQK_K / 16; ++g) {
      int sum = 0;
      for (int j = 0; j < 16; ++j) sum += y[i].qs[16 * g + j];
      y[i].bsums[g] = static_cast<int16_t>(sum);
    }
    y[i].d = 1 / iscale;
  }
}

// Element i of a legacy block as a small integer (before scale/offset).
int q4_value(const uint8_t* qs, int i) { return i < 16 ? (qs[i] & 0xf) : (qs[i - 16] >> 4); }
int q5_value(const uint8_t* qs, const uint8_t* qh, int i) {
  uint32_t h;
  std::memcpy(&h, qh, 4);
  return q4_value(qs, i) | static_cast<int>(((h >> i) & 1) << 4);
}

// ---- K-quants --------------------------------------------------------------
// Every K-quant block is unpacked into the same shape: integer quants, one
// integer scale (and min) per group of 16 or 32, and the two f16 super-scales.
// dequant: x = (d*scale[g]) * q - (dmin*min[g]);  dot: d*Σ scale*Σq*q8 - dmin*Σ min*Σq8.
struct KUnpacked {
  int8_t q[kQK_K];
  int scale[16];
  int min[16];
  int groups;  // 16 (groups of 16) or 8 (groups of 32)
  float d, dmin;
};

// Scale j and min j (6 bits each) of Q4_K/Q5_K's 12-byte packed scales.
void k4_scale_min(const uint8_t* s, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

void unpack(const BlockQ2_K& b, KUnpacked& u) {
  u.groups = 16;
  u.d = fp16(b.d);
  u.dmin = fp16(b.dmin);
  for (int g = 0; g < 16; ++g) u.scale[g] = b.scales[g] & 0xf, u.min[g] = b.scales[g] >> 4;
  for (int e = 0; e < kQK_K; ++e) {
    u.q[e] = static_cast<int8_t>((b.qs[(e / 128) * 32 + e % 32] >> (2 * ((e % 128) / 32))) & 3);
  }
}

void unpack(const BlockQ3_K& b, KUnpacked& u) {
  u.groups = 16;
  u.d = fp16(b.d);
  u.dmin = 0.0f;
  for (int g = 0; g < 16; ++g) {
    const int lo = (g < 8 ? b.scales[g] : b.scales[g - 8] >> 4) & 0xf;
    const int hi = (b.scales[8 + g % 4] >> (2 * (g / 4))) & 3;
    u.scale[g] = (lo | (hi << 4)) - 32;
    u.min[g] = 0;
  }
  for (int e = 0; e < kQK_K; ++e) {
    const int low = (b.qs[(e / 128) * 32 + e % 32] >> (2 * ((e % 128) / 32))) & 3;
    const bool high = (b.hmask[e % 32] >> (e / 32)) & 1;
    u.q[e] = static_cast<int8_t>(low - (high ? 0 : 4));
  }
}

void unpack(const BlockQ4_K& b, KUnpacked& u) {
  u.groups = 8;
  u.d = fp16(b.d);
  u.dmin = fp16(b.dmin);
  for (int g = 0; g < 8; ++g) k4_scale_min(b.scales, g, &u.scale[g], &u.min[g]);
  for (int e = 0; e < kQK_K; ++e) {
    const uint8_t byte = b.qs[(e / 64) * 32 + e % 32];
    u.q[e] = static_cast<int8_t>((e % 64) < 32 ? (byte & 0xf) : (byte >> 4));
  }
}

void unpack(const BlockQ5_K& b, KUnpacked& u) {
  u.groups = 8;
  u.d = fp16(b.d);
  u.dmin = fp16(b.dmin);
  for (int g = 0; g < 8; ++g) k4_scale_min(b.scales, g, &u.scale[g], &u.min[g]);
  for (int e = 0; e < kQK_K; ++e) {
    const uint8_t byte = b.qs[(e / 64) * 32 + e % 32];
    const int low = (e % 64) < 32 ? (byte & 0xf) : (byte >> 4);
    const int high = (b.qh[e % 32] >> (e / 32)) & 1;
    u.q[e] = static_cast<int8_t>(low | (high << 4));
  }
}

void unpack(const BlockQ6_K& b, KUnpacked& u) {
  u.groups = 16;
  u.d = fp16(b.d);
  u.dmin = 0.0f;
  for (int g = 0; g < 16; ++g) u.scale[g] = b.scales[g], u.min[g] = 0;
  for (int e = 0; e < kQK_K; ++e) {
    const int half = e / 128, quarter = (e % 128) / 32, l = e % 32;
    const uint8_t lbyte = b.ql[half * 64 + l + (quarter & 1) * 32];
    const int low = quarter < 2 ? (lbyte & 0xf) : (lbyte >> 4);
    const int high = (b.qh[half * 32 + l] >> (2 * quarter)) & 3;
    u.q[e] = static_cast<int8_t>((low | (high << 4)) - 32);
  }
}

template <class Block>
void dequantize_k(const void* src, float* y, int64_t n) {
  const Block* x = static_cast<const Block*>(src);
  KUnpacked u;
  for (int64_t i = 0; i < n / kQK_K; ++i, y += kQK_K) {
    unpack(x[i], u);
    const int gsize = kQK_K / u.groups;
    for (int e = 0; e < kQK_K; ++e) {
      const int g = e / gsize;
      const float dl = u.d * static_cast<float>(u.scale[g]);
      const float ml = u.dmin * static_cast<float>(u.min[g]);
      y[e] = dl * u.q[e] - ml;
    }
  }
}

// Q6_K . Q8_K in the order of GGML's AVX2 ggml_vec_dot_q6_K_q8_K (what
// llama.cpp runs for steps of fewer than 8 tokens): eight int32 lanes, lane L
// holding elements 4L..4L+3 of each 32-element run times that run's sub-block
// scale, less 32 * (bsum[2L]*sc[2L] + bsum[2L+1]*sc[2L+1]) for the stored
// quants' bias; then per super-block lane += float(lane) * (dy * d), by fma,
// summed as hsum8 at the end.
float vec_dot_q6_k_lanes(int64_t n, const void* va, const void* vb) {
  const BlockQ6_K* x = static_cast<const BlockQ6_K*>(va);
  const BlockQ8_K* y = static_cast<const BlockQ8_K*>(vb);
  KUnpacked u;
  float acc[8] = {};
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    unpack(x[i], u);
    const float d = y[i].d * u.d;
    for (int L = 0; L < 8; ++L) {
      int32_t lane = 0;
      for (int k = 0; k < 8; ++k) {
        int32_t dot = 0;
        for (int e = 32 * k + 4 * L; e < 32 * k + 4 * L + 4; ++e) dot += (u.q[e] + 32) * y[i].qs[e];
        lane += u.scale[2 * k + (L >= 4)] * dot;
      }
      lane -= 32 * (y[i].bsums[2 * L] * u.scale[2 * L] + y[i].bsums[2 * L + 1] * u.scale[2 * L + 1]);
      acc[L] = std::fma(static_cast<float>(lane), d, acc[L]);
    }
  }
  return hsum8(acc);
}

// Q2_K..Q5_K . Q8_K in the orders of GGML's AVX2 ggml_vec_dot_q{2,3,4,5}_K_q8_K
// (what llama.cpp runs on these weights outside the repack buffer for steps of
// fewer than 8 tokens). All keep eight int32 lanes per super-block, lane L
// holding elements 4L..4L+3 of each 32-element run times that element's
// sub-block scale (true signed quants: the integers are exact), and
// acc[L] = fma(dy * d, float(lane), acc[L]). They differ in where the mins go
// (dmin' = -dy * dmin, as GGML negates it):
//   Q2_K  first, per lane: acc[L] = fma(dmin', float(min[2L] * bsum[2L] +
//         min[2L+1] * bsum[2L+1]), acc[L]); result hsum8(acc)
//   Q3_K  none; result hsum8(acc)
//   Q4_K  four lanes of their own: m[k] = fma(dmin', float(min[2k] * S[2k] +
//         min[2k+1] * S[2k+1]), m[k]), S[j] the activation sum of 32-run j;
//         result hsum8(acc) + ((m0 + m2) + (m1 + m3))
//   Q5_K  one float: s = fma(dmin', float(sum_j min[j] * S[j]), s) (GCC fuses
//         GGML's `summs += dmin * msum`); result hsum8(acc) + s
template <class Block>
float vec_dot_k_lanes(int64_t n, const void* va, const void* vb) {
  const Block* x = static_cast<const Block*>(va);
  const BlockQ8_K* y = static_cast<const BlockQ8_K*>(vb);
  constexpr bool kQ2 = std::is_same_v<Block, BlockQ2_K>, kQ4 = std::is_same_v<Block, BlockQ4_K>;
  constexpr bool kQ5 = std::is_same_v<Block, BlockQ5_K>;
  KUnpacked u;
  float acc[8] = {}, accm[4] = {}, summs = 0.0f;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    unpack(x[i], u);
    const int gsize = kQK_K / u.groups;
    const float d = y[i].d * u.d, dmin = -y[i].d * u.dmin;
    int32_t S[8];  // activation sums per 32-run
    for (int j = 0; j < 8; ++j) S[j] = y[i].bsums[2 * j] + y[i].bsums[2 * j + 1];
    if constexpr (kQ2) {
      for (int L = 0; L < 8; ++L) {
        const int32_t m = u.min[2 * L] * y[i].bsums[2 * L] + u.min[2 * L + 1] * y[i].bsums[2 * L + 1];
        acc[L] = std::fma(dmin, static_cast<float>(m), acc[L]);
      }
    } else if constexpr (kQ4) {
      for (int k = 0; k < 4; ++k) {
        const int32_t m = u.min[2 * k] * S[2 * k] + u.min[2 * k + 1] * S[2 * k + 1];
        accm[k] = std::fma(dmin, static_cast<float>(m), accm[k]);
      }
    } else if constexpr (kQ5) {
      int32_t m = 0;
      for (int j = 0; j < 8; ++j) m += u.min[j] * S[j];
      summs = std::fma(dmin, static_cast<float>(m), summs);
    }
    for (int L = 0; L < 8; ++L) {
      int32_t lane = 0;
      for (int k = 0; k < 8; ++k) {
        const int e0 = 32 * k + 4 * L;
        int32_t dot = 0;
        for (int e = e0; e < e0 + 4; ++e) dot += u.q[e] * y[i].qs[e];
        lane += u.scale[e0 / gsize] * dot;
      }
      acc[L] = std::fma(d, static_cast<float>(lane), acc[L]);
    }
  }
  if constexpr (kQ4) return hsum8(acc) + ((accm[0] + accm[2]) + (accm[1] + accm[3]));
  if constexpr (kQ5) return hsum8(acc) + summs;
  return hsum8(acc);
}

// Integer sums of one K-quant super-block against Q8_K: sum of scale * dot per
// sub-block (true signed quants) and sum of min * activation sum per sub-block.
void k_block_sums(const KUnpacked& u, const BlockQ8_K& y, int32_t* isum, int32_t* msum) {
  const int gsize = kQK_K / u.groups;
  *isum = 0;
  *msum = 0;
  for (int g = 0; g < u.groups; ++g) {
    int32_t dot = 0, q8sum = 0;
    for (int e = g * gsize; e < (g + 1) * gsize; ++e) dot += u.q[e] * y.qs[e];
    for (int s = g * gsize / 16; s < (g + 1) * gsize / 16; ++s) q8sum += y.bsums[s];
    *isum += u.scale[g] * dot;
    *msum += u.min[g] * q8sum;
  }
}

// The order of GGML's tiled K-quant matmul (ggml-cpu/tiled, which llama.cpp
// runs on Q2_K..Q6_K weights outside the repack buffer for steps of 8 tokens or
// more): per super-block r = d * float(isum), less dmin * float(msum) by one
// fma for the formats with mins, then acc = fma(r, dy, acc).
template <class Block, bool kHasMin>
float dot_k_tiled(int64_t n, const void* va, const void* vb) {
  const Block* x = static_cast<const Block*>(va);
  const BlockQ8_K* y = static_cast<const BlockQ8_K*>(vb);
  KUnpacked u;
  float acc = 0.0f;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    unpack(x[i], u);
    int32_t isum, msum;
    k_block_sums(u, y[i], &isum, &msum);
    float r = u.d * static_cast<float>(isum);
    if (kHasMin) r = std::fma(-u.dmin, static_cast<float>(msum), r);
    acc = std::fma(r, y[i].d, acc);
  }
  return acc;
}

// The order of GGML's repacked Q4_K kernels (ggml_gemv/gemm_q4_K_8x8_q8_K,
// AVX2; same per (row, token) in both): two accumulators per super-block,
// a = fma(float(isum), d * dy, a) and m = fma(float(msum), dmin * dy, m);
// the result is a - m.
float dot_q4_k_x8(int64_t n, const void* va, const void* vb) {
  const BlockQ4_K* x = static_cast<const BlockQ4_K*>(va);
  const BlockQ8_K* y = static_cast<const BlockQ8_K*>(vb);
  KUnpacked u;
  float a = 0.0f, m = 0.0f;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    unpack(x[i], u);
    int32_t isum, msum;
    k_block_sums(u, y[i], &isum, &msum);
    a = std::fma(static_cast<float>(isum), u.d * y[i].d, a);
    m = std::fma(static_cast<float>(msum), u.dmin * y[i].d, m);
  }
  return a - m;
}

// GGML's repacked Q4_K GEMM (ggml_gemm_q4_K_8x8_q8_K, AVX2), which llama.cpp
// runs on a step's first n - n % 4 tokens: the same as dot_q4_k_x8 but with
// the fma per 64 elements (two sub-blocks) instead of per super-block.
float dot_q4_k_x8_gemm(int64_t n, const void* va, const void* vb) {
  const BlockQ4_K* x = static_cast<const BlockQ4_K*>(va);
  const BlockQ8_K* y = static_cast<const BlockQ8_K*>(vb);
  KUnpacked u;
  float a = 0.0f, m = 0.0f;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    unpack(x[i], u);
    for (int g = 0; g < 8; g += 2) {
      int32_t isum = 0, msum = 0;
      for (int h = g; h < g + 2; ++h) {
        int32_t dot = 0;
        for (int e = 32 * h; e < 32 * h + 32; ++e) dot += u.q[e] * y[i].qs[e];
        isum += u.scale[h] * dot;
        msum += u.min[h] * (y[i].bsums[2 * h] + y[i].bsums[2 * h + 1]);
      }
      a = std::fma(static_cast<float>(isum), u.d * y[i].d, a);
      m = std::fma(static_cast<float>(msum), u.dmin * y[i].d, m);
    }
  }
  return a - m;
}

// A tile of pairs by a per-pair dot product.
template <float (*Dot)(int64_t, const void*, const void*)>
void tile_by_pairs(int64_t n, const void* a, size_t as, int nr, const void* b, size_t bs, int nt, float* out,
                   size_t ors, size_t ots) {
  for (int r = 0; r < nr; ++r) {
    for (int t = 0; t < nt; ++t) {
      out[r * ors + t * ots] = Dot(n, static_cast<const uint8_t*>(a) + r * as, static_cast<const uint8_t*>(b) + t * bs);
    }
  }
}

// Simple round-to-nearest K-quant quantizers (for tests: valid blocks, not
// GGML's error-minimizing search).

// Quantizes positive sub-block scales to `bits` bits under one f16 super-scale.
// Returns the super-scale; q[g] receives the small integers.
float quantize_scales(const float* s, int count, int maxq, int* q) {
  float smax = 0.0f;
  for (int g = 0; g < count; ++g) smax = std::max(smax, s[g]);
  const float d = fp16(f32_to_f16(smax / maxq));
  for (int g = 0; g < count; ++g) q[g] = d > 0.0f ? clampi(nearest_int(s[g] / d), 0, maxq) : 0;
  return d;
}

void pack_k4_scales(const int* sc, const int* m, uint8_t* s) {
  for (int j = 0; j < 4; ++j) {
    s[j] = static_cast<uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    s[j + 4] = static_cast<uint8_t>((m[j] & 63) | ((m[j + 4] >> 4) << 6));
    s[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0xf) | ((m[j + 4] & 0xf) << 4));
  }
}

// Asymmetric (scale + min) quantization in groups; fills ints q in [0, maxq].
void quantize_groups_asym(const float* x, int groups, int gsize, int maxq, int maxs,
                          float* d_out, float* dmin_out, int* sc, int* mn, uint8_t* q) {
  float scale[16], minv[16];
  for (int g = 0; g < groups; ++g) {
    float lo = 0.0f, hi = 0.0f;  // the min is clamped to <= 0, as in GGML
    for (int e = 0; e < gsize; ++e) lo = std::min(lo, x[g * gsize + e]), hi = std::max(hi, x[g * gsize + e]);
    scale[g] = (hi - lo) / maxq;
    minv[g] = -lo;
  }
  const float d = quantize_scales(scale, groups, maxs, sc);
  const float dmin = quantize_scales(minv, groups, maxs, mn);
  for (int g = 0; g < groups; ++g) {
    const float dl = d * sc[g], ml = dmin * mn[g];
    for (int e = 0; e < gsize; ++e) {
      const int v = dl > 0.0f ? nearest_int((x[g * gsize + e] + ml) / dl) : 0;
      q[g * gsize + e] = static_cast<uint8_t>(clampi(v, 0, maxq));
    }
  }
  *d_out = d;
  *dmin_out = dmin;
}

// Symmetric quantization in groups of 16 with signed per-group scales in
// [-maxs, maxs]; fills ints q in [-qneg, qneg-1].
float quantize_groups_sym(const float* x, int qneg, int maxs, int* sc, int* q) {
  float scale[16];
  float smax = 0.0f;
  for (int g = 0; g < 16; ++g) {
    float amax = 0.0f;
    for (int e = 0; e < 16; ++e) amax = std::max(amax, std::fabs(x[g * 16 + e]));
    scale[g] = amax / (qneg - 1);
    smax = std::max(smax, scale[g]);
  }
  const float d = fp16(f32_to_f16(smax / maxs));
  for (int g = 0; g < 16; ++g) {
    sc[g] = d > 0.0f ? clampi(nearest_int(scale[g] / d), 0, maxs) : 0;
    const float dl = d * sc[g];
    for (int e = 0; e < 16; ++e) {
      const int v = dl > 0.0f ? nearest_int(x[g * 16 + e] / dl) : 0;
      q[g * 16 + e] = clampi(v, -qneg, qneg - 1);
    }
  }
  return d;
}

void quantize_q2_k(const float* x, BlockQ2_K* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    float d, dmin;
    int sc[16], mn[16];
    uint8_t q[kQK_K];
    quantize_groups_asym(x, 16, 16, 3, 15, &d, &dmin, sc, mn, q);
    BlockQ2_K& b = y[i];
    std::memset(&b, 0, sizeof b);
    b.d = f32_to_f16(d);
    b.dmin = f32_to_f16(dmin);
    for (int g = 0; g < 16; ++g) b.scales[g] = static_cast<uint8_t>(sc[g] | (mn[g] << 4));
    for (int e = 0; e < kQK_K; ++e) b.qs[(e / 128) * 32 + e % 32] |= q[e] << (2 * ((e % 128) / 32));
  }
}

void quantize_q3_k(const float* x, BlockQ3_K* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    int sc[16], q[kQK_K];
    // Scales are stored biased by 32 in 6 bits; we only use the positive half.
    const float d = quantize_groups_sym(x, 4, 31, sc, q);
    BlockQ3_K& b = y[i];
    std::memset(&b, 0, sizeof b);
    b.d = f32_to_f16(d);
    for (int g = 0; g < 16; ++g) {
      const int v = sc[g] + 32;
      if (g < 8) b.scales[g] |= v & 0xf;
      else b.scales[g - 8] |= (v & 0xf) << 4;
      b.scales[8 + g % 4] |= ((v >> 4) & 3) << (2 * (g / 4));
    }
    for (int e = 0; e < kQK_K; ++e) {
      const int v = q[e] + 4;  // 0..7: low 2 bits + "no offset" bit
      b.qs[(e / 128) * 32 + e % 32] |= (v & 3) << (2 * ((e % 128) / 32));
      if (v & 4) b.hmask[e % 32] |= 1 << (e / 32);
    }
  }
}

void quantize_q4_k(const float* x, BlockQ4_K* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    float d, dmin;
    int sc[8], mn[8];
    uint8_t q[kQK_K];
    quantize_groups_asym(x, 8, 32, 15, 63, &d, &dmin, sc, mn, q);
    BlockQ4_K& b = y[i];
    b.d = f32_to_f16(d);
    b.dmin = f32_to_f16(dmin);
    pack_k4_scales(sc, mn, b.scales);
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) b.qs[c * 32 + l] = q[c * 64 + l] | (q[c * 64 + 32 + l] << 4);
    }
  }
}

void quantize_q5_k(const float* x, BlockQ5_K* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    float d, dmin;
    int sc[8], mn[8];
    uint8_t q[kQK_K];
    quantize_groups_asym(x, 8, 32, 31, 63, &d, &dmin, sc, mn, q);
    BlockQ5_K& b = y[i];
    std::memset(&b, 0, sizeof b);
    b.d = f32_to_f16(d);
    b.dmin = f32_to_f16(dmin);
    pack_k4_scales(sc, mn, b.scales);
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        b.qs[c * 32 + l] = (q[c * 64 + l] & 0xf) | ((q[c * 64 + 32 + l] & 0xf) << 4);
      }
    }
    for (int e = 0; e < kQK_K; ++e) b.qh[e % 32] |= ((q[e] >> 4) & 1) << (e / 32);
  }
}

void quantize_q6_k(const float* x, BlockQ6_K* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    int sc[16], q[kQK_K];
    const float d = quantize_groups_sym(x, 32, 127, sc, q);
    BlockQ6_K& b = y[i];
    std::memset(&b, 0, sizeof b);
    b.d = f32_to_f16(d);
    for (int g = 0; g < 16; ++g) b.scales[g] = static_cast<int8_t>(sc[g]);
    for (int e = 0; e < kQK_K; ++e) {
      const int v = q[e] + 32;
      const int half = e / 128, quarter = (e % 128) / 32, l = e % 32;
      b.ql[half * 64 + l + (quarter & 1) * 32] |= (v & 0xf) << (quarter < 2 ? 0 : 4);
      b.qh[half * 32 + l] |= (v >> 4) << (2 * quarter);
    }
  }
}

// ---- dot products of the legacy formats -------------------------------------

// Q4_0/Q5_0/Q8_0 . Q8_0 in GGML's order (AVX2 ggml_vec_dot_*_q8_0 and
// llamafile's tinyBLAS_Q0_AVX, which llama.cpp runs for steps of one token and
// of several; both the same per pair): eight float lanes, lane j holding the
// integer dot of elements 4j..4j+3 of each block, lane += float(dot) * (dx*dy)
// by fma, block after block, summed as hsum8 at the end.
template <class Block, int (*Value)(const Block&, int)>
float vec_dot_symmetric_lanes(int64_t n, const void* va, const void* vb) {
  const Block* x = static_cast<const Block*>(va);
  const BlockQ8_0* y = static_cast<const BlockQ8_0*>(vb);
  float acc[8] = {};
  for (int64_t i = 0; i < n / kQK; ++i) {
    const float d = fp16(x[i].d) * fp16(y[i].d);
    for (int j = 0; j < 8; ++j) {
      int32_t dot = 0;
      for (int e = 4 * j; e < 4 * j + 4; ++e) dot += Value(x[i], e) * y[i].qs[e];
      acc[j] = std::fma(static_cast<float>(dot), d, acc[j]);
    }
  }
  return hsum8(acc);
}
int value_q4_0(const BlockQ4_0& b, int e) { return q4_value(b.qs, e) - 8; }
int value_q5_0(const BlockQ5_0& b, int e) { return q5_value(b.qs, b.qh, e) - 16; }
int value_q8_0(const BlockQ8_0& b, int e) { return b.qs[e]; }
float vec_dot_q4_0(int64_t n, const void* va, const void* vb) {
  return vec_dot_symmetric_lanes<BlockQ4_0, value_q4_0>(n, va, vb);
}
float vec_dot_q5_0(int64_t n, const void* va, const void* vb) {
  return vec_dot_symmetric_lanes<BlockQ5_0, value_q5_0>(n, va, vb);
}

// Q4_0 . Q8_0 in the order of GGML's repacked Q4_0 kernels (AVX2
// ggml_gemv_q4_0_8x8_q8_0 and ggml_gemm_q4_0_8x8_q8_0, which llama.cpp runs on
// weights of rows % 8 == 0 for every step size; the same per pair in both):
// no lanes, one float chain per (row, token), acc = fma(float(isum), dx * dy,
// acc) block after block, isum the block's exact integer dot. The gemm's
// activations (ggml_quantize_mat_q8_0_4x8) are quantize_row_q8_0's bytes
// interleaved, so the quants and scales are those of the Q8_0 rows.
float dot_q4_0_x8(int64_t n, const void* va, const void* vb) {
  const BlockQ4_0* x = static_cast<const BlockQ4_0*>(va);
  const BlockQ8_0* y = static_cast<const BlockQ8_0*>(vb);
  float acc = 0.0f;
  for (int64_t i = 0; i < n / kQK; ++i) {
    int32_t isum = 0;
    for (int e = 0; e < kQK; ++e) isum += value_q4_0(x[i], e) * y[i].qs[e];
    acc = std::fma(static_cast<float>(isum), fp16(x[i].d) * fp16(y[i].d), acc);
  }
  return acc;
}

// MXFP4 . Q8_0. The scale of a block is GGML's d = fp16(dy) * 2^(e - 128)
// (a power of two times dy: exact unless it leaves float's range). Its value
// e of element e of a block is kMxfp4Values[nibble].
int value_mxfp4(const BlockMXFP4& b, int e) { return kMxfp4Values[q4_value(b.qs, e)]; }
int32_t isum_mxfp4(const BlockMXFP4& x, const BlockQ8_0& y, int e0, int e1) {
  int32_t dot = 0;
  for (int e = e0; e < e1; ++e) dot += value_mxfp4(x, e) * y.qs[e];
  return dot;
}
// In the order of AVX2 ggml_vec_dot_mxfp4_q8_0 (llama.cpp's kernel for MXFP4
// weights outside the repack buffer, rows % 8 != 0, at every step size:
// tinyBLAS takes no MXFP4; the AVX-512 build runs the same code): blocks in
// pairs, two sets of eight float lanes, the even blocks' and the odd ones',
// lane j holding the integer dot of elements 4j..4j+3, lane = fma(d,
// float(dot), lane); the sets added lane by lane and summed as hsum8; an odd
// last block then by one fma (GCC fuses `sumf += d * (sumi1 + sumi2)`).
float vec_dot_mxfp4(int64_t n, const void* va, const void* vb) {
  const BlockMXFP4* x = static_cast<const BlockMXFP4*>(va);
  const BlockQ8_0* y = static_cast<const BlockQ8_0*>(vb);
  const int64_t nb = n / kQK;
  float acc[2][8] = {};
  int64_t i = 0;
  for (; i < nb - nb % 2; ++i) {  // whole pairs
    const float d = fp16(y[i].d) * e8m0_to_f32_half(x[i].e);
    for (int j = 0; j < 8; ++j) {
      acc[i % 2][j] = std::fma(d, static_cast<float>(isum_mxfp4(x[i], y[i], 4 * j, 4 * j + 4)), acc[i % 2][j]);
    }
  }
  float lanes[8];
  for (int j = 0; j < 8; ++j) lanes[j] = acc[0][j] + acc[1][j];
  float sum = hsum8(lanes);
  if (i < nb) {
    const float d = fp16(y[i].d) * e8m0_to_f32_half(x[i].e);
    sum = std::fma(d, static_cast<float>(isum_mxfp4(x[i], y[i], 0, kQK)), sum);
  }
  return sum;
}
// In the order of GGML's repacked MXFP4 kernels (ggml_gemv_mxfp4_8x8_q8_0 and
// ggml_gemm_mxfp4_8x8_q8_0, AVX2 and AVX-512 alike, which llama.cpp runs on
// weights of rows % 8 == 0 for every step size, and one token at a time in
// mul_mat_id): Q4_0's repacked order with the E8M0 scale,
// acc = fma(float(isum), 2^(e - 128) * dy, acc) block after block.
float dot_mxfp4_x8(int64_t n, const void* va, const void* vb) {
  const BlockMXFP4* x = static_cast<const BlockMXFP4*>(va);
  const BlockQ8_0* y = static_cast<const BlockQ8_0*>(vb);
  float acc = 0.0f;
  for (int64_t i = 0; i < n / kQK; ++i) {
    acc = std::fma(static_cast<float>(isum_mxfp4(x[i], y[i], 0, kQK)), e8m0_to_f32_half(x[i].e) * fp16(y[i].d), acc);
  }
  return acc;
}

float vec_dot_q4_1(int64_t n, const void* va, const void* vb) {
  const BlockQ4_1* x = static_cast<const BlockQ4_1*>(va);
  const BlockQ8_1* y = static_cast<const BlockQ8_1*>(vb);
  float sumf = 0.0f;
  for (int64_t i = 0; i < n / kQK; ++i) {
    int sumi = 0;
    for (int j = 0; j < kQK; ++j) sumi += q4_value(x[i].qs, j) * y[i].qs[j];
    sumf += (fp16(x[i].d) * fp16(y[i].d)) * static_cast<float>(sumi) + fp16(x[i].m) * fp16(y[i].s);
  }
  return sumf;
}

// Q5_1 . Q8_1 in GGML's order (AVX2 ggml_vec_dot_q5_1_q8_1, which llama.cpp
// runs for every step: tinyBLAS takes no Q5_1): eight float lanes, lane j
// holding the integer dot of elements 4j..4j+3 of each block,
// lane += float(dot) * (dx * dy) by fma, and the offsets in one float,
// s = fma(m, s_y, s) (GCC fuses GGML's `summs += m * s`); hsum8(lanes) + s.
float vec_dot_q5_1(int64_t n, const void* va, const void* vb) {
  const BlockQ5_1* x = static_cast<const BlockQ5_1*>(va);
  const BlockQ8_1* y = static_cast<const BlockQ8_1*>(vb);
  float acc[8] = {}, summs = 0.0f;
  for (int64_t i = 0; i < n / kQK; ++i) {
    summs = std::fma(fp16(x[i].m), fp16(y[i].s), summs);
    const float d = fp16(x[i].d) * fp16(y[i].d);
    for (int j = 0; j < 8; ++j) {
      int32_t dot = 0;
      for (int e = 4 * j; e < 4 * j + 4; ++e) dot += q5_value(x[i].qs, x[i].qh, e) * y[i].qs[e];
      acc[j] = std::fma(static_cast<float>(dot), d, acc[j]);
    }
  }
  return hsum8(acc) + summs;
}

float vec_dot_q8_0(int64_t n, const void* va, const void* vb) {
  return vec_dot_symmetric_lanes<BlockQ8_0, value_q8_0>(n, va, vb);
}

// Float dot products in the orders of GGML's AVX2 build (the activations
// already in the weight's type, as GGML converts them first).
//
// ggml_vec_dot_f32 / _f16 (one-token steps, and every step when tinyBLAS
// declines): four accumulators of 8 lanes over 32-element steps, acc[j] =
// fma(x, y, acc[j]) for elements 32i + 8j + lane; folded (0+2) + (1+3), the
// lanes summed as GGML_F32x8_REDUCE ends (t[l] = v[l] + v[l+4], then
// (t0+t1) + (t2+t3)); elements past the last whole step follow, for F32 as
// s += x * y in float, the product rounded (not fused: GGML's build does not
// contract it; this file is compiled without FMA), for F16 in double.
// ggml_vec_dot_bf16: the same four accumulators (GCC fuses its mul + add),
// folded the same way but summed as hsum8, then the rest in double.
template <class T, float (*Load)(T), bool kHsum8, bool kTailDouble>
float vec_dot_float_lanes(int64_t n, const void* va, const void* vb) {
  const T* a = static_cast<const T*>(va);
  const T* b = static_cast<const T*>(vb);
  float acc[4][8] = {};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int j = 0; j < 4; ++j) {
      for (int l = 0; l < 8; ++l) acc[j][l] = std::fma(Load(a[i + 8 * j + l]), Load(b[i + 8 * j + l]), acc[j][l]);
    }
  }
  float v[8];
  for (int l = 0; l < 8; ++l) v[l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
  float sum;
  if (kHsum8) {
    sum = hsum8(v);
  } else {
    float t[4];
    for (int l = 0; l < 4; ++l) t[l] = v[l] + v[l + 4];
    sum = (t[0] + t[1]) + (t[2] + t[3]);
  }
  if (!kTailDouble) {
    for (; i < n; ++i) sum += Load(a[i]) * Load(b[i]);
    return sum;
  }
  double sumd = sum;
  for (; i < n; ++i) sumd += static_cast<double>(Load(a[i]) * Load(b[i]));
  return static_cast<float>(sumd);
}
float load_f32(float v) { return v; }
float load_f16(uint16_t v) { return f16_to_f32(v); }
float load_bf16(uint16_t v) { return bf16_to_f32(v); }
float vec_dot_f32(int64_t n, const void* va, const void* vb) {
  return vec_dot_float_lanes<float, load_f32, false, false>(n, va, vb);
}
float vec_dot_f16(int64_t n, const void* va, const void* vb) {
  return vec_dot_float_lanes<uint16_t, load_f16, false, true>(n, va, vb);
}
float vec_dot_bf16(int64_t n, const void* va, const void* vb) {
  return vec_dot_float_lanes<uint16_t, load_bf16, true, true>(n, va, vb);
}

// tinyBLAS on AVX2 (llamafile_sgemm, which llama.cpp runs on F32/F16/BF16
// weights for steps of two tokens or more when rows % 4 == 0 and n % 8 == 0):
// one accumulator of 8 lanes, acc = fma(a, b, acc) per 8 elements, hsum8.
template <class T, float (*Load)(T)>
float dot_tinyblas(int64_t n, const void* va, const void* vb) {
  const T* a = static_cast<const T*>(va);
  const T* b = static_cast<const T*>(vb);
  float acc[8] = {};
  for (int64_t i = 0; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) acc[l] = std::fma(Load(a[i + l]), Load(b[i + l]), acc[l]);
  }
  return hsum8(acc);
}

// ---- dequantizers of the legacy formats ---------------------------------------

void dequantize_q4_0(const void* src, float* y, int64_t n) {
  const BlockQ4_0* x = static_cast<const BlockQ4_0*>(src);
  for (int64_t i = 0; i < n / kQK; ++i, y += kQK) {
    const float d = fp16(x[i].d);
    for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(q4_value(x[i].qs, j) - 8) * d;
  }
}
void dequantize_mxfp4(const void* src, float* y, int64_t n) {
  const BlockMXFP4* x = static_cast<const BlockMXFP4*>(src);
  for (int64_t i = 0; i < n / kQK; ++i, y += kQK) {
    const float d = e8m0_to_f32_half(x[i].e);
    for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(value_mxfp4(x[i], j)) * d;
  }
}
void dequantize_q4_1(const void* src, float* y, int64_t n) {
  const BlockQ4_1* x = static_cast<const BlockQ4_1*>(src);
  for (int64_t i = 0; i < n / kQK; ++i, y += kQK) {
    const float d = fp16(x[i].d), m = fp16(x[i].m);
    for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(q4_value(x[i].qs, j)) * d + m;
  }
}
void dequantize_q5_0(const void* src, float* y, int64_t n) {
  const BlockQ5_0* x = static_cast<const BlockQ5_0*>(src);
  for (int64_t i = 0; i < n / kQK; ++i, y += kQK) {
    const float d = fp16(x[i].d);
    for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(q5_value(x[i].qs, x[i].qh, j) - 16) * d;
  }
}
void dequantize_q5_1(const void* src, float* y, int64_t n) {
  const BlockQ5_1* x = static_cast<const BlockQ5_1*>(src);
  for (int64_t i = 0; i < n / kQK; ++i, y += kQK) {
    const float d = fp16(x[i].d), m = fp16(x[i].m);
    for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(q5_value(x[i].qs, x[i].qh, j)) * d + m;
  }
}
void dequantize_q8_0(const void* src, float* y, int64_t n) {
  const BlockQ8_0* x = static_cast<const BlockQ8_0*>(src);
  for (int64_t i = 0; i < n / kQK; ++i, y += kQK) {
    const float d = fp16(x[i].d);
    for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(x[i].qs[j]) * d;
  }
}
void dequantize_q8_1(const void* src, float* y, int64_t n) {
  const BlockQ8_1* x = static_cast<const BlockQ8_1*>(src);
  for (int64_t i = 0; i < n / kQK; ++i, y += kQK) {
    const float d = fp16(x[i].d);
    for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(x[i].qs[j]) * d;
  }
}
void dequantize_q8_k(const void* src, float* y, int64_t n) {
  const BlockQ8_K* x = static_cast<const BlockQ8_K*>(src);
  for (int64_t i = 0; i < n / kQK_K; ++i, y += kQK_K) {
    for (int j = 0; j < kQK_K; ++j) y[j] = x[i].d * static_cast<float>(x[i].qs[j]);
  }
}
void dequantize_f32(const void* src, float* y, int64_t n) { std::memcpy(y, src, n * sizeof(float)); }
void dequantize_f16(const void* src, float* y, int64_t n) {
  const uint16_t* x = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) y[i] = f16_to_f32(x[i]);
}
void dequantize_bf16(const void* src, float* y, int64_t n) {
  const uint16_t* x = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_f32(x[i]);
}

template <class Block, void (*Quantize)(const float*, Block*, int64_t), int QK>
void quantize_as(const float* src, void* dst, int64_t n) {
  Quantize(src, static_cast<Block*>(dst), n / QK);
}
void quantize_f32(const float* src, void* dst, int64_t n) { std::memcpy(dst, src, n * sizeof(float)); }
void quantize_f16(const float* src, void* dst, int64_t n) {
  uint16_t* y = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) y[i] = f32_to_f16(src[i]);
}
void quantize_bf16(const float* src, void* dst, int64_t n) {
  uint16_t* y = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) y[i] = f32_to_bf16(src[i]);
}

// The scalar kernels of every type, indexed like the dispatch table.
TypeKernels scalar_kernels(DType t) {
  TypeKernels k;
  switch (t) {
    case DType::F32: k = {vec_dot_f32, nullptr, quantize_f32, dequantize_f32}; break;
    case DType::F16: k = {vec_dot_f16, nullptr, quantize_f16, dequantize_f16}; break;
    case DType::BF16: k = {vec_dot_bf16, nullptr, quantize_bf16, dequantize_bf16}; break;
    // A KV cache's type only: conversions, no dot product (not a weight type).
    case DType::F8_E4M3: k = {nullptr, nullptr, quantize_row_fp8_e4m3, dequantize_row_fp8_e4m3}; break;
    case DType::Q4_0:
      k = {vec_dot_q4_0, nullptr, quantize_as<BlockQ4_0, quantize_q4_0, kQK>, dequantize_q4_0};
      break;
    case DType::Q4_1:
      k = {vec_dot_q4_1, nullptr, quantize_as<BlockQ4_1, quantize_q4_1, kQK>, dequantize_q4_1};
      break;
    case DType::Q5_0:
      k = {vec_dot_q5_0, nullptr, quantize_as<BlockQ5_0, quantize_q5_0, kQK>, dequantize_q5_0};
      break;
    case DType::Q5_1:
      k = {vec_dot_q5_1, nullptr, quantize_as<BlockQ5_1, quantize_q5_1, kQK>, dequantize_q5_1};
      break;
    case DType::Q8_0:
      k = {vec_dot_q8_0, nullptr, quantize_as<BlockQ8_0, quantize_q8_0, kQK>, dequantize_q8_0};
      break;
    case DType::MXFP4:
      k = {vec_dot_mxfp4, nullptr, quantize_as<BlockMXFP4, quantize_mxfp4, kQK>, dequantize_mxfp4};
      break;
    case DType::Q8_1:
      k = {nullptr, nullptr, quantize_as<BlockQ8_1, quantize_q8_1, kQK>, dequantize_q8_1};
      break;
    case DType::Q2_K:
      k = {vec_dot_k_lanes<BlockQ2_K>, nullptr, quantize_as<BlockQ2_K, quantize_q2_k, kQK_K>,
           dequantize_k<BlockQ2_K>};
      break;
    case DType::Q3_K:
      k = {vec_dot_k_lanes<BlockQ3_K>, nullptr, quantize_as<BlockQ3_K, quantize_q3_k, kQK_K>,
           dequantize_k<BlockQ3_K>};
      break;
    case DType::Q4_K:
      k = {vec_dot_k_lanes<BlockQ4_K>, nullptr, quantize_as<BlockQ4_K, quantize_q4_k, kQK_K>,
           dequantize_k<BlockQ4_K>};
      break;
    case DType::Q5_K:
      k = {vec_dot_k_lanes<BlockQ5_K>, nullptr, quantize_as<BlockQ5_K, quantize_q5_k, kQK_K>,
           dequantize_k<BlockQ5_K>};
      break;
    case DType::Q6_K:
      k = {vec_dot_q6_k_lanes, nullptr, quantize_as<BlockQ6_K, quantize_q6_k, kQK_K>,
           dequantize_k<BlockQ6_K>};
      break;
    case DType::Q8_K:
      k = {nullptr, nullptr, quantize_as<BlockQ8_K, quantize_q8_k<false>, kQK_K>, dequantize_q8_k};
      break;
    default: break;  // a type no kernel runs (is_supported_weight_type)
  }
  return k;
}

}  // namespace

void dequantize_row(DType t, const void* src, float* dst, int64_t n) {
  scalar_kernels(t).dequantize_row(src, dst, n);
}
void quantize_row(DType t, const float* src, void* dst, int64_t n) {
  scalar_kernels(t).quantize_row(src, dst, n);
}
float vec_dot(DType t, int64_t n, const void* a, const void* b) {
  return scalar_kernels(t).vec_dot(n, a, b);
}
float repacked_q4k_dot(int64_t n, const void* a, const void* b, bool gemm) {
  return gemm ? dot_q4_k_x8_gemm(n, a, b) : dot_q4_k_x8(n, a, b);
}

}  // namespace ref

void fill_scalar_kernels(KernelTable& table) {
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q4_0, DType::Q4_1, DType::Q5_0,
                  DType::Q5_1, DType::Q8_0, DType::Q8_1, DType::Q2_K, DType::Q3_K, DType::Q4_K,
                  DType::Q5_K, DType::Q6_K, DType::Q8_K, DType::MXFP4, DType::F8_E4M3}) {
    table.type[static_cast<uint32_t>(t)] = ref::scalar_kernels(t);
  }
  auto at = [&](DType t) -> TypeKernels& { return table.type[static_cast<uint32_t>(t)]; };
  at(DType::Q2_K).tiled_tile = ref::tile_by_pairs<ref::dot_k_tiled<BlockQ2_K, true>>;
  at(DType::Q3_K).tiled_tile = ref::tile_by_pairs<ref::dot_k_tiled<BlockQ3_K, false>>;
  at(DType::Q4_K).tiled_tile = ref::tile_by_pairs<ref::dot_k_tiled<BlockQ4_K, true>>;
  at(DType::Q5_K).tiled_tile = ref::tile_by_pairs<ref::dot_k_tiled<BlockQ5_K, true>>;
  at(DType::Q6_K).tiled_tile = ref::tile_by_pairs<ref::dot_k_tiled<BlockQ6_K, false>>;
  at(DType::F32).tinyblas_tile = ref::tile_by_pairs<ref::dot_tinyblas<float, ref::load_f32>>;
  at(DType::F16).tinyblas_tile = ref::tile_by_pairs<ref::dot_tinyblas<uint16_t, ref::load_f16>>;
  at(DType::BF16).tinyblas_tile = ref::tile_by_pairs<ref::dot_tinyblas<uint16_t, ref::load_bf16>>;
  at(DType::Q4_K).repack_tile = ref::tile_by_pairs<ref::dot_q4_k_x8>;
  at(DType::Q4_K).repack_gemm_tile = ref::tile_by_pairs<ref::dot_q4_k_x8_gemm>;
  at(DType::Q4_0).repack_tile = ref::tile_by_pairs<ref::dot_q4_0_x8>;
  at(DType::Q4_0).repack_gemm_tile = ref::tile_by_pairs<ref::dot_q4_0_x8>;
  at(DType::MXFP4).repack_tile = ref::tile_by_pairs<ref::dot_mxfp4_x8>;
  at(DType::MXFP4).repack_gemm_tile = ref::tile_by_pairs<ref::dot_mxfp4_x8>;
  table.quantize_q8_k_x4 = ref::quantize_as<BlockQ8_K, ref::quantize_q8_k<true>, kQK_K>;
  table.quantize_q8_0_cpu = ref::quantize_as<BlockQ8_0, ref::quantize_q8_0_cpu, kQK>;
  table.level = "scalar";
}

}  // namespace inferd::kernels
