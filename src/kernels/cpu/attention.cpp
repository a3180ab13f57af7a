#include "kernels/cpu/attention.h"

#include <cstring>

#include "kernels/cpu/attention_portable_impl.h"
#include "kernels/cpu/quants.h"

namespace inferd::kernels {

namespace detail {

void attend_one_head_scalar(const float* q, const PagedKV& kv, int64_t head_offset, int64_t D, int64_t pos_begin,
                            int64_t pos_end, float scale, AttentionPass pass, float* out) {
  attend_one_head_portable(q, kv, head_offset, D, pos_begin, pos_end, scale, pass, out);
}

}  // namespace detail

namespace {

using AttendHeadsFn = void (*)(const float*, int64_t, const PagedKV&, int64_t, int64_t, int64_t, int64_t, float,
                               AttentionPass, float*);

// A one-head kernel run head by head (the levels without a grouped kernel).
template <auto kOneHead>
void each_head(const float* q, int64_t n_heads, const PagedKV& kv, int64_t head_offset, int64_t D, int64_t pos_begin,
               int64_t pos_end, float scale, AttentionPass pass, float* out) {
  for (int64_t h = 0; h < n_heads; ++h) kOneHead(q + h * D, kv, head_offset, D, pos_begin, pos_end, scale, pass, out + h * D);
}

// Same level as the quantized kernels (CPU features and INFERD_SIMD).
AttendHeadsFn pick_attention() {
  if (std::strcmp(simd_level(), "avx512vnni") == 0) return detail::attend_heads_avx512;
  if (std::strcmp(simd_level(), "avx2") == 0) return each_head<detail::attend_one_head_fma>;
  return each_head<detail::attend_one_head_scalar>;
}

}  // namespace

void attend_one_head(const float* q, const PagedKV& kv, int64_t head_offset, int64_t D, int64_t pos_begin,
                     int64_t pos_end, float scale, AttentionPass pass, float* out) {
  attend_heads(q, 1, kv, head_offset, D, pos_begin, pos_end, scale, pass, out);
}

void attend_heads(const float* q, int64_t n_heads, const PagedKV& kv, int64_t head_offset, int64_t D,
                  int64_t pos_begin, int64_t pos_end, float scale, AttentionPass pass, float* out) {
  static const AttendHeadsFn fn = pick_attention();
  fn(q, n_heads, kv, head_offset, D, pos_begin, pos_end, scale, pass, out);
}

}  // namespace inferd::kernels
