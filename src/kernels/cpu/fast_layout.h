// The fast tier's memory layouts (internal: fast_gemm.h is the interface).
//
// Weights, in groups of kFastRows rows. Every weight type the tier takes is an
// affine integer code per block of B columns (B = 32, or 16 where the format
// scales every 16): w[r][k] = scale[r][b] * u[r][k] + min[r][b], u in 0..255.
// A group holds, block after block:
//   the quants as B/4 vectors of 64 bytes, vector i holding columns 4i..4i+3
//     of the 16 rows (row r at bytes 4r..4r+3): the B operand of VNNI's
//     dpbusd for 16 rows at once, and a B tile of AMX's tdpbsud as it is;
//     for 4-bit codes (u < 16, `nibbles`) B/8 vectors whose low nibbles are
//     vector i and high nibbles vector i + B/8 of that layout; for 5- and
//     6-bit codes (Q5_0, Q5_1, Q5_K: `top_bits` 1; Q6_K: 2) those nibbles,
//     then B * top_bits / 32 vectors of the codes' top bits: byte L of vector
//     j holds, in bits n k .. n k + n - 1 (n = top_bits), those of byte L of
//     code vector (8 / n) j + k (the file's own 5 or 6 bits a value, as 4 + 1
//     or 4 + 2);
//   the 16 rows' scales, then their mins: float[16] each, or f16[16] where
//     every scale and min is an f16 of the file (`half_scales`: Q4_0, Q4_1,
//     Q5_0, Q5_1, Q8_0, so their blocks take the file's bytes); no mins where
//     every min is the scale times a constant of the format (`min_factor`:
//     Q4_0's -8, Q5_0's -16, Q8_0's -128, MXFP4's -12, Q3_K's -4, Q6_K's
//     -32): the kernels multiply it in, the float product the repacking would
//     have stored, so the bits are the same;
//   or, for the K-quants (`sub_scales`), the file's own small codes: an int8
//     scale code per row (then an int8 min code, negated, if mins are stored),
//     the scale being d * code with d the row's f16 factor of the super-block
//     (256 columns) holding the block, and the min dmin * code. Those factors
//     follow the group's blocks: per super-block f16 d[16], then dmin[16] if
//     mins are stored. d * code is exact in float (11 + 8 bits), so the
//     kernels' product is the float the repacking would have stored, and the
//     weights keep the file's size: Q4_K 4.6 bits a value, not 6.
// Rows past the matrix's end (the last group) are zero: scale 0, min 0.
//
// Activations, in one of two forms (FastActs):
//   per 32 columns (kBlocks32): per row, int8 quants q[cols] (per 32 columns
//     a scale d, d = amax/127, q = round(x/d)), d[cols/32], the block sums
//     times d that fold a stored min: dsum32[cols/32] and dsum16[cols/16],
//     and the quants' integer sums per 16 columns, bsum16[cols/16], that fold
//     a min the format gives as the scale times an integer (min_factor) into
//     the block's integer sum;
//   per super-block of 256 columns (kSuperBlocks, K-quant weights only): per
//     row, GGML's Q8_K blocks (one scale d, 256 quants, int16 sums of each 16),
//     the exact tier's own activations for K-quants. The product then sums a
//     whole super-block in integers, the file's scale codes multiplied into
//     the sub-blocks' integer sums (and the min codes into the quants' sums),
//     and ends it with one or two float steps, not two per block.
#pragma once
#include <cstddef>
#include <cstdint>

namespace inferd::kernels {

constexpr int kFastRows = 16;
constexpr int kFastActBlock = 32;
constexpr int kFastSuperBlock = 256;

enum class FastActs { kBlocks32, kSuperBlocks };

struct FastWeightsView {
  const uint8_t* data = nullptr;
  int64_t rows = 0, cols = 0;
  int block = 32;        // B: 16 or 32 columns per scale
  bool nibbles = false;  // 4-bit codes, two per byte (with top_bits: their low 4 bits)
  int top_bits = 0;      // 5- or 6-bit codes: the nibbles, then a plane of the top 1 or 2 bits
  int code_max = 255;    // the largest code the format gives (what bounds a kernel's int16 partial sums)
  bool half_scales = false;  // scales and mins as f16
  float min_factor = 0.0f;   // min = scale * min_factor, no mins stored (0: mins stored)
  bool sub_scales = false;   // int8 scale (and min) codes, times f16 factors per super-block
  // With sub_scales: the activations are Q8_K super-blocks (FastActs::kSuperBlocks).
  bool super_acts = false;
  int super_shift = 0;       // with sub_scales: block b is in super-block b >> super_shift (256 columns)
  size_t super_offset = 0;   // with sub_scales: where a group's factors start (after its blocks)
  size_t block_bytes = 0;  // one block of one group: quants, then the 16 scales and (stored) 16 mins
  size_t super_bytes = 0;  // with sub_scales: one super-block's f16 factors for the 16 rows
  size_t group_bytes = 0;  // the blocks, then (sub_scales) the super-blocks' factors
  int64_t blocks() const { return cols / block; }
  int64_t groups() const { return (rows + kFastRows - 1) / kFastRows; }
  // (Shifts, not a division by a runtime value: the kernels find every block's scales from these.)
  size_t nibble_bytes() const { return static_cast<size_t>(block) * kFastRows / 2; }
  size_t quant_bytes() const {
    const size_t codes = static_cast<size_t>(block) * kFastRows;  // a byte each
    return nibbles ? codes / 2 + codes * static_cast<size_t>(top_bits) / 8 : codes;
  }
  const uint8_t* block_at(int64_t g, int64_t b) const { return data + g * group_bytes + b * block_bytes; }
  // A block's 16 scales (at quant_bytes()), then its mins (at min_offset()), if stored.
  size_t scale_bytes() const { return sub_scales ? 1 : half_scales ? 2 : 4; }
  size_t min_offset() const { return quant_bytes() + kFastRows * scale_bytes(); }
  // With sub_scales: the factors of the super-block holding block b, d[16] then dmin[16].
  const uint8_t* super_at(int64_t g, int64_t b) const {
    return data + g * group_bytes + super_offset + (b >> super_shift) * super_bytes;
  }
};

struct FastActsView {
  const int8_t* q = nullptr;     // row t at q + t * cols
  const float* d = nullptr;      // row t at d + t * (cols / 32)
  const float* dsum32 = nullptr; // row t at dsum32 + t * (cols / 32)
  const float* dsum16 = nullptr; // row t at dsum16 + t * (cols / 16)
  // kSuperBlocks: row t's Q8_K blocks (quants.h's BlockQ8_K) at super + t * super_row_bytes.
  const uint8_t* super = nullptr;
  size_t super_row_bytes = 0;
  int64_t cols = 0;
  const int32_t* bsum16 = nullptr;  // row t at bsum16 + t * (cols / 16): sums of q over each 16 columns
};

// Rows [16 g0, 16 g1) of W times activation rows [t0, t0 + nt):
// y[i * y_stride + r] for the i-th token and row r (rows past W's end not
// written). Per (row, token), every level computes, block by block in column
// order, isum = sum of u * q (exact in int32), then, where mins are stored,
//   acc = fma(float(isum), scale * d, acc); acc = fma(min, dsum, acc)
// and where the min is scale * mf (min_factor, an integer), with bsum the
// block's sum of q (bsum16's, or the two of a 32-column block added),
//   acc = fma(float(isum + mf * bsum), scale * d, acc)
// (the min folded in integers: one float step a block, not two), from
// acc = 0: the same bits at every level, for every nt and tile. (|isum| stays
// under 2^21: Q8_0's 32 x 255 x 127 plus 128 x 32 x 127.)
// With super_acts, super-block by super-block in column order, in int32
// (exact: fast_gemm.cpp bounds it) over its blocks b
//   isum = sum of sc_b * (sum of u * q) [+ mf sc_b * bsum_b, mins as a factor]
//   msum = sum of m_b * bsum_b (stored min codes, negated)
// with bsum_b the quants' sum over block b, then
//   acc = fma(float(isum), dw * d, acc) [; acc = fma(float(msum), dminw * d, acc)]
// with dw and dminw the row's f16 factors and d the Q8_K block's scale.
// n_blocks 32-float blocks of x into the activation fields above: q (32 a
// block), d, dsum32 (one a block), dsum16 and bsum16 (two). d = amax / 127,
// q = x * (1 / d) rounded to nearest even; every level gives the same bits.
using FastQuantizeFn = void (*)(const float* x, int64_t n_blocks, int8_t* q, float* d, float* dsum32, float* dsum16,
                                int32_t* bsum16);

using FastGroupsFn = void (*)(const FastWeightsView& w, const FastActsView& a, int64_t t0, int64_t nt, int64_t g0,
                              int64_t g1, float* y, size_t y_stride);

}  // namespace inferd::kernels
