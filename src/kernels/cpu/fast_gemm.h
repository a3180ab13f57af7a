// The fast numerics tier's matrix products (kernels/cpu/numerics.h): weights
// repacked at load into integer codes per block (fast_layout.h), activations
// quantized once per row to int8 per 32 columns (or, for K-quants where the
// level has the kernel, as Q8_K per 256), integer sums per weight block
// on AMX tiles, AVX-512 VNNI or AVX2, folded into one float accumulator per
// (row, token) in column order. Every level and every batch shape gives the
// same bits per (row, token): batch invariance by construction.
#pragma once
#include <cstdint>

#include "core/aligned_bytes.h"
#include "core/dtype.h"
#include "kernels/cpu/fast_layout.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/packed.h"

namespace inferd::kernels {

// Whether the fast tier has an integer form of weights of type t (the block
// formats inferd loads: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K, MXFP4).
bool fast_gemm_applies(DType t);

// The activation form a level's kernels take for weights of type t: Q8_K
// super-blocks for the K-quants where the level has a kernel for them
// (KernelTable::fast_super_kquants), else 32-column blocks.
FastActs fast_acts_for(const KernelTable& table, DType t);

class FastMatrix {
 public:
  FastMatrix() = default;
  // Repacks `rows` GGML rows of `cols` elements of type t (fast_gemm_applies),
  // into memory of its own or into `arena` (which must outlive it), for
  // activations of form `acts` (kSuperBlocks: K-quants only).
  static FastMatrix pack(DType t, const void* w, int64_t rows, int64_t cols, PackedArena* arena = nullptr,
                         const RowsRepacked& done = {}, FastActs acts = FastActs::kBlocks32);
  static size_t packed_bytes(DType t, int64_t rows, int64_t cols);

  explicit operator bool() const { return view_.rows > 0; }
  const FastWeightsView& view() const { return view_; }
  int64_t rows() const { return view_.rows; }
  int64_t cols() const { return view_.cols; }
  int64_t groups() const { return view_.groups(); }
  const uint8_t* group(int64_t g) const { return view_.data + g * view_.group_bytes; }
  FastActs acts() const { return view_.super_acts ? FastActs::kSuperBlocks : FastActs::kBlocks32; }
  // w[r][k] as the codes give it (scale * u + min), for tests.
  float weight(int64_t r, int64_t k) const;

 private:
  FastWeightsView view_;
  AlignedBytes owned_;
};

// Activation rows quantized for the fast kernels. Grown on demand, then
// reused: the hot path does not allocate.
class FastActivations {
 public:
  void resize(int64_t n_tokens, int64_t cols, FastActs form = FastActs::kBlocks32);
  int64_t n_tokens() const { return n_tokens_; }
  int64_t cols() const { return cols_; }
  FastActs form() const { return form_; }
  // Columns per quantized block: 32, or 256 (a Q8_K super-block).
  int64_t block() const { return block_of(form_); }
  static int64_t block_of(FastActs form) { return form == FastActs::kSuperBlocks ? kFastSuperBlock : kFastActBlock; }
  FastActsView view() const;
  // Quantizes the blocks [b0, b1) (of block() columns) of row t from x_row (cols floats).
  void quantize_blocks(const float* x_row, int64_t t, int64_t b0, int64_t b1);
  // Copies row `from_t` of `from` (of the same cols) to row t.
  void copy_row(const FastActivations& from, int64_t from_t, int64_t t);
  // x[t][k] as the quants give it (q * d), for tests.
  float value(int64_t t, int64_t k) const;

 private:
  int64_t n_tokens_ = 0, cols_ = 0;
  FastActs form_ = FastActs::kBlocks32;
  size_t super_row_bytes_ = 0;
  std::vector<uint8_t> super_;  // kSuperBlocks: Q8_K blocks, super_row_bytes_ a row
  std::vector<int8_t> q_;
  std::vector<float> d_, dsum32_, dsum16_;
  std::vector<int32_t> bsum16_;
};

// y[i * ldy + r] = W row r . activation row first + i, for i < n_tokens and
// the rows of groups [g0, g1).
void fast_matmul_groups(const FastMatrix& w, const FastActivations& a, int64_t first, int64_t n_tokens, int64_t g0,
                        int64_t g1, float* y, int64_t ldy);
void fast_matmul_groups_with(const KernelTable& table, const FastMatrix& w, const FastActivations& a, int64_t first,
                             int64_t n_tokens, int64_t g0, int64_t g1, float* y, int64_t ldy);

}  // namespace inferd::kernels
