#include "kernels/cpu/activation.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "kernels/cpu/expf_poly.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/quants.h"

namespace inferd::kernels {

namespace detail {

void swiglu_scalar(const float* gate, const float* up, float* out, int64_t n) { swiglu_portable(gate, up, out, n); }

void silu_scalar_avx512_order(const float* x, float* out, int64_t n) { silu_portable<16>(x, out, n); }
void silu_scalar_avx2_order(const float* x, float* out, int64_t n) { silu_portable<8>(x, out, n); }

void swiglu_ggml_avx2_scalar(const float* gate, const float* up, float* out, int64_t n) {
  swiglu_ggml_avx2_portable(gate, up, out, n);
}

namespace {

// GGML's GELU (tanh form) in single precision, as its table is built: GCC
// contracts 1 + a*x*x into one fma there (GGML is compiled as GNU C, where
// contraction is on), so we write that fma; tanhf is libm's.
float gelu_tanh(float x) {
  constexpr float kSqrt2OverPi = 0.79788456080286535587989211986876f;
  constexpr float kCoefA = 0.044715f;
  return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * x * std::fma(kCoefA * x, x, 1.0f)));
}

}  // namespace

const uint16_t* gelu_f16_table() {
  // Two entries past the end: a vector gather reads each entry as 32 bits.
  static const std::array<uint16_t, 65536 + 2> table = [] {
    std::array<uint16_t, 65536 + 2> t{};
    for (uint32_t h = 0; h < 65536; ++h) t[h] = f32_to_f16(gelu_tanh(f16_to_f32(static_cast<uint16_t>(h))));
    return t;
  }();
  return table.data();
}

// ggml_vec_geglu_f32 with the f16 conversions in software.
void geglu_scalar(const float* gate, const float* up, float* out, int64_t n) {
  geglu_portable(gate, up, out, n, [](float x) { return f32_to_f16(x); }, [](uint16_t h) { return f16_to_f32(h); });
}

void gelu_scalar(const float* x, float* out, int64_t n) {
  gelu_portable(x, out, n, [](float v) { return f32_to_f16(v); }, [](uint16_t h) { return f16_to_f32(h); });
}

}  // namespace detail

void fill_activation_kernels(FloatKernels& ops, SimdLevel level) {
  ops.gelu = level >= SimdLevel::kAvx512 ? detail::gelu_avx512
             : level >= SimdLevel::kAvx2 ? detail::gelu_f16c
                                         : detail::gelu_scalar;
  // GGML's AVX2 build: AVX-512 CPUs run the AVX2 kernel too.
  ops.swiglu[static_cast<int>(GgmlFlavour::kAvx2)] =
      level >= SimdLevel::kAvx2 ? detail::swiglu_ggml_avx2_fma : detail::swiglu_ggml_avx2_scalar;
  ops.swiglu[static_cast<int>(GgmlFlavour::kAvx512)] = level >= SimdLevel::kAvx512 ? detail::swiglu_avx512
                                                       : level == SimdLevel::kAvx2 ? detail::swiglu_fma
                                                                                   : detail::swiglu_scalar;
  ops.geglu = level >= SimdLevel::kAvx2 ? detail::geglu_f16c : detail::geglu_scalar;
  ops.silu[static_cast<int>(GgmlFlavour::kAvx2)] =
      level >= SimdLevel::kAvx2 ? detail::silu_avx2_avx2_order : detail::silu_scalar_avx2_order;
  ops.silu[static_cast<int>(GgmlFlavour::kAvx512)] =
      level >= SimdLevel::kAvx512 ? detail::silu_avx512_avx512_order : detail::silu_scalar_avx512_order;
}

void silu(const float* x, float* out, int64_t n, GgmlFlavour flavour) {
  kernel_table().ops.silu[static_cast<int>(flavour)](x, out, n);
}

void sigmoid(const float* x, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = 1.0f / (1.0f + std::exp(-x[i]));
}

void softplus(const float* x, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] > 20.0f ? x[i] : std::log(1.0f + std::exp(x[i]));
}

void swiglu(const float* gate, const float* up, float* out, int64_t n, GgmlFlavour flavour) {
  kernel_table().ops.swiglu[static_cast<int>(flavour)](gate, up, out, n);
}

void swiglu_oai(const float* gate, const float* up, float* out, int64_t n) {
  constexpr float kAlpha = 1.702f, kLimit = 7.0f;  // llama.cpp's build_moe_ffn constants
  for (int64_t i = 0; i < n; ++i) {
    const float x = std::min(gate[i], kLimit);
    const float y = std::clamp(up[i], -kLimit, kLimit);
    const float glu = x / (1.0f + std::exp(kAlpha * (-x)));
    out[i] = glu * (y + 1.0f);
  }
}

void gelu(const float* x, float* out, int64_t n) { kernel_table().ops.gelu(x, out, n); }

void geglu(const float* gate, const float* up, float* out, int64_t n, GgmlFlavour /*flavour: same bits*/) {
  kernel_table().ops.geglu(gate, up, out, n);
}

}  // namespace inferd::kernels
