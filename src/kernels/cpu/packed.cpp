#include "kernels/cpu/packed.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/packed_layout.h"
#include "kernels/cpu/quants.h"
#include "kernels/cpu/quants_blocks.h"

namespace inferd::kernels {

namespace {

size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

size_t packed_block_bytes(DType t) {
  switch (t) {
    case DType::Q4_0: return kPackedQ4_0BlockBytes;
    case DType::Q4_1: return kPackedQ4_1BlockBytes;
    case DType::Q5_0: return kPackedQ5_0BlockBytes;
    case DType::Q8_0: return kPackedQ8_0BlockBytes;
    case DType::MXFP4: return kPackedMXFP4BlockBytes;
    default: return 0;
  }
}

// Writes row r's 32 quant bytes (Q8_0) or 16 nibble bytes (Q4_x, Q5_0) into the
// group-block's quant area as 4-byte chunks: chunk j of row r at 64*j + 4*r.
void scatter_quants(const uint8_t* qs, int n_bytes, int r, uint8_t* dst) {
  for (int j = 0; j < n_bytes / 4; ++j) std::memcpy(dst + 64 * j + 4 * r, qs + 4 * j, 4);
}

}  // namespace

bool can_pack(DType t) { return packed_block_bytes(t) != 0; }

uint8_t* PackedArena::take(size_t n) {
  const size_t size = space_for(n);
  if (size > bytes_.size() - used_) return nullptr;
  uint8_t* p = bytes_.data() + used_;  // zero: handed out once, never written before
  used_ += size;
  return p;
}

size_t PackedMatrix::packed_bytes(DType t, int64_t rows, int64_t cols) {
  return packed_block_bytes(t) * static_cast<size_t>(cols / kQK) * static_cast<size_t>((rows + kPackRows - 1) / kPackRows);
}

PackedMatrix PackedMatrix::pack(DType t, const void* w, int64_t rows, int64_t cols, PackedArena* arena,
                                const RowsRepacked& done) {
  PackedMatrix m;
  m.type_ = t;
  m.vec_dot_order_ = (t == DType::Q4_0 || t == DType::MXFP4) && !ggml_repacked(t, rows);
  m.rows_ = rows;
  m.cols_ = cols;
  const int64_t nb = cols / kQK;
  const size_t block_bytes = packed_block_bytes(t);
  m.group_bytes_ = block_bytes * static_cast<size_t>(nb);
  m.size_ = packed_bytes(t, rows, cols);
  m.data_ = arena ? arena->take(m.size_) : nullptr;  // zeroed either way: padding rows are 0
  if (m.data_ == nullptr) {
    m.owned_ = AlignedBytes(m.size_);
    m.data_ = m.owned_.data();
  }
  const size_t src_row = row_bytes(t, cols);
  for (int64_t row = 0; row < rows; ++row) {
    const int r = static_cast<int>(row % kPackRows);
    uint8_t* group = m.data_ + (row / kPackRows) * m.group_bytes_;
    const uint8_t* src = static_cast<const uint8_t*>(w) + row * src_row;
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* dst = group + b * block_bytes;
      switch (t) {
        case DType::Q4_0: {
          const auto& x = reinterpret_cast<const BlockQ4_0*>(src)[b];
          std::memcpy(dst + 2 * r, &x.d, 2);
          scatter_quants(x.qs, 16, r, dst + 32);
          break;
        }
        case DType::Q4_1: {
          const auto& x = reinterpret_cast<const BlockQ4_1*>(src)[b];
          std::memcpy(dst + 2 * r, &x.d, 2);
          std::memcpy(dst + 32 + 2 * r, &x.m, 2);
          scatter_quants(x.qs, 16, r, dst + 64);
          break;
        }
        case DType::Q5_0: {
          const auto& x = reinterpret_cast<const BlockQ5_0*>(src)[b];
          std::memcpy(dst + 2 * r, &x.d, 2);
          uint32_t qh, lanes = 0;
          std::memcpy(&qh, x.qh, 4);
          for (int e = 0; e < kQK; ++e) lanes |= ((qh >> e) & 1u) << (8 * (e % 4) + e / 4);
          std::memcpy(dst + 32 + 4 * r, &lanes, 4);
          scatter_quants(x.qs, 16, r, dst + 96);
          break;
        }
        case DType::MXFP4: {
          const auto& x = reinterpret_cast<const BlockMXFP4*>(src)[b];
          dst[r] = x.e;
          scatter_quants(x.qs, 16, r, dst + 16);
          break;
        }
        default: {  // Q8_0
          const auto& x = reinterpret_cast<const BlockQ8_0*>(src)[b];
          std::memcpy(dst + 2 * r, &x.d, 2);
          scatter_quants(reinterpret_cast<const uint8_t*>(x.qs), 32, r, dst + 32);
          break;
        }
      }
    }
    report_rows_repacked(done, row, rows);
  }
  return m;
}

void PackedActivations::resize(int64_t n_tokens, int64_t cols) {
  const size_t row = round_up(static_cast<size_t>(cols) + 12 * static_cast<size_t>(cols / kQK), 64);
  if (row * static_cast<size_t>(n_tokens) > bytes_.size()) {
    bytes_ = AlignedBytes(row * static_cast<size_t>(std::max<int64_t>(n_tokens, n_tokens_)));
  }
  n_tokens_ = n_tokens;
  cols_ = cols;
  row_bytes_ = row;
}

void quantize_packed_blocks(const float* x, int64_t t, int64_t b0, int64_t b1, PackedActivations& a) {
  const int64_t cols = a.cols(), nb = cols / kQK;
  uint8_t* row = a.row(t);
  float* d = reinterpret_cast<float*>(row + cols);
  float* s = d + nb;
  int32_t* sum = reinterpret_cast<int32_t*>(s + nb);
  if (b0 >= b1) return;
  kernel_table().packed_quantize(x + t * cols + b0 * kQK, b1 - b0, reinterpret_cast<int8_t*>(row) + b0 * kQK, d + b0,
                                 s + b0, sum + b0);
}

void quantize_packed_rows(const float* x, int64_t t0, int64_t t1, PackedActivations& a) {
  for (int64_t t = t0; t < t1; ++t) quantize_packed_blocks(x, t, 0, a.cols() / kQK, a);
}

namespace {
// The product for activation rows [row0, row0 + n_tokens) of a, written from y's row 0.
void packed_matmul_rows_of(const KernelTable& table, const PackedMatrix& w, const PackedActivations& a, int64_t row0,
                           int64_t n_tokens, int64_t g0, int64_t g1, float* y, int64_t ldy) {
  const TypeKernels& k = table.type[static_cast<uint32_t>(w.type())];
  const PackedTileFn tile = w.vec_dot_order() ? k.packed_lanes_tile : k.packed_tile;
  const PackedLaneBiasFn lane_biases = w.vec_dot_order() ? k.packed_lanes_bias : k.packed_bias;
  const int step = std::clamp(w.vec_dot_order() ? k.packed_lanes_tokens : k.packed_tokens, 1, kMaxPackedTokens);
  // Once for every group (per group they cost a sixth of a Q8_0 tile's work).
  const int64_t biases_per_token = 8 * (w.cols() / kQK);
  thread_local std::vector<int32_t> bias;
  if (lane_biases && g0 < g1 && n_tokens > 0) {
    if (bias.size() < static_cast<size_t>(biases_per_token * n_tokens)) bias.resize(biases_per_token * n_tokens);
    lane_biases(a.row(row0), a.row_bytes(), static_cast<int>(n_tokens), w.cols(), bias.data());
  }
  float tail[kMaxPackedTokens * kPackRows];
  for (int64_t g = g0; g < g1; ++g) {
    const int64_t r0 = g * kPackRows;
    const bool full = r0 + kPackRows <= w.rows();
    // A group's weights stay in L1 while every token tile passes over them.
    for (int64_t t = 0; t < n_tokens; t += step) {
      const int nt = static_cast<int>(std::min<int64_t>(step, n_tokens - t));
      const int32_t* tb = lane_biases ? bias.data() + biases_per_token * t : nullptr;
      const uint8_t* act = a.row(row0 + t);
      if (full) {
        tile(w.group(g), w.cols(), act, a.row_bytes(), tb, nt, y + t * ldy + r0, static_cast<size_t>(ldy));
        continue;
      }
      tile(w.group(g), w.cols(), act, a.row_bytes(), tb, nt, tail, kPackRows);
      for (int i = 0; i < nt; ++i) std::memcpy(y + (t + i) * ldy + r0, tail + i * kPackRows, (w.rows() - r0) * sizeof(float));
    }
  }
}
}  // namespace

void packed_matmul_groups_with(const KernelTable& table, const PackedMatrix& w, const PackedActivations& a,
                               int64_t g0, int64_t g1, float* y, int64_t ldy, int64_t first_tokens) {
  const int64_t n_tokens = first_tokens < 0 ? a.n_tokens() : std::min(first_tokens, a.n_tokens());
  packed_matmul_rows_of(table, w, a, 0, n_tokens, g0, g1, y, ldy);
}

void packed_matmul_span(const PackedMatrix& w, const PackedActivations& a, int64_t row0, int64_t n_tokens, int64_t g0,
                        int64_t g1, float* y, int64_t ldy) {
  packed_matmul_rows_of(kernel_table(), w, a, row0, n_tokens, g0, g1, y, ldy);
}

void packed_matmul_groups(const PackedMatrix& w, const PackedActivations& a, int64_t g0, int64_t g1, float* y,
                          int64_t ldy, int64_t first_tokens) {
  packed_matmul_groups_with(kernel_table(), w, a, g0, g1, y, ldy, first_tokens);
}

void packed_matmul(const PackedMatrix& w, const float* x, int64_t n_tokens, float* y, ThreadPool& pool,
                   PackedActivations& scratch) {
  scratch.resize(n_tokens, w.cols());
  pool.run([&](int ti, int nt) {
    const auto [t0, t1] = ThreadPool::split(n_tokens, ti, nt);
    quantize_packed_rows(x, t0, t1, scratch);
  });
  pool.run([&](int ti, int nt) {
    const auto [g0, g1] = ThreadPool::split(w.groups(), ti, nt);
    packed_matmul_groups(w, scratch, g0, g1, y, w.rows());
  });
}

}  // namespace inferd::kernels
