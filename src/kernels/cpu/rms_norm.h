// RMSNorm of one row as GGML's CPU backend computes it, to the bit: squares in
// float, summed in double in index order, mean = float(sum / n),
// scale = 1 / sqrt(mean + eps) in float, out = x * scale * w.
//
// GGML's in-order double sum is a chain of n dependent additions (about 1 µs
// for a 576-wide row, twice per layer in decode). We sum in 16 independent
// lanes instead and keep GGML's bits with an error bound: both sums lie within
// (n - 1) * 2^-53 * sum of the exact one (all terms are >= 0), so when every
// double in that interval gives the same float mean, it is GGML's mean too.
// Otherwise (about once in 10^5 rows, and for rows holding inf or NaN) the
// row is summed in order.
#pragma once
#include <cstdint>
#include <optional>

namespace inferd::kernels {

// The scale of the row x + h (x alone when h is null).
float rms_norm_scale(const float* x, const float* h, int64_t n, float eps);

// The row x + h (x when h is null) normalized: columns [c0, c1) of it into
// x_out (when not null) and of the normalized row into out. Threads that share
// a row each compute the same scale and write their own columns.
void rms_norm_row(const float* x, const float* h, const float* weight, int64_t n, float eps, int64_t c0,
                  int64_t c1, float* x_out, float* out);

// The L2 normalization llama.cpp gives Gated DeltaNet's q and k: an RMSNorm
// with epsilon eps / n and no weight, then a scale by 1 / sqrt(n), in place
// (out = x * rms_scale * (1 / sqrt(n)), each product rounded, as GGML's two ops).
void l2_norm_row(float* x, int64_t n, float eps);

namespace detail {
// GGML's sum: sum += (double)(v * v), i = 0 .. n-1.
double sum_squares_in_order(const float* x, const float* h, int64_t n);
// The same terms summed in 16 lanes (any level gives the same bits).
double sum_squares_lanes_scalar(const float* x, const float* h, int64_t n);
double sum_squares_lanes_avx512(const float* x, const float* h, int64_t n);
// float(sum / n) from a lane sum when the error bound settles it, else nothing.
std::optional<float> mean_square_if_settled(double lane_sum, int64_t n);

namespace {
// The lane sum, compiled once per level (internal linkage, like
// swiglu_portable). GCC vector types keep 16 lanes however wide the registers.
inline double sum_squares_lanes_portable(const float* x, const float* h, int64_t n) {
  typedef float F16x __attribute__((vector_size(64)));
  typedef double D8x __attribute__((vector_size(64)));
  D8x lo = {}, hi = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    F16x v, w;
    __builtin_memcpy(&v, x + i, sizeof v);
    if (h) {
      __builtin_memcpy(&w, h + i, sizeof w);
      v += w;
    }
    const F16x sq = v * v;
    lo += __builtin_convertvector(__builtin_shufflevector(sq, sq, 0, 1, 2, 3, 4, 5, 6, 7), D8x);
    hi += __builtin_convertvector(__builtin_shufflevector(sq, sq, 8, 9, 10, 11, 12, 13, 14, 15), D8x);
  }
  double sum = 0.0;
  for (int k = 0; k < 8; ++k) sum += lo[k] + hi[k];
  for (; i < n; ++i) {
    const float v = h ? x[i] + h[i] : x[i];
    sum += static_cast<double>(v * v);
  }
  return sum;
}
}  // namespace
}  // namespace detail

}  // namespace inferd::kernels
