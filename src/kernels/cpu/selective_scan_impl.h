// The loop of selective_scan (selective_scan.h) written once; Ops names what
// each build and level does differently: the vector steps of one state row
// (Ops::row, returning the lanes' sum and how far it got). Included by files
// compiled with different instruction sets, hence internal linkage.
#pragma once
#include <cmath>

#include "kernels/cpu/attention_portable_impl.h"  // reduce16
#include "kernels/cpu/selective_scan.h"
#include "kernels/cpu/short_conv.h"  // rounded_product

namespace inferd::kernels::detail {
namespace {

// GGML's softplus (ggml_compute_softplus_f32).
inline float ggml_softplus(float x) { return x > 20.0f ? x : std::log(1.0f + std::exp(x)); }

struct RowSum {
  float sum;
  int64_t done;  // elements the vector steps covered
};

template <class Ops>
void selective_scan_of(const SelectiveScanArgs& a, int64_t h0, int64_t h1) {
  const int64_t N = a.d_state, P = a.head_dim, heads_per_group = a.n_heads / a.n_groups;
  for (int64_t t = 0; t < a.n_tokens; ++t) {
    const float* x = a.x + t * a.x_stride;
    const float* dt = a.dt + t * a.dt_stride;
    float* y = a.y + t * a.y_stride;
    for (int64_t h = h0; h < h1; ++h) {
      const float dt_sp = ggml_softplus(dt[h]);
      const float dA = std::exp(dt_sp * a.a[h]);
      const int64_t g = h / heads_per_group;
      const float* B = a.b + t * a.bc_stride + g * N;
      const float* C = a.c + t * a.bc_stride + g * N;
      for (int64_t i = 0; i < P; ++i) {
        float* s = a.state + (h * P + i) * N;
        const float xdt = x[h * P + i] * dt_sp;
        RowSum r = Ops::row(s, B, C, dA, xdt, N);
        for (int64_t k = r.done; k < N; ++k) {
          s[k] = std::fma(s[k], dA, rounded_product(B[k], xdt));
          r.sum = std::fma(s[k], C[k], r.sum);
        }
        y[h * P + i] = r.sum;
      }
    }
  }
}

// The vector steps in portable code: kAcc accumulators of kLanes lanes.
template <int kLanes>
RowSum portable_row(float* s, const float* B, const float* C, float dA, float xdt, int64_t n) {
  constexpr int64_t kStep = 4 * kLanes;
  float acc[4][kLanes] = {};
  int64_t k = 0;
  for (; k + kStep <= n; k += kStep) {
    for (int j = 0; j < 4; ++j) {
      for (int l = 0; l < kLanes; ++l) {
        const int64_t e = k + j * kLanes + l;
        const float v = std::fma(s[e], dA, rounded_product(B[e], xdt));
        acc[j][l] = std::fma(v, C[e], acc[j][l]);
        s[e] = v;
      }
    }
  }
  float v[kLanes];
  for (int l = 0; l < kLanes; ++l) v[l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
  if constexpr (kLanes == 16) {
    return {reduce16(v), k};
  } else {
    float q[4];
    for (int l = 0; l < 4; ++l) q[l] = v[l] + v[l + 4];
    return {(q[0] + q[1]) + (q[2] + q[3]), k};
  }
}

struct PortableAvx512Order {
  static RowSum row(float* s, const float* B, const float* C, float dA, float xdt, int64_t n) {
    return portable_row<16>(s, B, C, dA, xdt, n);
  }
};
struct PortableAvx2Order {
  static RowSum row(float* s, const float* B, const float* C, float dA, float xdt, int64_t n) {
    return portable_row<8>(s, B, C, dA, xdt, n);
  }
};

}  // namespace
}  // namespace inferd::kernels::detail
