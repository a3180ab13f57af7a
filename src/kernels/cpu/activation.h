// Element-wise activations of the feed-forward block.
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/cpu/expf_poly.h"
#include "kernels/cpu/flavour.h"

namespace inferd::kernels {

// out[i] = silu(gate[i]) * up[i], silu(x) = x / (1 + e^-x): GGML's SwiGLU to
// the bit for the given build. kAvx512: e^x by expf_poly everywhere. kAvx2:
// blocks of 8 with expf_poly_avx2, the last n % 8 elements with libm's expf,
// as ggml_vec_swiglu_f32 runs on an AVX2 build. out may alias gate or up.
void swiglu(const float* gate, const float* up, float* out, int64_t n, GgmlFlavour flavour = GgmlFlavour::kAvx512);

// out[i] = gelu(gate[i]) * up[i] as GGML computes it (ggml_vec_geglu_f32 with
// its f16 GELU table): 0 for gate <= -10, gate * up for gate >= 10, otherwise
// gelu of gate rounded to f16, looked up in a table of f16 results of the tanh
// approximation 0.5x(1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2))), widened and
// times up. The same code runs on both GGML builds, so both flavours give the
// same bits. out may alias gate or up.
void geglu(const float* gate, const float* up, float* out, int64_t n, GgmlFlavour flavour);

// out[i] = gelu(x[i]) as GGML's ggml_vec_gelu_f32 computes it (GGML_GELU_FP16):
// geglu's cut-offs and f16 table without the up factor (x >= 10 gives x).
// out may alias x.
void gelu(const float* x, float* out, int64_t n);

// out[i] = silu(x[i]) = x / (1 + e^-x) as GGML's ggml_vec_silu_f32 computes it
// for the given build: whole vectors (16 lanes kAvx512, 8 lanes kAvx2) through
// its vector e^x (expf_poly), the rest through libm's expf. out may alias x.
void silu(const float* x, float* out, int64_t n, GgmlFlavour flavour);

// out[i] = 1 / (1 + e^-x[i]) with libm's expf, as GGML's sigmoid op (both
// builds). out may alias x.
void sigmoid(const float* x, float* out, int64_t n);

// out[i] = log(1 + e^x[i]), x itself above 20, as GGML's softplus op (both
// builds, libm). out may alias x.
void softplus(const float* x, float* out, int64_t n);

// gpt-oss's clamped SwiGLU as GGML's swiglu_oai computes it (alpha 1.702,
// limit 7; one scalar loop with libm's expf in both builds):
// x = min(gate, limit), y = clamp(up, -limit, limit),
// out = x / (1 + e^(alpha * -x)) * (y + 1). out may alias gate or up.
void swiglu_oai(const float* gate, const float* up, float* out, int64_t n);

namespace detail {
void swiglu_scalar(const float* gate, const float* up, float* out, int64_t n);
void swiglu_fma(const float* gate, const float* up, float* out, int64_t n);  // AVX2 + FMA
void swiglu_avx512(const float* gate, const float* up, float* out, int64_t n);
// The AVX2 build's order (kAvx2).
void swiglu_ggml_avx2_scalar(const float* gate, const float* up, float* out, int64_t n);
void swiglu_ggml_avx2_fma(const float* gate, const float* up, float* out, int64_t n);  // AVX2 + FMA
// silu in the order of each build: vectors of kLanes by expf_poly, the rest by libm.
void silu_scalar_avx512_order(const float* x, float* out, int64_t n);
void silu_scalar_avx2_order(const float* x, float* out, int64_t n);
void silu_avx2_avx2_order(const float* x, float* out, int64_t n);
void silu_avx512_avx512_order(const float* x, float* out, int64_t n);
void geglu_scalar(const float* gate, const float* up, float* out, int64_t n);
void geglu_f16c(const float* gate, const float* up, float* out, int64_t n);  // AVX2 + F16C
void gelu_scalar(const float* x, float* out, int64_t n);
void gelu_f16c(const float* x, float* out, int64_t n);    // AVX2 + F16C
void gelu_avx512(const float* x, float* out, int64_t n);  // the table gathered 16 lanes at a time

// GGML's f16 GELU table: entry h is gelu(f16 h) rounded to f16 (built on
// first use).
const uint16_t* gelu_f16_table();

// The element loops of every level but AVX-512 (compiled with and without FMA
// instructions; the same bits either way). Internal linkage, so each file keeps
// the copy built with its own instruction set.
namespace {
inline void swiglu_portable(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = gate[i];
    out[i] = x / (1.0f + expf_poly(0.0f - x)) * up[i];
  }
}

// ggml_vec_geglu_f32 (GGML_GELU_FP16): the cut-offs at +-10, else the table,
// with the f16 conversions given (software or F16C: the same bits).
template <class ToF16, class ToF32>
inline void geglu_portable(const float* gate, const float* up, float* out, int64_t n, ToF16 to_f16, ToF32 to_f32) {
  const uint16_t* table = gelu_f16_table();
  for (int64_t i = 0; i < n; ++i) {
    const float x = gate[i];
    if (x <= -10.0f) {
      out[i] = 0.0f;
    } else if (x >= 10.0f) {
      out[i] = x * up[i];
    } else {
      out[i] = to_f32(table[to_f16(x)]) * up[i];
    }
  }
}

// ggml_vec_gelu_f32 (GGML_GELU_FP16): geglu_portable without the up factor.
template <class ToF16, class ToF32>
inline void gelu_portable(const float* x, float* out, int64_t n, ToF16 to_f16, ToF32 to_f32) {
  const uint16_t* table = gelu_f16_table();
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    out[i] = v <= -10.0f ? 0.0f : v >= 10.0f ? v : to_f32(table[to_f16(v)]);
  }
}

template <int kLanes>
inline void silu_portable(const float* x, float* out, int64_t n) {
  const int64_t nv = n / kLanes * kLanes;
  for (int64_t i = 0; i < nv; ++i) {
    const float v = x[i];
    out[i] = v / (1.0f + (kLanes == 8 ? expf_poly_avx2(0.0f - v) : expf_poly(0.0f - v)));
  }
  for (int64_t i = nv; i < n; ++i) {
    const float v = x[i];
    out[i] = v / (1.0f + std::exp(-v));
  }
}

// ggml_vec_swiglu_f32 of the AVX2 build: whole blocks of 8 through the
// vector e^x, the remainder through libm's expf.
inline void swiglu_ggml_avx2_portable(const float* gate, const float* up, float* out, int64_t n) {
  const int64_t nv = n & ~int64_t{7};
  for (int64_t i = 0; i < nv; ++i) {
    const float x = gate[i];
    out[i] = x / (1.0f + expf_poly_avx2(0.0f - x)) * up[i];
  }
  for (int64_t i = nv; i < n; ++i) {
    const float x = gate[i];
    out[i] = x / (1.0f + std::exp(-x)) * up[i];
  }
}
}  // namespace
}  // namespace detail

}  // namespace inferd::kernels
