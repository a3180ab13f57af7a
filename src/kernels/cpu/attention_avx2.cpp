// The portable attention kernel with FMA instructions (compiled with -mfma).
#include "kernels/cpu/attention_portable_impl.h"

namespace inferd::kernels::detail {

void attend_one_head_fma(const float* q, const PagedKV& kv, int64_t head_offset, int64_t D, int64_t pos_begin,
                         int64_t pos_end, float scale, AttentionPass pass, float* out) {
  attend_one_head_portable(q, kv, head_offset, D, pos_begin, pos_end, scale, pass, out);
}

}  // namespace inferd::kernels::detail
