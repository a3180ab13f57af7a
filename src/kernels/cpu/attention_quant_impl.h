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

template <DType kType>
constexpr size_t kQuantKVBlockBytes = kType == DType::Q8_0 ? sizeof(BlockQ8_0) : sizeof(BlockQ4_0);

// Heads whose scores a Level keeps in registers at once; a larger group runs
// in chunks of this many (each head's arithmetic is the same either way).
constexpr int64_t kQuantKVMaxGroup = 8;

// One head's keys (or values) at position p: its first block.
template <DType kType>
inline const uint8_t* quant_kv_row(const void* base, const PagedKV& kv, int64_t head_offset, int64_t p) {
  const int64_t slot = int64_t{kv.block_table[p / kv.block_size]} * kv.block_size + p % kv.block_size;
  return static_cast<const uint8_t*>(base) + (slot * kv.slot_stride + head_offset) / kQK * kQuantKVBlockBytes<kType>;
}

// Level::scores<kType, kHeads>(q, D, row, scale, w, stride): for h < kHeads,
//   w[h * stride] = scale * (head h's query q + h * D) . (the D-element row).
// Level::softmax(w, n, sink): w[0, n) = e^(w - m) in place, m the maximum of
//   w and *sink (if any); returns 1 / (their sum, plus e^(sink - m)).
// Level::values<kType>(w, stride, heads, D, row, out): for h < heads,
//   out[h * D, +D) += w[h * stride] * (the D-element row).
// Level::scale(out, D, f): out[0, D) *= f.
template <class Level, DType kType, int64_t kHeads>
inline void quant_scores_at(const float* q, int64_t heads, int64_t D, const uint8_t* row, float scale, float* w,
                            int64_t stride) {
  if constexpr (kHeads > 1) {
    if (heads < kHeads) return quant_scores_at<Level, kType, kHeads - 1>(q, heads, D, row, scale, w, stride);
  }
  Level::template scores<kType, kHeads>(q, D, row, scale, w, stride);
}

template <class Level, DType kType>
void attend_heads_quant_impl(const float* q, int64_t n_heads, const PagedKV& kv, int64_t head_offset, int64_t D,
                             int64_t pos_begin, int64_t pos_end, float scale, float* out, const float* sinks) {
  const int64_t n = pos_end - pos_begin;
  if (n <= 0) {
    std::fill(out, out + n_heads * D, 0.0f);
    return;
  }
  // Scores, then the softmax's weights in place: [head][position].
  thread_local std::vector<float> w;
  w.resize(static_cast<size_t>(std::min(n_heads, kQuantKVMaxGroup) * n));
  for (int64_t h0 = 0; h0 < n_heads; h0 += kQuantKVMaxGroup) {
    const int64_t heads = std::min(kQuantKVMaxGroup, n_heads - h0);
    const float* qh = q + h0 * D;
    float* oh = out + h0 * D;
    for (int64_t i = 0; i < n; ++i)
      quant_scores_at<Level, kType, kQuantKVMaxGroup>(qh, heads, D, quant_kv_row<kType>(kv.k, kv, head_offset, pos_begin + i),
                                                      scale, w.data() + i, n);
    float inv_sum[kQuantKVMaxGroup];
    for (int64_t h = 0; h < heads; ++h) inv_sum[h] = Level::softmax(w.data() + h * n, n, sinks ? sinks + h0 + h : nullptr);
    std::fill(oh, oh + heads * D, 0.0f);
    // The values of each position once for the group, positions in order:
    // every output element is one sum in ascending position order.
    for (int64_t i = 0; i < n; ++i)
      Level::template values<kType>(w.data() + i, n, heads, D, quant_kv_row<kType>(kv.v, kv, head_offset, pos_begin + i),
                                    oh);
    for (int64_t h = 0; h < heads; ++h) Level::scale(oh + h * D, D, inv_sum[h]);
  }
}

// attend_heads' signature over the impl, by the cache's dtype.
template <class Level>
void attend_heads_quant_by_dtype(const float* q, int64_t n_heads, const PagedKV& kv, int64_t head_offset, int64_t D,
                                 int64_t pos_begin, int64_t pos_end, float scale, float* out, const float* sinks) {
  if (kv.dtype == DType::Q8_0)
    attend_heads_quant_impl<Level, DType::Q8_0>(q, n_heads, kv, head_offset, D, pos_begin, pos_end, scale, out, sinks);
  else
    attend_heads_quant_impl<Level, DType::Q4_0>(q, n_heads, kv, head_offset, D, pos_begin, pos_end, scale, out, sinks);
}

}  // namespace
}  // namespace inferd::kernels::detail
