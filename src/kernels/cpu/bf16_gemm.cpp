#include "kernels/cpu/bf16_gemm.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>

#include "kernels/cpu/quants.h"

namespace inferd::kernels {

bool bf16_gemm_applies(DType t, int64_t cols) {
  return (t == DType::F16 || t == DType::BF16) && cols > 0 && cols % kBf16ActBlock == 0;
}

uint16_t f32_to_bf16_rne(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7F800000u) == 0) return static_cast<uint16_t>((u >> 16) & 0x8000u);  // zero and denormals: signed zero
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN stays NaN, quiet
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float bf16_bits_to_f32(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

size_t Bf16Matrix::packed_bytes(int64_t rows, int64_t cols) {
  const int64_t groups = (rows + kBf16Rows - 1) / kBf16Rows;
  return static_cast<size_t>(groups) * kBf16Rows * static_cast<size_t>(cols) * 2;
}

Bf16Matrix Bf16Matrix::pack(DType t, const void* w, int64_t rows, int64_t cols, PackedArena* arena,
                            const RowsRepacked& done) {
  assert(bf16_gemm_applies(t, cols));
  Bf16Matrix m;
  const size_t bytes = packed_bytes(rows, cols);
  uint8_t* dst = arena ? arena->take(bytes) : nullptr;
  if (dst == nullptr) {
    m.owned_ = AlignedBytes(bytes);
    dst = m.owned_.data();
  }
  m.view_ = {reinterpret_cast<const uint32_t*>(dst), rows, cols};
  auto* out = reinterpret_cast<uint32_t*>(dst);
  const int64_t pairs = cols / 2;
  const auto* src = static_cast<const uint16_t*>(w);
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* s = src + r * cols;
    uint32_t* g = out + (r / kBf16Rows) * pairs * kBf16Rows + r % kBf16Rows;
    for (int64_t p = 0; p < pairs; ++p) {
      uint16_t lo, hi;
      if (t == DType::BF16) {
        lo = s[2 * p], hi = s[2 * p + 1];
      } else {
        lo = f32_to_bf16_rne(f16_to_f32(s[2 * p])), hi = f32_to_bf16_rne(f16_to_f32(s[2 * p + 1]));
      }
      g[p * kBf16Rows] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
    }
    report_rows_repacked(done, r, rows);
  }
  return m;  // rows past the end stay zero (both allocations come zeroed)
}

float Bf16Matrix::weight(int64_t r, int64_t k) const {
  const uint32_t d = view_.group(r / kBf16Rows)[(k / 2) * kBf16Rows + r % kBf16Rows];
  return bf16_bits_to_f32(static_cast<uint16_t>(k % 2 ? d >> 16 : d & 0xFFFFu));
}

void Bf16Activations::resize(int64_t n_tokens, int64_t cols) {
  assert(cols % kBf16ActBlock == 0);
  n_tokens_ = n_tokens, cols_ = cols;
  const size_t n = static_cast<size_t>(n_tokens) * static_cast<size_t>(cols / 2);
  if (pairs_.size() < n) pairs_.resize(n);
}

void Bf16Activations::convert_blocks_with(const KernelTable& table, const float* x_row, int64_t t, int64_t b0,
                                          int64_t b1) {
  table.bf16_convert(x_row + b0 * kBf16ActBlock, (b1 - b0) * kBf16ActBlock / 2,
                     pairs_.data() + t * (cols_ / 2) + b0 * kBf16ActBlock / 2);
}

void Bf16Activations::convert_blocks(const float* x_row, int64_t t, int64_t b0, int64_t b1) {
  convert_blocks_with(kernel_table(), x_row, t, b0, b1);
}

void Bf16Activations::copy_row(const Bf16Activations& from, int64_t from_t, int64_t t) {
  const int64_t pairs = cols_ / 2;
  std::memcpy(pairs_.data() + t * pairs, from.pairs_.data() + from_t * pairs, sizeof(uint32_t) * pairs);
}

float Bf16Activations::value(int64_t t, int64_t k) const {
  const uint32_t d = pairs_[static_cast<size_t>(t * (cols_ / 2) + k / 2)];
  return bf16_bits_to_f32(static_cast<uint16_t>(k % 2 ? d >> 16 : d & 0xFFFFu));
}

namespace {

void bf16_convert_scalar(const float* x, int64_t n_pairs, uint32_t* out) {
  for (int64_t p = 0; p < n_pairs; ++p)
    out[p] = static_cast<uint32_t>(f32_to_bf16_rne(x[2 * p])) |
             (static_cast<uint32_t>(f32_to_bf16_rne(x[2 * p + 1])) << 16);
}

// The reference: the arithmetic every level reproduces (bf16_layout.h).
void bf16_groups_scalar(const Bf16WeightsView& w, const Bf16ActsView& a, int64_t t0, int64_t nt, int64_t g0,
                        int64_t g1, float* y, size_t y_stride) {
  const int64_t pairs = w.pairs();
  for (int64_t g = g0; g < g1; ++g) {
    const int rows = static_cast<int>(std::min<int64_t>(kBf16Rows, w.rows - g * kBf16Rows));
    const uint32_t* wg = w.group(g);
    for (int64_t i = 0; i < nt; ++i) {
      const uint32_t* x = a.pairs + (t0 + i) * pairs;
      for (int r = 0; r < rows; ++r) {
        float acc = 0.0f;
        for (int64_t p = 0; p < pairs; ++p) {
          const uint32_t wd = wg[p * kBf16Rows + r];
          acc = std::fma(bf16_bits_to_f32(static_cast<uint16_t>(x[p] >> 16)),
                         bf16_bits_to_f32(static_cast<uint16_t>(wd >> 16)), acc);
          acc = std::fma(bf16_bits_to_f32(static_cast<uint16_t>(x[p] & 0xFFFFu)),
                         bf16_bits_to_f32(static_cast<uint16_t>(wd & 0xFFFFu)), acc);
        }
        y[i * y_stride + g * kBf16Rows + r] = acc;
      }
    }
  }
}

}  // namespace

void fill_bf16_kernels(KernelTable& t, SimdLevel level) {
  t.bf16_groups = bf16_groups_scalar;
  t.bf16_convert = bf16_convert_scalar;
  if (level >= SimdLevel::kAvx2) t.bf16_groups = bf16_groups_avx2();
  if (level >= SimdLevel::kAvx512) {
    t.bf16_convert = bf16_convert_avx512();
    t.bf16_groups = bf16_groups_avx512(cpu_has_avx512_bf16());
  }
}

void bf16_matmul_groups_with(const KernelTable& table, const Bf16Matrix& w, const Bf16Activations& a, int64_t first,
                             int64_t n_tokens, int64_t g0, int64_t g1, float* y, int64_t ldy) {
  if (g0 >= g1 || n_tokens <= 0) return;
  table.bf16_groups(w.view(), a.view(), first, n_tokens, g0, g1, y, static_cast<size_t>(ldy));
}

void bf16_matmul_groups(const Bf16Matrix& w, const Bf16Activations& a, int64_t first, int64_t n_tokens, int64_t g0,
                        int64_t g1, float* y, int64_t ldy) {
  bf16_matmul_groups_with(kernel_table(), w, a, first, n_tokens, g0, g1, y, ldy);
}

}  // namespace inferd::kernels
