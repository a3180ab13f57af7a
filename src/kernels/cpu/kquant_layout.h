// Byte layout of Q4_K weights repacked eight rows at a time (internal to
// kernels/cpu; plain data only, like packed_layout.h, because the SIMD
// translation units include it). kquant_pack.h says when and why.
//
// A GGML Q4_K row is super-block after super-block (d, dmin, 12 bytes of
// 6-bit scales and mins, 128 bytes of nibbles), so a SIMD register holds 64
// quants of ONE row and every super-block ends in a horizontal sum. Repacked,
// the eight rows of a group share each super-block: one 32-bit lane of a
// 256-bit register belongs to one row, and GGML's per-(row, token) float steps
// run in the lanes with no horizontal sum. The bytes are the GGML rows' bytes,
// moved (same bytes read per decoded token).
//
// Group super-block (8 rows x 256 elements, 1152 bytes), in this order:
//   d[8], dmin[8]      f16, row r at index r
//   sc[3][8][4]        the rows' 12 scale bytes in three 32-byte parts: part p
//                      holds row r's scales[4p..4p+3] at bytes 4r..4r+3
//   qs[4][8][8][4]     nibbles: for chunk c (elements 64c..64c+63) and step s
//                      (0..7), row r's qs[32c+4s..32c+4s+3] at bytes 4r..4r+3
//                      of the 32-byte vector 8c+s: low nibbles are elements
//                      64c+4s..+3 (sub-block 2c), high nibbles 64c+32+4s..+3
//                      (sub-block 2c+1).
// A packed matrix is its groups one after the other, each group's super-blocks
// in order.
#pragma once
#include <cstddef>
#include <cstdint>

namespace inferd::kernels {

constexpr int kQ4KGroupRows = 8;
constexpr size_t kQ4KGroupBlockBytes = 8 * 144;
constexpr size_t kQ4KGroupScalesOffset = 32;
constexpr size_t kQ4KGroupQsOffset = 128;

}  // namespace inferd::kernels
