// Byte layouts of row-interleaved ("packed") weights and of the activations
// they are multiplied with (internal to kernels/cpu; plain data only, like
// quants_blocks.h, because the SIMD translation units include it).
//
// Why: a GGML row is one weight row after another, so a SIMD register holds 32
// weights of ONE row and every block needs a horizontal reduction. Packed,
// kPackRows = 16 rows are interleaved four quants at a time, so one 32-bit lane
// of a 512-bit register belongs to one row: a VNNI dpbusd then adds four
// products into each of 16 rows at once, with the activation's four bytes
// broadcast, and no reduction is ever needed. The bytes per row are those of
// the GGML format (same bytes read per decoded token).
//
// Group-block (16 rows x one 32-element block), in this order:
//   d[16]        f16 scales of the 16 rows (MXFP4: e[16], the rows' E8M0
//                exponents, one byte each)
//   m[16]        f16 offsets (Q4_1 only)
//   qh[16]       Q5_0 only: each row's 32 high bits as a 32-bit word, element
//                e's at bit 8 * (e % 4) + e / 4, so that one shift (left by
//                4 - e / 4, or right by e / 4 - 4) puts the high bits of lane
//                e / 4's four elements at bit 4 of their bytes (x86: the same
//                shift for 8 rows at once)
//   quants       Q4_0/Q4_1/Q5_0/MXFP4: 4 chunks j of 64 bytes; chunk j holds, for row r,
//                the row's qs[4j..4j+3] at bytes 4r..4r+3. Low nibbles are then
//                elements 4j..4j+3 of each row, high nibbles 16+4j..16+4j+3.
//                Q8_0: 8 chunks j of 64 bytes, row r's qs[4j..4j+3] (signed) at 4r.
// A packed matrix is its groups one after the other, each group's blocks in
// order; the last group is padded with zero rows.
//
// Activations (one row per token, rows `packed_act_row_bytes(cols)` apart):
//   int8 qs[cols] | float d[nb] | float s[nb] | int32 sum[nb]     (nb = cols / 32)
// with d and s the values of GGML's Q8_1 block (f16-rounded, as floats) and sum
// the sum of the block's quants (for the unsigned-bias corrections).
#pragma once
#include <cstddef>
#include <cstdint>

namespace inferd::kernels {

constexpr int kPackRows = 16;
constexpr int kMaxPackedTokens = 64;  // activation rows per kernel call, at most (see packed_tokens)

constexpr size_t kPackedQ4_0BlockBytes = 32 + 256;       // 16 x 18
constexpr size_t kPackedQ4_1BlockBytes = 32 + 32 + 256;  // 16 x 20
constexpr size_t kPackedQ5_0BlockBytes = 32 + 64 + 256;  // 16 x 22
constexpr size_t kPackedQ8_0BlockBytes = 32 + 512;       // 16 x 34
constexpr size_t kPackedMXFP4BlockBytes = 16 + 256;      // 16 x 17

}  // namespace inferd::kernels
