// The fast numerics tier's product for F16 and BF16 weights
// (kernels/cpu/numerics.h): weights repacked at load into BF16 pairs
// (bf16_layout.h), activations rounded once per row to BF16, products summed
// in float by AVX-512 BF16's dpbf16ps where the CPU has it, and by fused
// multiply-adds in the same order elsewhere. F16 weights lose three bits of
// significand to BF16; in exchange the product runs at twice the float
// multiply-add rate (the encoders' embeddings: docs/benchmarks.md). Every
// batch shape gives the same bits per (row, token): batch invariance by
// construction.
#pragma once
#include <cstdint>
#include <vector>

#include "core/aligned_bytes.h"
#include "core/dtype.h"
#include "kernels/cpu/bf16_layout.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/packed.h"

namespace inferd::kernels {

// Whether the BF16 product takes weights of type t with `cols` columns.
bool bf16_gemm_applies(DType t, int64_t cols);

// One float as BF16 (bf16_layout.h's rounding), and back.
uint16_t f32_to_bf16_rne(float x);
float bf16_bits_to_f32(uint16_t h);

class Bf16Matrix {
 public:
  Bf16Matrix() = default;
  // Repacks `rows` GGML rows of `cols` F16 or BF16 values into memory of its
  // own or into `arena` (which must outlive it).
  static Bf16Matrix pack(DType t, const void* w, int64_t rows, int64_t cols, PackedArena* arena = nullptr,
                         const RowsRepacked& done = {});
  static size_t packed_bytes(int64_t rows, int64_t cols);

  explicit operator bool() const { return view_.rows > 0; }
  const Bf16WeightsView& view() const { return view_; }
  int64_t rows() const { return view_.rows; }
  int64_t cols() const { return view_.cols; }
  int64_t groups() const { return view_.groups(); }
  const uint8_t* group(int64_t g) const { return reinterpret_cast<const uint8_t*>(view_.group(g)); }
  // w[r][k] as packed, for tests.
  float weight(int64_t r, int64_t k) const;

 private:
  Bf16WeightsView view_;
  AlignedBytes owned_;
};

// Activation rows rounded for the BF16 product. Grown on demand, then reused.
class Bf16Activations {
 public:
  void resize(int64_t n_tokens, int64_t cols);
  int64_t n_tokens() const { return n_tokens_; }
  int64_t cols() const { return cols_; }
  Bf16ActsView view() const { return {pairs_.data(), cols_}; }
  // Rounds the kBf16ActBlock-column blocks [b0, b1) of row t from x_row (cols floats).
  void convert_blocks(const float* x_row, int64_t t, int64_t b0, int64_t b1);
  void convert_blocks_with(const KernelTable& table, const float* x_row, int64_t t, int64_t b0, int64_t b1);
  // Copies row `from_t` of `from` (of the same cols) to row t.
  void copy_row(const Bf16Activations& from, int64_t from_t, int64_t t);
  // x[t][k] as rounded, for tests.
  float value(int64_t t, int64_t k) const;

 private:
  int64_t n_tokens_ = 0, cols_ = 0;
  std::vector<uint32_t> pairs_;
};

// y[i * ldy + r] = W row r . activation row first + i, for i < n_tokens and
// the rows of groups [g0, g1).
void bf16_matmul_groups(const Bf16Matrix& w, const Bf16Activations& a, int64_t first, int64_t n_tokens, int64_t g0,
                        int64_t g1, float* y, int64_t ldy);
void bf16_matmul_groups_with(const KernelTable& table, const Bf16Matrix& w, const Bf16Activations& a, int64_t first,
                             int64_t n_tokens, int64_t g0, int64_t g1, float* y, int64_t ldy);

}  // namespace inferd::kernels
