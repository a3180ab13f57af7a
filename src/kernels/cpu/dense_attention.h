// Softmax attention of one head over one sequence whose keys and values are
// float rows in memory (an encoder's pass keeps them so; no paged cache).
//
// No reference engine's bits to reproduce here (the encoders are checked
// against their Hugging Face models by cosine), so the arithmetic is chosen
// for speed and for the same bits at every level: per query i,
//   s_j = scale * (q . k_j), the dot product a chain of fused multiply-adds
//         in column order;
//   e_j = expf_poly(s_j - max_j s_j);
//   sum  = sixteen lane sums (lane j % 16, each in key order) added lane by lane;
//   out  = fma chain over keys in order of (e_j * (1 / sum)) * v_j.
// A query's result depends on its own sequence only: batch invariant.
#pragma once
#include <cstdint>

namespace inferd::kernels {

struct DenseAttentionArgs {
  const float* q = nullptr;  // query row i at q + i * q_stride (D floats)
  const float* k = nullptr;  // key row j at k + j * kv_stride
  const float* v = nullptr;  // value row j at v + j * kv_stride
  float* out = nullptr;      // output row i at out + i * out_stride
  int64_t q_stride = 0, kv_stride = 0, out_stride = 0;
  int64_t n = 0;      // the sequence's tokens: queries and keys
  int64_t D = 0;      // head size
  float scale = 1.0f;
  bool causal = false;  // query i sees keys 0..i (else all n)
};

void dense_attention(const DenseAttentionArgs& a);

namespace detail {
void dense_attention_scalar(const DenseAttentionArgs& a);
void dense_attention_avx512(const DenseAttentionArgs& a);
}  // namespace detail

}  // namespace inferd::kernels
