// The fast tier's BF16 product's memory layouts (internal: bf16_gemm.h is the
// interface).
//
// Weights, in groups of kBf16Rows rows: for each pair of columns (2p, 2p+1),
// 16 dwords, row r's dword holding w[r][2p] in its low half and w[r][2p+1] in
// its high half, both BF16. That is the B operand of AVX-512 BF16's dpbf16ps
// for the group's 16 rows at once. Rows past the matrix's end are zero.
//
// Activations: per row, the BF16 pairs of x as dwords (x[2p] low, x[2p+1]
// high), rounded to nearest even, denormals flushed to zero as the hardware's
// conversion does.
//
// Per (row, token) every level computes, pair by pair in column order from
// acc = 0: acc += a_hi * w_hi, then acc += a_lo * w_lo, each product exact in
// float (8-bit significands) and each sum rounded once: dpbf16ps's order.
#pragma once
#include <cstddef>
#include <cstdint>

namespace inferd::kernels {

constexpr int kBf16Rows = 16;
// Columns converted at a time: threads may share one token's row in such blocks.
constexpr int kBf16ActBlock = 32;

struct Bf16WeightsView {
  const uint32_t* data = nullptr;
  int64_t rows = 0, cols = 0;
  int64_t pairs() const { return cols / 2; }
  int64_t groups() const { return (rows + kBf16Rows - 1) / kBf16Rows; }
  const uint32_t* group(int64_t g) const { return data + g * pairs() * kBf16Rows; }
};

struct Bf16ActsView {
  const uint32_t* pairs = nullptr;  // row t at pairs + t * (cols / 2)
  int64_t cols = 0;
};

// n_pairs pairs of floats of x into BF16 pairs (the same bits at every level).
using Bf16ConvertFn = void (*)(const float* x, int64_t n_pairs, uint32_t* out);

// Rows [16 g0, 16 g1) of W times activation rows [t0, t0 + nt):
// y[i * y_stride + r] for the i-th token and row r (rows past W's end not written).
using Bf16GroupsFn = void (*)(const Bf16WeightsView& w, const Bf16ActsView& a, int64_t t0, int64_t nt, int64_t g0,
                              int64_t g1, float* y, size_t y_stride);

}  // namespace inferd::kernels
