// Q4_K weights repacked at load time, eight rows interleaved per super-block
// (layout in kquant_layout.h), for the weights llama.cpp puts in its CPU
// repack buffer (ggml_repacked: Q4_K with rows % 8 == 0), multiplied in the
// orders GGML runs on them there: its repacked gemm for a chunk's first
// N - N % 4 tokens, its gemv for the rest (matmul.h, ggml_order_for).
//
// Same bits as matmul_rows_ggml on the GGML rows, faster: each of those
// orders is, per (row, token), a fixed scalar sequence of fmas on exact
// integer sums, and with the rows interleaved the integers of eight rows come
// out in the eight lanes of one vector, where that sequence runs as it is, one
// lane per row. A decode step so costs about a third of the instructions per
// weight byte of the row-by-row kernel (which ends every super-block of every
// row in a horizontal sum), and reads the same bytes, from huge pages when the
// matrix lives in a PackedArena.
#pragma once
#include <cstdint>
#include <utility>

#include "core/aligned_bytes.h"
#include "core/dtype.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/packed.h"

namespace inferd::kernels {

struct KernelTable;

class RepackedQ4K {
 public:
  RepackedQ4K() = default;
  // Whether a weight of this type and row count is repacked here (Q4_K where ggml_repacked).
  static bool applies(DType t, int64_t rows);
  // The bytes pack() takes for such a matrix (the GGML rows' bytes).
  static size_t packed_bytes(int64_t rows, int64_t cols);
  // Repacks `rows` (a multiple of 8) GGML Q4_K rows of `cols` elements, into
  // memory of its own or, when given, into `arena` (which must outlive it).
  static RepackedQ4K pack(const void* w, int64_t rows, int64_t cols, PackedArena* arena = nullptr,
                          const RowsRepacked& done = {});

  explicit operator bool() const { return rows_ > 0; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  int64_t groups() const { return rows_ / 8; }
  size_t group_bytes() const { return group_bytes_; }
  const uint8_t* group(int64_t g) const { return data_ + g * group_bytes_; }
  // The bytes rows [r0, r1) occupy (r0 and r1 multiples of 8): one contiguous range.
  std::pair<const void*, size_t> rows_bytes(int64_t r0, int64_t r1) const;
  // GGML row r back (row_bytes(Q4_K, cols) bytes into dst): tests.
  void unpack_row(int64_t r, void* dst) const;

 private:
  int64_t rows_ = 0, cols_ = 0;
  size_t group_bytes_ = 0;
  uint8_t* data_ = nullptr;  // in owned_, or in an arena
  AlignedBytes owned_;
};

// y[t * ldy + r] for rows [r0, r1) (multiples of 8) and n_tokens activation rows
// (Q8_K, matmul_act_row_bytes(Q4_K, cols) bytes apart, quantized by
// matmul_quantize_rows_ggml for this weight), each token in the order its
// place asks for; bit-identical to matmul_rows_ggml on the GGML rows.
void repacked_q4k_rows(const RepackedQ4K& w, const uint8_t* act, int64_t n_tokens, const TokenPlace* places,
                       float* y, int64_t ldy, int64_t r0, int64_t r1);
void repacked_q4k_rows_with(const KernelTable& table, const RepackedQ4K& w, const uint8_t* act, int64_t n_tokens,
                            const TokenPlace* places, float* y, int64_t ldy, int64_t r0, int64_t r1);

}  // namespace inferd::kernels
