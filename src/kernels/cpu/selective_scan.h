// Mamba-2's selective scan, as GGML's ggml_ssm_scan computes it on the CPU for
// a scalar decay per head (llama.cpp's build_mamba2_layer runs that op for
// prompts and one-token steps alike), to the bit for the chosen build.
//
// Per head h (in group g = h / (n_heads / n_groups)), a state of head_dim rows
// of d_state, and per token:
//   dt' = softplus(dt[h])           (x itself above 20; libm)
//   dA  = e^(dt' * A[h])            (libm's expf)
//   per row i, with xdt = x[i] * dt':
//     s[i][k] = fma(s[i][k], dA, B[g][k] * xdt)
//     y[i]    = s[i] . C[g]
// GGML writes the update as two products and an add; GCC contracts the first
// product into the add (-ffp-contract=fast, checked in the disassembly of
// llama.cpp's AVX-512 build: vmulps, vfmadd231ps), in the vector steps and
// the tail alike.
// The dot product runs over GGML's vector steps in the build's order
// (flavour.h: four accumulators of 8 or 16 lanes, folded (0+2)+(1+3), then the
// lanes), the rest of d_state one element at a time (y = fma(s, C, y)).
// Every level gives the same bits for a flavour.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/flavour.h"

namespace inferd::kernels {

struct SelectiveScanArgs {
  const float* x = nullptr;   // per token: n_heads rows of head_dim, x_stride floats between tokens
  size_t x_stride = 0;
  const float* dt = nullptr;  // per token: n_heads time steps (their bias added), dt_stride
  size_t dt_stride = 0;
  const float* a = nullptr;   // n_heads decays (ssm_a: -exp(A_log))
  const float* b = nullptr;   // per token: n_groups rows of d_state, bc_stride
  const float* c = nullptr;   // likewise
  size_t bc_stride = 0;
  int64_t n_tokens = 0;
  int64_t n_heads = 0;
  int64_t head_dim = 0;
  int64_t n_groups = 0;  // divides n_heads
  int64_t d_state = 0;
  float* state = nullptr;  // n_heads x head_dim rows of d_state; read and updated
  float* y = nullptr;      // per token: n_heads rows of head_dim, y_stride
  size_t y_stride = 0;
};

// Heads [h0, h1) over all of a's tokens (threads that split the heads share
// nothing). y must not alias the inputs or the state.
void selective_scan(const SelectiveScanArgs& a, int64_t h0, int64_t h1, GgmlFlavour flavour);

namespace detail {
using SelectiveScanFn = void (*)(const SelectiveScanArgs& a, int64_t h0, int64_t h1);
// [flavour] at each level.
void selective_scan_scalar_avx512_order(const SelectiveScanArgs& a, int64_t h0, int64_t h1);
void selective_scan_scalar_avx2_order(const SelectiveScanArgs& a, int64_t h0, int64_t h1);
void selective_scan_avx2_avx512_order(const SelectiveScanArgs& a, int64_t h0, int64_t h1);
void selective_scan_avx2_avx2_order(const SelectiveScanArgs& a, int64_t h0, int64_t h1);
void selective_scan_avx512_avx512_order(const SelectiveScanArgs& a, int64_t h0, int64_t h1);
void selective_scan_avx512_avx2_order(const SelectiveScanArgs& a, int64_t h0, int64_t h1);
}  // namespace detail

}  // namespace inferd::kernels
