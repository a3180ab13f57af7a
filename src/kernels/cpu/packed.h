// Weight matrices repacked at load time into row-interleaved groups, and the
// integer matmul over them (layouts and the reasons in packed_layout.h).
//
// Used for the formats whose blocks are 32 quants with one or two scales
// (Q4_0, Q4_1, Q5_0, Q8_0, MXFP4): decode reads each weight byte once with a few
// instructions per 16 rows, and batched steps unpack a weight block once for
// up to kMaxPackedTokens tokens. Results are bit-identical across SIMD levels,
// batch sizes and thread splits (see PackedTileFn), and to GGML's CPU backend
// (AVX2 build): each type's products are summed in the order llama.cpp runs
// for that weight (packed_ref.cpp; for Q4_0 it depends on the row count, as
// ggml_repacked says), the same for every step size.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>

#include "core/aligned_bytes.h"
#include "core/dtype.h"
#include "core/thread_pool.h"

namespace inferd::kernels {

struct KernelTable;

// True for the weight types pack() accepts.
bool can_pack(DType t);

// Told, while a repacker walks a weight's rows in order, how many of the
// source's rows it has finished with (every kRowsRepackedStep rows, and all
// of them at the end), so that the caller can give back the source's pages
// behind it: a large matrix (an output head) otherwise sits in memory twice,
// file pages and copy, until its whole repack is done.
using RowsRepacked = std::function<void(int64_t rows_done)>;
inline constexpr int64_t kRowsRepackedStep = 1024;
// Calls done(r + 1) when row r finishes a step, and done(rows) after the last.
inline void report_rows_repacked(const RowsRepacked& done, int64_t r, int64_t rows) {
  if (done && ((r + 1) % kRowsRepackedStep == 0 || r + 1 == rows)) done(r + 1);
}

// Memory for all of a model's packed weights: one huge-page buffer handed out
// in 64-byte-aligned pieces. Decode streams every weight once per token; on
// 4 KiB pages that is a TLB miss (a page walk, nested under a hypervisor) every
// 4 KiB, and the matrices are too small to get huge pages one by one.
class PackedArena {
 public:
  // Huge-page memory is zero from the kernel and committed only as first
  // written, so pages are touched only as weights are repacked into them
  // (while the file's copy is given back behind the repack: RowsRepacked).
  explicit PackedArena(size_t bytes) : bytes_(bytes, /*huge_pages=*/true) {}
  // n bytes of the buffer (zero until written), or null when it has no room left.
  uint8_t* take(size_t n);
  // What take(n) uses of the buffer (n rounded up to 64): size an arena by these.
  static size_t space_for(size_t n) { return (n + 63) / 64 * 64; }

 private:
  AlignedBytes bytes_;
  size_t used_ = 0;
};

class PackedMatrix {
 public:
  PackedMatrix() = default;
  // Repacks `rows` GGML rows of `cols` elements of type t (can_pack(t)), into
  // memory of its own or, when given, into `arena` (which must outlive it).
  static PackedMatrix pack(DType t, const void* w, int64_t rows, int64_t cols, PackedArena* arena = nullptr,
                           const RowsRepacked& done = {});
  // The bytes pack() takes for such a matrix.
  static size_t packed_bytes(DType t, int64_t rows, int64_t cols);

  explicit operator bool() const { return rows_ > 0; }
  DType type() const { return type_; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  int64_t groups() const { return (rows_ + 15) / 16; }
  const uint8_t* group(int64_t g) const { return data_ + g * group_bytes_; }
  size_t bytes() const { return size_; }
  // Q4_0 and MXFP4 of rows llama.cpp does not repack (rows % 8 != 0): summed
  // in its vec_dot order (KernelTable packed_lanes_tile), else in its repacked one.
  bool vec_dot_order() const { return vec_dot_order_; }

 private:
  DType type_ = DType::F32;
  bool vec_dot_order_ = false;
  int64_t rows_ = 0, cols_ = 0;
  size_t group_bytes_ = 0;
  uint8_t* data_ = nullptr;  // in owned_, or in an arena
  size_t size_ = 0;
  AlignedBytes owned_;
};

// Activation rows quantized for the packed kernels (layout in packed_layout.h).
// Grown on demand, then reused: the hot path does not allocate.
class PackedActivations {
 public:
  void resize(int64_t n_tokens, int64_t cols);
  int64_t n_tokens() const { return n_tokens_; }
  int64_t cols() const { return cols_; }
  size_t row_bytes() const { return row_bytes_; }
  uint8_t* row(int64_t t) { return bytes_.data() + t * row_bytes_; }
  const uint8_t* row(int64_t t) const { return bytes_.data() + t * row_bytes_; }

 private:
  int64_t n_tokens_ = 0, cols_ = 0;
  size_t row_bytes_ = 0;
  AlignedBytes bytes_;
};

// Quantizes rows [t0, t1) of x (rows of a.cols() floats) into a, with the
// Q8_1 arithmetic of GGML's CPU backend (quantize_row(Q8_1)).
void quantize_packed_rows(const float* x, int64_t t0, int64_t t1, PackedActivations& a);
// The same for the 32-column blocks [b0, b1) of row t only (threads can share a row).
constexpr int64_t kPackedActBlock = 32;
void quantize_packed_blocks(const float* x, int64_t t, int64_t b0, int64_t b1, PackedActivations& a);

// y[t * ldy + r] = W row r . activation row t, for the rows of groups [g0, g1)
// and every token of a (its first `first_tokens` when that is >= 0). Threads
// split work by giving each its own group range.
void packed_matmul_groups(const PackedMatrix& w, const PackedActivations& a, int64_t g0, int64_t g1,
                          float* y, int64_t ldy, int64_t first_tokens = -1);
void packed_matmul_groups_with(const KernelTable& table, const PackedMatrix& w, const PackedActivations& a,
                               int64_t g0, int64_t g1, float* y, int64_t ldy, int64_t first_tokens = -1);

// The same for the activation rows [row0, row0 + n_tokens) of a only, y[i * ldy + r]
// for the i-th of them (the tokens routed to one expert).
void packed_matmul_span(const PackedMatrix& w, const PackedActivations& a, int64_t row0, int64_t n_tokens, int64_t g0,
                        int64_t g1, float* y, int64_t ldy);

// The whole product on the pool: quantize x (n_tokens x cols), then every group.
void packed_matmul(const PackedMatrix& w, const float* x, int64_t n_tokens, float* y, ThreadPool& pool,
                   PackedActivations& scratch);

}  // namespace inferd::kernels
