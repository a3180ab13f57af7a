// The loop of gated_delta_rule (gated_delta_rule.h) written once; Ops names
// what each build and level does differently: ggml_vec_dot_f32's order
// (dot), ggml_vec_mad_f32 (mad). Included by files compiled with different
// instruction sets, hence internal linkage.
#pragma once
#include <cmath>

#include "kernels/cpu/attention_portable_impl.h"
#include "kernels/cpu/float_matmul_impl.h"
#include "kernels/cpu/gated_delta_rule.h"
#include "kernels/cpu/short_conv.h"  // rounded_product

namespace inferd::kernels::detail {
namespace {

// The largest head size the kernel keeps its delta row for on the stack.
constexpr int64_t kMaxGatedDeltaSize = 512;

template <class Ops>
void gated_delta_rule_of(const GatedDeltaArgs& a, int64_t h0, int64_t h1) {
  const int64_t S = a.size;
  const float scale = 1.0f / std::sqrt(static_cast<float>(S));
  float delta[kMaxGatedDeltaSize];
  for (int64_t h = h0; h < h1; ++h) {
    float* M = a.state + h * S * S;
    const int64_t hk = h % a.n_k_heads;
    for (int64_t t = 0; t < a.n_tokens; ++t) {
      const float* q = a.q + t * a.q_stride + hk * S;
      const float* k = a.k + t * a.k_stride + hk * S;
      const float* v = a.v + t * a.v_stride + h * S;
      const float decay = std::exp(a.g[t * a.gb_stride + h]);
      const float beta = a.beta[t * a.gb_stride + h];
      for (int64_t e = 0; e < S * S; ++e) M[e] *= decay;
      for (int64_t j = 0; j < S; ++j) delta[j] = (v[j] - Ops::dot(M + j * S, k, S)) * beta;
      for (int64_t j = 0; j < S; ++j) Ops::mad(M + j * S, k, delta[j], S);
      float* out = a.out + t * a.out_stride + h * S;
      for (int64_t j = 0; j < S; ++j) out[j] = Ops::dot(M + j * S, q, S) * scale;
    }
  }
}

// ggml_vec_mad_f32 in portable code: y = fma(x, v, y) for every element.
// Past its whole vector steps GGML's loop y[i] += x[i] * v is vectorized by
// GCC and contracted into fma's too (checked in the AVX-512 build's
// disassembly and against its gated_delta_net on tiny-qwen35), so the step
// changes nothing.
template <int kStep>
inline void mad_portable(float* y, const float* x, float v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::fma(x[i], v, y[i]);
}

// GGML's AVX-512 build: four 16-lane accumulators over steps of 64.
struct PortableAvx512Order {
  static float dot(const float* a, const float* b, int64_t n) {
    float acc[4][16] = {};
    int64_t i = 0;
    for (; i + 64 <= n; i += 64)
      for (int j = 0; j < 4; ++j)
        for (int l = 0; l < 16; ++l) acc[j][l] = std::fma(a[i + 16 * j + l], b[i + 16 * j + l], acc[j][l]);
    float v[16];
    for (int l = 0; l < 16; ++l) v[l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
    return f32_dot_tail(a, b, i, n, reduce16(v));
  }
  static void mad(float* y, const float* x, float v, int64_t n) { mad_portable<64>(y, x, v, n); }
};

// GGML's AVX2 build: four 8-lane accumulators over steps of 32, the lanes
// summed as GGML_F32x8_REDUCE ends, the rest one rounded product at a time.
struct PortableAvx2Order {
  static float dot(const float* a, const float* b, int64_t n) {
    float acc[4][8] = {};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
      for (int j = 0; j < 4; ++j)
        for (int l = 0; l < 8; ++l) acc[j][l] = std::fma(a[i + 8 * j + l], b[i + 8 * j + l], acc[j][l]);
    float v[8];
    for (int l = 0; l < 8; ++l) v[l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
    float t[4];
    for (int l = 0; l < 4; ++l) t[l] = v[l] + v[l + 4];
    float sum = (t[0] + t[1]) + (t[2] + t[3]);
    for (; i < n; ++i) {
      const float product = rounded_product(a[i], b[i]);
      sum += product;
    }
    return sum;
  }
  static void mad(float* y, const float* x, float v, int64_t n) { mad_portable<32>(y, x, v, n); }
};

}  // namespace
}  // namespace inferd::kernels::detail
