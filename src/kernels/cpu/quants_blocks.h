// Byte layouts of GGML's quantized blocks (internal to kernels/cpu).
//
// Every struct is exactly the on-disk layout of a GGUF tensor block, so a
// tensor's bytes can be reinterpreted as an array of these. f16 fields are kept
// as raw uint16_t bits. Only plain data here: this header is included by the
// SIMD translation units, which must not share inline code with the baseline
// build (the linker could keep the AVX-512 copy of an inline function).
#pragma once
#include <cstdint>

namespace inferd::kernels {

constexpr int kQK = 32;    // elements per block of the legacy formats
constexpr int kQK_K = 256; // elements per K-quant super-block

struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[kQK / 2];  // element j in the low nibble of qs[j], j+16 in the high
};
struct BlockQ4_1 {
  uint16_t d, m;  // x = d*q + m
  uint8_t qs[kQK / 2];
};
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];  // bit i = 5th bit of element i
  uint8_t qs[kQK / 2];
};
struct BlockQ5_1 {
  uint16_t d, m;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQK];
};
struct BlockQ8_1 {
  uint16_t d, s;  // s = d * sum(qs), used to fold Q4_1/Q5_1's offset m
  int8_t qs[kQK];
};
// MXFP4 (gpt-oss): x = kMxfp4Values[q] * 2^(e - 128), the E2M1 values doubled
// and the E8M0 scale halved, as GGML stores and multiplies them.
struct BlockMXFP4 {
  uint8_t e;            // E8M0 exponent
  uint8_t qs[kQK / 2];  // element j in the low nibble of qs[j], j+16 in the high
};
// GGML's kvalues_mxfp4: E2M1 code -> value times two.
constexpr int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// K-quants: super-blocks of 256 split into sub-blocks with their own small scales.
struct BlockQ2_K {
  uint8_t scales[kQK_K / 16];  // low nibble scale, high nibble min, per 16 elements
  uint8_t qs[kQK_K / 4];       // 2-bit quants
  uint16_t d, dmin;
};
struct BlockQ3_K {
  uint8_t hmask[kQK_K / 8];  // high bit of each 3-bit quant (set = no -4 offset)
  uint8_t qs[kQK_K / 4];     // low 2 bits
  uint8_t scales[12];        // 16 6-bit scales, biased by 32
  uint16_t d;
};
struct BlockQ4_K {
  uint16_t d, dmin;
  uint8_t scales[12];  // 8 6-bit scales + 8 6-bit mins, one pair per 32 elements
  uint8_t qs[kQK_K / 2];
};
struct BlockQ5_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qh[kQK_K / 8];
  uint8_t qs[kQK_K / 2];
};
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];  // low 4 bits
  uint8_t qh[kQK_K / 4];  // high 2 bits
  int8_t scales[kQK_K / 16];
  uint16_t d;
};
struct BlockQ8_K {
  float d;
  int8_t qs[kQK_K];
  int16_t bsums[kQK_K / 16];  // sum of each 16 quants, for the K-quants' mins
};

static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ8_1) == 36);
static_assert(sizeof(BlockMXFP4) == 17);
static_assert(sizeof(BlockQ2_K) == 84);
static_assert(sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockQ8_K) == 292);

}  // namespace inferd::kernels
