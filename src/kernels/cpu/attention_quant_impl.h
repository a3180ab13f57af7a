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
#include "kernels/cpu/quants.h"
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
constexpr int64_t kQuantKVPrefetch = 64;

// Prefetches rows one after another, each cache line once: a block's rows
// are contiguous and need not start on a line, so a row's first line is
// often the one before's last (a 68-byte Q8_0 row of 64 elements spans two
// lines; asking for both every row doubles the prefetches, which stall once
// the core's misses in flight are at their limit).
class QuantRowPrefetcher {
 public:
  [[gnu::always_inline]] void row(const uint8_t* p, int64_t bytes) {
    auto line = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63};
    if (line == last_) line += 64;
    for (; line < reinterpret_cast<uintptr_t>(p) + bytes; line += 64) {
      __builtin_prefetch(reinterpret_cast<const void*>(line));
      last_ = line;
    }
  }

 private:
  uintptr_t last_ = 0;
};

// A chunk of n_rows <= kQuantKVChunk rows and the rows kQuantKVPrefetch
// positions ahead of them (n_ahead, fewer near the end), to be prefetched
// one per row as the rows are worked through: a whole chunk's prefetches at
// once (68 lines for 16 rows of a 256-wide Q8_0 head) fill the core's
// misses in flight and stall it.
struct QuantChunk {
  const uint8_t* rows[kQuantKVChunk];
  const uint8_t* ahead[kQuantKVChunk];
  int64_t n_rows = 0, n_ahead = 0, row_bytes = 0;
  QuantRowPrefetcher* prefetcher = nullptr;

  [[gnu::always_inline]] void prefetch(int64_t r) const {
    if (r < n_ahead) prefetcher->row(ahead[r], row_bytes);
  }
  void prefetch_all() const {
    for (int64_t r = 0; r < n_ahead; ++r) prefetcher->row(ahead[r], row_bytes);
  }
};

// One head's rows (keys or values) position after position, stepping through
// the block table: no division per row (two 64-bit divisions a row, as
// p / block_size and p % block_size, cost about as much as a 64-wide row's
// arithmetic).
template <DType kType>
class QuantRowCursor {
 public:
  QuantRowCursor(const void* base, const PagedKV& kv, int64_t head_offset, int64_t p)
      : base_(static_cast<const uint8_t*>(base) + head_offset / kQK * kQuantKVBlockBytes<kType>),
        table_(kv.block_table),
        block_bytes_(kv.block_bytes()),
        slot_bytes_(kv.slot_stride / kQK * static_cast<int64_t>(kQuantKVBlockBytes<kType>)),
        block_size_(kv.block_size),
        block_(p / kv.block_size) {
    row_ = base_ + table_[block_++] * block_bytes_ + p % block_size_ * slot_bytes_;
    left_ = block_size_ - p % block_size_;
  }

  // The current position's row, then on to the next position (the next
  // block's entry is read only when a row of it is asked for).
  [[gnu::always_inline]] const uint8_t* next() {
    if (left_ == 0) {
      row_ = base_ + table_[block_++] * block_bytes_;
      left_ = block_size_;
    }
    --left_;
    const uint8_t* row = row_;
    row_ += slot_bytes_;
    return row;
  }

 private:
  const uint8_t* base_;
  const int32_t* table_;
  int64_t block_bytes_, slot_bytes_, block_size_, block_;
  const uint8_t* row_;
  int64_t left_;
};

// Q8_0 and Q4_0: blocks that begin with an f16 scale d (BF16 and F8_E4M3
// blocks have none), and whose keys are dotted with a quantized query.
template <DType kType>
constexpr bool kScaledBlocks = kType == DType::Q8_0 || kType == DType::Q4_0;

// The query as the scores read it. A Q8_0 or Q4_0 cache is dotted with the
// query quantized to Q8_0 blocks, as llama.cpp does (the key type's
// vec_dot_type), so a level may dot keys and query in 8-bit integers;
// `floats` is that query dequantized (d * q, exact in f32) for levels that
// dot in f32, so every level computes the same scores up to f32 rounding.
// For BF16 and F8_E4M3 caches `floats` is the query itself and the rest null.
// Heads D apart.
struct QuantQuery {
  const float* floats = nullptr;
  const BlockQ8_0* blocks = nullptr;  // [head][D / kQK]
  const int32_t* sums = nullptr;      // [head][D / kQK]: each block's integers summed

  QuantQuery heads_from(int64_t h, int64_t D) const {
    return {floats + h * D, blocks ? blocks + h * (D / kQK) : nullptr, sums ? sums + h * (D / kQK) : nullptr};
  }
};

// Quantizes n_heads queries of D elements (QuantQuery) into thread-local
// storage; the view is valid until the thread's next call.
template <DType kType>
QuantQuery quantize_query(const float* q, int64_t n_heads, int64_t D) {
  if constexpr (!kScaledBlocks<kType>) {
    return {q, nullptr, nullptr};
  } else {
    thread_local std::vector<BlockQ8_0> blocks;
    thread_local std::vector<float> floats;
    thread_local std::vector<int32_t> sums;
    const int64_t n = n_heads * D, n_blocks = n / kQK;
    blocks.resize(static_cast<size_t>(n_blocks));
    floats.resize(static_cast<size_t>(n));
    sums.resize(static_cast<size_t>(n_blocks));
    quantize_row(DType::Q8_0, q, blocks.data(), n);  // D is a multiple of kQK: blocks never straddle heads
    dequantize_row(DType::Q8_0, blocks.data(), floats.data(), n);
    for (int64_t b = 0; b < n_blocks; ++b) {
      int32_t sum = 0;
      for (const int8_t x : blocks[b].qs) sum += x;
      sums[b] = sum;
    }
    return {floats.data(), blocks.data(), sums.data()};
  }
}

// A Level supplies the block arithmetic, row by row:
// Level::scores<kType, kHeads>(q, D, row, scale, w, stride): for h < kHeads,
//   w[h * stride] = scale * (head h's query q + h * D) . (the D-element row)
//   (q: QuantQuery::floats).
// Level::softmax(w, n, sink): w[0, n) = e^(w - m) in place, m the maximum of
//   w and *sink (if any); returns 1 / (their sum, plus e^(sink - m)).
// Level::values<kType, kHeads>(w, stride, D, rows, n_rows, out): for
//   h < kHeads, out[h * D, +D) += sum over r < n_rows (in order) of
//   w[h * stride + r] * (the D-element row rows[r]); n_rows <= kQuantKVChunk.
//   A level may sum a chunk apart before adding it to out, as long as it
//   does so for every chunk alike.
// Level::scale(out, D, f): out[0, D) *= f.
// Or, where Level::kTakesChunks is declared, a chunk at a time with its
// prefetches (QuantChunk::prefetch(r) as it reaches row r):
// Level::scores_chunk<kType, kHeads>(query, D, chunk, scale, w, stride): scores
//   for the chunk's rows, w[h * stride + r] for row r (a level may sum a
//   row's lanes together with the chunk's other rows, as long as each row's
//   sum is the same wherever it sits in a chunk);
// Level::values_chunk<kType, kHeads>(w, stride, D, chunk, out): values.
template <class Level>
concept TakesChunks = requires { Level::kTakesChunks; };

template <class Level, DType kType, int64_t kHeads>
inline void quant_scores_at(const QuantQuery& q, int64_t heads, int64_t D, const QuantChunk& chunk, float scale,
                            float* w, int64_t stride) {
  if constexpr (kHeads > 1) {
    if (heads < kHeads) return quant_scores_at<Level, kType, kHeads - 1>(q, heads, D, chunk, scale, w, stride);
  }
  if constexpr (TakesChunks<Level>) {
    Level::template scores_chunk<kType, kHeads>(q, D, chunk, scale, w, stride);
  } else {
    for (int64_t r = 0; r < chunk.n_rows; ++r) {
      chunk.prefetch(r);
      Level::template scores<kType, kHeads>(q.floats, D, chunk.rows[r], scale, w + r, stride);
    }
  }
}

template <class Level, DType kType, int64_t kHeads>
inline void quant_values_at(const float* w, int64_t stride, int64_t heads, int64_t D, const QuantChunk& chunk,
                            float* out) {
  if constexpr (kHeads > 1) {
    if (heads < kHeads) return quant_values_at<Level, kType, kHeads - 1>(w, stride, heads, D, chunk, out);
  }
  if constexpr (TakesChunks<Level>) {
    Level::template values_chunk<kType, kHeads>(w, stride, D, chunk, out);
  } else {
    chunk.prefetch_all();
    Level::template values<kType, kHeads>(w, stride, D, chunk.rows, chunk.n_rows, out);
  }
}

// The chunks of one head's rows from pos_begin, in ascending order, each
// with the rows kQuantKVPrefetch positions ahead of it: a cursor for the
// rows and one running ahead, so no row costs a division.
template <DType kType>
class QuantChunks {
 public:
  QuantChunks(const void* base, const PagedKV& kv, int64_t head_offset, int64_t pos_begin, int64_t n,
              int64_t row_bytes)
      : rows_(base, kv, head_offset, pos_begin), ahead_(base, kv, head_offset, pos_begin), n_(n) {
    for (int64_t i = 0; i < std::min(n, kQuantKVPrefetch); ++i) ahead_.next();
    chunk_.row_bytes = row_bytes;
    chunk_.prefetcher = &prefetcher_;
  }

  // The chunk of positions pos_begin + [i0, i0 + kQuantKVChunk), clipped;
  // i0 steps by kQuantKVChunk from 0.
  [[gnu::always_inline]] const QuantChunk& at(int64_t i0) {
    chunk_.n_rows = std::min(kQuantKVChunk, n_ - i0);
    chunk_.n_ahead = std::clamp(n_ - i0 - kQuantKVPrefetch, int64_t{0}, chunk_.n_rows);
    for (int64_t r = 0; r < chunk_.n_rows; ++r) chunk_.rows[r] = rows_.next();
    for (int64_t r = 0; r < chunk_.n_ahead; ++r) chunk_.ahead[r] = ahead_.next();
    return chunk_;
  }

 private:
  QuantRowCursor<kType> rows_, ahead_;
  QuantRowPrefetcher prefetcher_;
  QuantChunk chunk_;
  int64_t n_;
};

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
  const QuantQuery query = quantize_query<kType>(q, n_heads, Dk);
  for (int64_t h0 = 0; h0 < n_heads; h0 += kQuantKVMaxGroup) {
    const int64_t heads = std::min(kQuantKVMaxGroup, n_heads - h0);
    const QuantQuery qh = query.heads_from(h0, Dk);
    float* oh = out + h0 * Dv;
    QuantChunks<kType> keys(kv.k, kv, head_offset, pos_begin, n, key_bytes);
    for (int64_t i0 = 0; i0 < n; i0 += kQuantKVChunk)
      quant_scores_at<Level, kType, kQuantKVMaxGroup>(qh, heads, Dk, keys.at(i0), scale, w.data() + i0, n);
    float inv_sum[kQuantKVMaxGroup];
    for (int64_t h = 0; h < heads; ++h) inv_sum[h] = Level::softmax(w.data() + h * n, n, sinks ? sinks + h0 + h : nullptr);
    std::fill(oh, oh + heads * Dv, 0.0f);
    // The values of each position once for the group, in the same chunks.
    QuantChunks<kType> values(kv.v, kv, head_offset, pos_begin, n, value_bytes);
    for (int64_t i0 = 0; i0 < n; i0 += kQuantKVChunk)
      quant_values_at<Level, kType, kQuantKVMaxGroup>(w.data() + i0, n, heads, Dv, values.at(i0), oh);
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
