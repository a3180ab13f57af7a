// The causal short convolution of a Gated DeltaNet layer (depthwise, one
// kernel of `taps` weights per channel) as GGML's ggml_ssm_conv computes it,
// to the bit: for token t and channel c,
//   out[t][c] = sum over i = 0 .. taps-1 of window[t + i][c] * w[i][c],
// summed in float in order from 0, where window is the sequence's last
// taps - 1 inputs (the conv state) followed by this call's tokens. GGML's
// build (GCC, FMA enabled) vectorizes that loop's products over whole runs of
// 8 taps, each product rounded before its add, and fuses the remaining
// taps % 8 into fma's: rounded_taps() says how many are rounded. (Every
// Qwen3.5 has 4 taps: all fused.) Every order of the sum is fixed, so every
// level gives the same bits.
//
// The state is what makes chunked prompts and decode steps equal one long
// call: after the call it holds the last taps - 1 rows of the window.
#pragma once
#include <cstddef>
#include <cstdint>

namespace inferd::kernels {

struct ShortConvArgs {
  const float* x = nullptr;      // n_tokens rows of `channels`, x_stride floats apart
  size_t x_stride = 0;
  int64_t n_tokens = 0;
  int64_t channels = 0;
  const float* weight = nullptr;  // taps rows of `channels` (tap-major: w[i * channels + c])
  int64_t taps = 0;               // >= 1
  float* state = nullptr;         // taps - 1 rows of `channels`, oldest first; read and updated
  float* out = nullptr;           // n_tokens rows of `channels`, out_stride floats apart
  size_t out_stride = 0;
};

// Channels [c0, c1) of the convolution and of the state update (threads that
// split the channels share nothing). out must not alias x or state.
void short_conv(const ShortConvArgs& a, int64_t c0, int64_t c1);

// GGML's weight tensor (ne0 = taps, one row per channel: w[c * taps + i]) into
// the tap-major layout short_conv reads, once at load.
void short_conv_weight_tap_major(const float* ggml_weight, int64_t taps, int64_t channels, float* out);

namespace detail {
void short_conv_scalar(const ShortConvArgs& a, int64_t c0, int64_t c1);
void short_conv_avx2(const ShortConvArgs& a, int64_t c0, int64_t c1);
void short_conv_avx512(const ShortConvArgs& a, int64_t c0, int64_t c1);

namespace {
// The taps whose products are rounded before their add; the rest are fused.
inline int64_t rounded_taps(int64_t taps) { return taps - taps % 8; }

// a * b rounded to float, kept apart from whatever add follows: C++ lets GCC
// contract a product and a sum into one fma (-ffp-contract=fast), which would
// change the bits; the empty asm makes the product a value it must produce.
inline float rounded_product(float a, float b) {
  float p = a * b;
  __asm__("" : "+x"(p));
  return p;
}

// The state update every level shares: the window's last taps - 1 rows.
inline void short_conv_shift_state(const ShortConvArgs& a, int64_t c0, int64_t c1) {
  const int64_t keep = a.taps - 1;
  if (keep <= 0) return;
  if (a.n_tokens >= keep) {
    for (int64_t r = 0; r < keep; ++r) {
      const float* src = a.x + (a.n_tokens - keep + r) * a.x_stride;
      for (int64_t c = c0; c < c1; ++c) a.state[r * a.channels + c] = src[c];
    }
    return;
  }
  // Fewer new tokens than the window keeps: slide the old rows up first.
  const int64_t old = keep - a.n_tokens;
  for (int64_t r = 0; r < old; ++r)
    for (int64_t c = c0; c < c1; ++c) a.state[r * a.channels + c] = a.state[(r + a.n_tokens) * a.channels + c];
  for (int64_t r = 0; r < a.n_tokens; ++r)
    for (int64_t c = c0; c < c1; ++c) a.state[(old + r) * a.channels + c] = a.x[r * a.x_stride + c];
}

// Row t + i of the window: a state row while t + i < taps - 1, else an input.
inline const float* short_conv_window_row(const ShortConvArgs& a, int64_t row) {
  const int64_t keep = a.taps - 1;
  return row < keep ? a.state + row * a.channels : a.x + (row - keep) * a.x_stride;
}

template <class Body>
inline void short_conv_tokens(const ShortConvArgs& a, int64_t c0, int64_t c1, Body body) {
  for (int64_t t = 0; t < a.n_tokens; ++t) body(t, a.out + t * a.out_stride, c0, c1);
  short_conv_shift_state(a, c0, c1);
}
}  // namespace
}  // namespace detail

}  // namespace inferd::kernels
