#include "kernels/cpu/short_conv.h"

#include <cmath>

#include "kernels/cpu/kernel_table.h"

namespace inferd::kernels {

namespace detail {

void short_conv_scalar(const ShortConvArgs& a, int64_t c0, int64_t c1) {
  short_conv_tokens(a, c0, c1, [&](int64_t t, float* out, int64_t lo, int64_t hi) {
    for (int64_t c = lo; c < hi; ++c) {
      float sum = 0.0f;
      const int64_t rounded = rounded_taps(a.taps);
      for (int64_t i = 0; i < rounded; ++i)
        sum += rounded_product(short_conv_window_row(a, t + i)[c], a.weight[i * a.channels + c]);
      for (int64_t i = rounded; i < a.taps; ++i)
        sum = std::fma(short_conv_window_row(a, t + i)[c], a.weight[i * a.channels + c], sum);
      out[c] = sum;
    }
  });
}

}  // namespace detail

void fill_short_conv_kernels(FloatKernels& ops, SimdLevel level) {
  ops.short_conv = level >= SimdLevel::kAvx512 ? detail::short_conv_avx512
                   : level >= SimdLevel::kAvx2 ? detail::short_conv_avx2
                                               : detail::short_conv_scalar;
}

void short_conv(const ShortConvArgs& a, int64_t c0, int64_t c1) { kernel_table().ops.short_conv(a, c0, c1); }

void short_conv_weight_tap_major(const float* ggml_weight, int64_t taps, int64_t channels, float* out) {
  for (int64_t c = 0; c < channels; ++c)
    for (int64_t i = 0; i < taps; ++i) out[i * channels + c] = ggml_weight[c * taps + i];
}

}  // namespace inferd::kernels
