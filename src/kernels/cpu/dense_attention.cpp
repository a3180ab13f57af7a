#include "kernels/cpu/dense_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/expf_poly.h"
#include "kernels/cpu/kernel_table.h"

namespace inferd::kernels {

namespace detail {

// The reference: the arithmetic of dense_attention.h, element by element.
void dense_attention_scalar(const DenseAttentionArgs& a) {
  thread_local std::vector<float> e;
  e.resize(static_cast<size_t>(a.n));
  for (int64_t i = 0; i < a.n; ++i) {
    const float* q = a.q + i * a.q_stride;
    const int64_t m = a.causal ? i + 1 : a.n;
    float max_s = -INFINITY;
    for (int64_t j = 0; j < m; ++j) {
      const float* k = a.k + j * a.kv_stride;
      float dot = 0.0f;
      for (int64_t d = 0; d < a.D; ++d) dot = std::fma(q[d], k[d], dot);
      e[j] = a.scale * dot;
      max_s = std::max(max_s, e[j]);
    }
    float lanes[16] = {};
    for (int64_t j = 0; j < m; ++j) {
      e[j] = expf_poly(e[j] - max_s);
      lanes[j % 16] += e[j];
    }
    float sum = 0.0f;
    for (float l : lanes) sum += l;
    const float inv = 1.0f / sum;
    float* out = a.out + i * a.out_stride;
    std::fill(out, out + a.D, 0.0f);
    for (int64_t j = 0; j < m; ++j) {
      const float w = e[j] * inv;
      const float* v = a.v + j * a.kv_stride;
      for (int64_t d = 0; d < a.D; ++d) out[d] = std::fma(w, v[d], out[d]);
    }
  }
}

}  // namespace detail

void fill_dense_attention_kernels(FloatKernels& ops, SimdLevel level) {
  ops.dense_attention = level >= SimdLevel::kAvx512 ? detail::dense_attention_avx512 : detail::dense_attention_scalar;
}

void dense_attention(const DenseAttentionArgs& a) { kernel_table().ops.dense_attention(a); }

}  // namespace inferd::kernels
