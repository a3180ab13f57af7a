#include "kernels/cpu/rms_norm.h"

#include <cmath>

#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/quants.h"

namespace inferd::kernels {

namespace detail {

double sum_squares_in_order(const float* x, const float* h, int64_t n) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = h ? x[i] + h[i] : x[i];
    sum += static_cast<double>(v * v);
  }
  return sum;
}

double sum_squares_lanes_scalar(const float* x, const float* h, int64_t n) {
  return sum_squares_lanes_portable(x, h, n);
}

std::optional<float> mean_square_if_settled(double lane_sum, int64_t n) {
  if (!std::isfinite(lane_sum)) return std::nullopt;
  // Each of the two sums is within (n - 1) * 2^-53 * lane_sum (to first order)
  // of the exact one; the slack is four times their distance bound, so it also
  // covers the rounding of the three operations below.
  const double slack = lane_sum * static_cast<double>(n + 2) * 0x1p-50;
  const double dn = static_cast<double>(n);
  const float lo = static_cast<float>((lane_sum - slack) / dn);
  const float hi = static_cast<float>((lane_sum + slack) / dn);
  // Division and narrowing are monotone: GGML's mean lies between lo and hi.
  if (lo != hi) return std::nullopt;
  return lo;
}

}  // namespace detail

void fill_rms_norm_kernels(FloatKernels& ops, SimdLevel level) {
  ops.sum_squares_lanes = level >= SimdLevel::kAvx512 ? detail::sum_squares_lanes_avx512 : detail::sum_squares_lanes_scalar;
}

float rms_norm_scale(const float* x, const float* h, int64_t n, float eps) {
  std::optional<float> mean = detail::mean_square_if_settled(kernel_table().ops.sum_squares_lanes(x, h, n), n);
  if (!mean) mean = static_cast<float>(detail::sum_squares_in_order(x, h, n) / static_cast<double>(n));
  return 1.0f / std::sqrt(*mean + eps);
}

void rms_norm_row(const float* x, const float* h, const float* weight, int64_t n, float eps, int64_t c0,
                  int64_t c1, float* x_out, float* out) {
  const float scale = rms_norm_scale(x, h, n, eps);
  for (int64_t i = c0; i < c1; ++i) {
    const float v = h ? x[i] + h[i] : x[i];
    if (x_out) x_out[i] = v;
    out[i] = v * scale * weight[i];
  }
}

void l2_norm_row(float* x, int64_t n, float eps) {
  const float fn = static_cast<float>(n);
  const float scale = rms_norm_scale(x, nullptr, n, eps / fn);
  const float inv_sqrt_n = 1.0f / std::sqrt(fn);
  for (int64_t i = 0; i < n; ++i) {
    const float normed = x[i] * scale;
    x[i] = normed * inv_sqrt_n;
  }
}

}  // namespace inferd::kernels
