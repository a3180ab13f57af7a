// Attention of one query head over keys and values held in a paged f16 KV
// cache: the block table maps a position to its cache slot, so a sequence's
// keys are never copied into a contiguous buffer.
#pragma once
#include <cstdint>

namespace inferd::kernels {

struct PagedKV {
  const uint16_t* k = nullptr;  // f16, [slot][slot_stride]
  const uint16_t* v = nullptr;
  int64_t slot_stride = 0;      // elements between consecutive slots
  int64_t block_size = 0;
  const int32_t* block_table = nullptr;
};

// out[0..D) = sum_p softmax_p(scale * q . k_p) v_p for positions
// p in [pos_begin, pos_end), reading head `head_offset` (element offset within
// a slot). Positions are visited in increasing order whatever the batch, so the
// result is batch-invariant.
void attend_one_head(const float* q, const PagedKV& kv, int64_t head_offset, int64_t D,
                     int64_t pos_begin, int64_t pos_end, float scale, float* out);

namespace detail {
void attend_one_head_scalar(const float* q, const PagedKV& kv, int64_t head_offset, int64_t D,
                            int64_t pos_begin, int64_t pos_end, float scale, float* out);
void attend_one_head_avx512(const float* q, const PagedKV& kv, int64_t head_offset, int64_t D,
                            int64_t pos_begin, int64_t pos_end, float scale, float* out);
}  // namespace detail

}  // namespace inferd::kernels
