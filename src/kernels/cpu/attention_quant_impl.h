// The quantized-KV attention kernel's skeleton (attention_quant.h), written
// once and compiled per SIMD level: `Level` supplies the block arithmetic
// (scores of a few heads at one position, the softmax of one head, the value
// update of a few heads at one position); the walk over positions and heads
// is here, so every level sums in the same structure and only lane orders
// differ.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/quants_blocks.h"

namespace inferd::kernels::detail {

// Internal linkage: this header is compiled with different instruction sets in
// different files, and one shared out-of-line copy could carry the wrong ones.
namespace {

// The bytes of kQK elements: a Q8_0/Q4_0 block, or 32 plain BF16 or F8_E4M3
// elements (read as a block whose scale is 1, so every dtype walks alike).
template <DType kType>
constexpr size_t kQuantKVBlockBytes = kType == DType::Q8_0   ? sizeof(BlockQ8_0)
                                      : kType == DType::Q4_0 ? sizeof(BlockQ4_0)
                                      : kType == DType::BF16 ? kQK * sizeof(uint16_t)
                                                             : kQK * sizeof(uint8_t);

// Heads whose scores a Level keeps in registers at once; a larger group runs
// in chunks of this many (each head's arithmetic is the same either way).
constexpr int64_t kQuantKVMaxGroup = 8;
// Positions whose values are summed as one chunk (counted from pos_begin, so
// the chunks of a token are the same in every pass and batch).
constexpr int64_t kQuantKVChunk = 16;

// How far ahead (positions) keys and values are prefetched: at long context
// they come from memory, in blocks scattered through the pool and rows a slot
// apart, which the hardware prefetchers do not follow.
constexpr int64_t kQuantKVPrefetch = 32;

// The cache lines of `bytes` from p (a row need not start on a line).
inline void prefetch_quant_row(const uint8_t* p, int64_t bytes) {
  const auto first = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63};
  for (uintptr_t line = first; line < reinterpret_cast<uintptr_t>(p) + bytes; line += 64)
    __builtin_prefetch(reinterpret_cast<const void*>(line));
}

// One head's keys (or values) at position p: its first block.
template <DType kType>
inline const uint8_t* quant_kv_row(const void* base, const PagedKV& kv, int64_t head_offset, int64_t p) {
  const int64_t block = kv.block_table[p / kv.block_size];
  return static_cast<const uint8_t*>(base) + block * kv.block_bytes() +
         (p % kv.block_size * kv.slot_stride + head_offset) / kQK * kQuantKVBlockBytes<kType>;
}

// Level::scores<kType, kHeads>(q, D, row, scale, w, stride): for h < kHeads,
//   w[h * stride] = scale * (head h's query q + h * D) . (the D-element row).
// Level::softmax(w, n, sink): w[0, n) = e^(w - m) in place, m the maximum of
//   w and *sink (if any); returns 1 / (their sum, plus e^(sink - m)).
// Level::values<kType, kHeads>(w, stride, D, rows, n_rows, out): for
//   h < kHeads, out[h * D, +D) += sum over r < n_rows (in order) of
//   w[h * stride + r] * (the D-element row rows[r]); n_rows <= kQuantKVChunk.
//   A level may sum a chunk apart before adding it to out, as long as it
//   does so for every chunk alike.
// Level::scale(out, D, f): out[0, D) *= f.
template <class Level, DType kType, int64_t kHeads>
inline void quant_scores_at(const float* q, int64_t heads, int64_t D, const uint8_t* row, float scale, float* w,
                            int64_t stride) {
  if constexpr (kHeads > 1) {
    if (heads < kHeads) return quant_scores_at<Level, kType, kHeads - 1>(q, heads, D, row, scale, w, stride);
  }
  Level::template scores<kType, kHeads>(q, D, row, scale, w, stride);
}

template <class Level, DType kType, int64_t kHeads>
inline void quant_values_at(const float* w, int64_t stride, int64_t heads, int64_t D, const uint8_t* const* rows,
                            int64_t n_rows, float* out) {
  if constexpr (kHeads > 1) {
    if (heads < kHeads) return quant_values_at<Level, kType, kHeads - 1>(w, stride, heads, D, rows, n_rows, out);
  }
  Level::template values<kType, kHeads>(w, stride, D, rows, n_rows, out);
}

// Keys of Dk elements, values of Dv (Dv <= Dk): q holds the heads Dk apart,
// out Dv apart. Attention proper has Dk == Dv; latent attention reads its
// values as the first Dv elements of the key rows (kv.v == kv.k).
template <class Level, DType kType>
void attend_heads_quant_impl(const float* q, int64_t n_heads, const PagedKV& kv, int64_t head_offset, int64_t Dk,
                             int64_t Dv, int64_t pos_begin, int64_t pos_end, float scale, float* out,
                             const float* sinks) {
  const int64_t n = pos_end - pos_begin;
  if (n <= 0) {
    std::fill(out, out + n_heads * Dv, 0.0f);
    return;
  }
  const int64_t key_bytes = Dk / kQK * static_cast<int64_t>(kQuantKVBlockBytes<kType>);
  const int64_t value_bytes = Dv / kQK * static_cast<int64_t>(kQuantKVBlockBytes<kType>);
  // Scores, then the softmax's weights in place: [head][position].
  thread_local std::vector<float> w;
  w.resize(static_cast<size_t>(std::min(n_heads, kQuantKVMaxGroup) * n));
  for (int64_t h0 = 0; h0 < n_heads; h0 += kQuantKVMaxGroup) {
    const int64_t heads = std::min(kQuantKVMaxGroup, n_heads - h0);
    const float* qh = q + h0 * Dk;
    float* oh = out + h0 * Dv;
    for (int64_t i = 0; i < n; ++i) {
      if (i + kQuantKVPrefetch < n)
        prefetch_quant_row(quant_kv_row<kType>(kv.k, kv, head_offset, pos_begin + i + kQuantKVPrefetch), key_bytes);
      quant_scores_at<Level, kType, kQuantKVMaxGroup>(
          qh, heads, Dk, quant_kv_row<kType>(kv.k, kv, head_offset, pos_begin + i), scale, w.data() + i, n);
    }
    float inv_sum[kQuantKVMaxGroup];
    for (int64_t h = 0; h < heads; ++h) inv_sum[h] = Level::softmax(w.data() + h * n, n, sinks ? sinks + h0 + h : nullptr);
    std::fill(oh, oh + heads * Dv, 0.0f);
    // The values of each position once for the group, in chunks of positions
    // in ascending order.
    for (int64_t i0 = 0; i0 < n; i0 += kQuantKVChunk) {
      const int64_t n_rows = std::min(kQuantKVChunk, n - i0);
      const uint8_t* rows[kQuantKVChunk];
      for (int64_t r = 0; r < n_rows; ++r) {
        rows[r] = quant_kv_row<kType>(kv.v, kv, head_offset, pos_begin + i0 + r);
        if (i0 + r + kQuantKVPrefetch < n)
          prefetch_quant_row(quant_kv_row<kType>(kv.v, kv, head_offset, pos_begin + i0 + r + kQuantKVPrefetch),
                             value_bytes);
      }
      quant_values_at<Level, kType, kQuantKVMaxGroup>(w.data() + i0, n, heads, Dv, rows, n_rows, oh);
    }
    for (int64_t h = 0; h < heads; ++h) Level::scale(oh + h * Dv, Dv, inv_sum[h]);
  }
}

// The impl by the cache's dtype: keys of Dk, values of Dv (see above).
template <class Level>
void attend_quant_by_dtype(const float* q, int64_t n_heads, const PagedKV& kv, int64_t head_offset, int64_t Dk,
                           int64_t Dv, int64_t pos_begin, int64_t pos_end, float scale, float* out,
                           const float* sinks) {
  switch (kv.dtype) {
    case DType::Q8_0:
      return attend_heads_quant_impl<Level, DType::Q8_0>(q, n_heads, kv, head_offset, Dk, Dv, pos_begin, pos_end,
                                                         scale, out, sinks);
    case DType::BF16:
      return attend_heads_quant_impl<Level, DType::BF16>(q, n_heads, kv, head_offset, Dk, Dv, pos_begin, pos_end,
                                                         scale, out, sinks);
    case DType::F8_E4M3:
      return attend_heads_quant_impl<Level, DType::F8_E4M3>(q, n_heads, kv, head_offset, Dk, Dv, pos_begin,
                                                            pos_end, scale, out, sinks);
    default:
      return attend_heads_quant_impl<Level, DType::Q4_0>(q, n_heads, kv, head_offset, Dk, Dv, pos_begin, pos_end,
                                                         scale, out, sinks);
  }
}

// attend_heads' signature (keys and values of D).
template <class Level>
void attend_heads_quant_by_dtype(const float* q, int64_t n_heads, const PagedKV& kv, int64_t head_offset, int64_t D,
                                 int64_t pos_begin, int64_t pos_end, float scale, float* out, const float* sinks) {
  attend_quant_by_dtype<Level>(q, n_heads, kv, head_offset, D, D, pos_begin, pos_end, scale, out, sinks);
}

// attend_latent_heads' signature: one latent head at offset 0, no sinks.
template <class Level>
void attend_latent_quant_by_dtype(const float* q, int64_t n_heads, const PagedKV& kv, int64_t Dk, int64_t Dv,
                                  int64_t pos_begin, int64_t pos_end, float scale, float* out) {
  attend_quant_by_dtype<Level>(q, n_heads, kv, 0, Dk, Dv, pos_begin, pos_end, scale, out, nullptr);
}

}  // namespace
}  // namespace inferd::kernels::detail
