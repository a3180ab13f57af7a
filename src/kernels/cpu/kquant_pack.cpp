#include "kernels/cpu/kquant_pack.h"

#include <cstring>
#include <vector>

#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/kquant_layout.h"
#include "kernels/cpu/quants.h"
#include "kernels/cpu/quants_blocks.h"

namespace inferd::kernels {

namespace {

static_assert(kQ4KGroupBlockBytes == 8 * sizeof(BlockQ4_K));

// GGML block <-> its place in a group super-block (kquant_layout.h); `to_group`
// says which way the bytes go.
void move_block(BlockQ4_K& x, uint8_t* gb, int r, bool to_group) {
  auto move = [&](void* block_field, size_t group_offset, size_t n) {
    if (to_group) {
      std::memcpy(gb + group_offset, block_field, n);
    } else {
      std::memcpy(block_field, gb + group_offset, n);
    }
  };
  move(&x.d, 2 * r, 2);
  move(&x.dmin, 16 + 2 * r, 2);
  for (int p = 0; p < 3; ++p) move(x.scales + 4 * p, kQ4KGroupScalesOffset + 32 * p + 4 * r, 4);
  for (int c = 0; c < 4; ++c) {
    for (int s = 0; s < 8; ++s) move(x.qs + 32 * c + 4 * s, kQ4KGroupQsOffset + 32 * (8 * c + s) + 4 * r, 4);
  }
}

// The portable kernel: each group back to GGML rows, then the reference orders.
void q4k_groups_ref(const uint8_t* groups, int64_t n_groups, int64_t cols, const uint8_t* act, size_t act_stride,
                    int64_t nt, bool gemm, float* out, size_t out_stride) {
  const int64_t nb = cols / kQK_K;
  thread_local std::vector<BlockQ4_K> rows;
  rows.resize(static_cast<size_t>(8 * nb));
  for (int64_t g = 0; g < n_groups; ++g) {
    const uint8_t* group = groups + g * nb * kQ4KGroupBlockBytes;
    for (int64_t i = 0; i < nb; ++i) {
      uint8_t* gb = const_cast<uint8_t*>(group + i * kQ4KGroupBlockBytes);
      for (int r = 0; r < 8; ++r) move_block(rows[r * nb + i], gb, r, /*to_group=*/false);
    }
    for (int64_t t = 0; t < nt; ++t) {
      for (int r = 0; r < 8; ++r) {
        out[t * out_stride + 8 * g + r] = ref::repacked_q4k_dot(cols, &rows[r * nb], act + t * act_stride, gemm);
      }
    }
  }
}

}  // namespace

bool RepackedQ4K::applies(DType t, int64_t rows) { return t == DType::Q4_K && ggml_repacked(t, rows); }

size_t RepackedQ4K::packed_bytes(int64_t rows, int64_t cols) { return row_bytes(DType::Q4_K, cols) * rows; }

RepackedQ4K RepackedQ4K::pack(const void* w, int64_t rows, int64_t cols, PackedArena* arena,
                              const RowsRepacked& done) {
  RepackedQ4K m;
  m.rows_ = rows;
  m.cols_ = cols;
  const int64_t nb = cols / kQK_K;
  m.group_bytes_ = kQ4KGroupBlockBytes * static_cast<size_t>(nb);
  const size_t size = packed_bytes(rows, cols);
  m.data_ = arena ? arena->take(size) : nullptr;
  if (m.data_ == nullptr) {
    m.owned_ = AlignedBytes(size);
    m.data_ = m.owned_.data();
  }
  const BlockQ4_K* src = static_cast<const BlockQ4_K*>(w);
  for (int64_t row = 0; row < rows; ++row) {
    uint8_t* group = m.data_ + (row / 8) * m.group_bytes_;
    for (int64_t i = 0; i < nb; ++i) {
      BlockQ4_K x = src[row * nb + i];
      move_block(x, group + i * kQ4KGroupBlockBytes, static_cast<int>(row % 8), /*to_group=*/true);
    }
    report_rows_repacked(done, row, rows);
  }
  return m;
}

std::pair<const void*, size_t> RepackedQ4K::rows_bytes(int64_t r0, int64_t r1) const {
  if (r0 >= r1) return {nullptr, 0};
  return {group(r0 / 8), static_cast<size_t>((r1 - r0) / 8) * group_bytes_};
}

void RepackedQ4K::unpack_row(int64_t r, void* dst) const {
  const int64_t nb = cols_ / kQK_K;
  BlockQ4_K* out = static_cast<BlockQ4_K*>(dst);
  const uint8_t* group = this->group(r / 8);
  for (int64_t i = 0; i < nb; ++i) {
    move_block(out[i], const_cast<uint8_t*>(group + i * kQ4KGroupBlockBytes), static_cast<int>(r % 8),
               /*to_group=*/false);
  }
}

void repacked_q4k_rows_with(const KernelTable& table, const RepackedQ4K& w, const uint8_t* act, int64_t n_tokens,
                            const TokenPlace* places, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  if (r0 >= r1 || n_tokens <= 0) return;
  const size_t act_row = matmul_act_row_bytes(DType::Q4_K, w.cols());
  const int64_t rows = w.rows();
  // Runs of consecutive tokens in the same order, each in one call.
  for (int64_t t0 = 0; t0 < n_tokens;) {
    auto is_gemm = [&](int64_t t) {
      return ggml_order_for(DType::Q4_K, rows, w.cols(), places[t]) == GgmlOrder::kRepackGemm;
    };
    const bool gemm = is_gemm(t0);
    int64_t t1 = t0 + 1;
    while (t1 < n_tokens && is_gemm(t1) == gemm) ++t1;
    table.q4k_groups(w.group(r0 / 8), (r1 - r0) / 8, w.cols(), act + t0 * act_row, act_row, t1 - t0, gemm,
                     y + t0 * ldy + r0, static_cast<size_t>(ldy));
    t0 = t1;
  }
}

void repacked_q4k_rows(const RepackedQ4K& w, const uint8_t* act, int64_t n_tokens, const TokenPlace* places,
                       float* y, int64_t ldy, int64_t r0, int64_t r1) {
  repacked_q4k_rows_with(kernel_table(), w, act, n_tokens, places, y, ldy, r0, r1);
}

void fill_scalar_kquant_kernels(KernelTable& t) { t.q4k_groups = q4k_groups_ref; }

}  // namespace inferd::kernels
