// Expected outputs of Mamba-2's selective scan from GGML's CPU backend itself,
// for tests/unit/kernels_selective_scan_test.cpp.
//
// Runs ggml_ssm_scan with a scalar decay per head (A of shape [1, heads]: the
// Mamba-2 case llama.cpp's build_mamba2_layer builds) on one sequence, for
// state sizes below, at and past each build's vector step (16, 80, 128, 200)
// with one token (a decode step) and several (a prompt), heads in 1 to 4
// groups, and time steps on both sides of softplus's cut at 20. The inputs
// come from the generator below and are written into the file with GGML's
// outputs, so the test reads them rather than repeating the generator.
//
// Which build's arithmetic the file pins down is the libggml's: the native
// (AVX-512) build of bench/build_llama_cpp.sh writes ggml_ssm_scan_avx512.bin;
// ggml_ssm_scan_avx2.bin came from ggml alone built with -DGGML_NATIVE=OFF
// -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
// -DGGML_AVX512=OFF (ninja ggml-cpu ggml; the same source).
//
// Build and run:
//   L=~/.cache/inferd/llama.cpp
//   cc -O2 -std=c11 -I$L/src/ggml/include tools/reference/ggml_ssm_scan_reference.c
//      -L$L/build/bin -lggml -lggml-base -lggml-cpu -lm -Wl,-rpath,$L/build/bin -o /tmp/ggml_ssm_scan_reference
//   /tmp/ggml_ssm_scan_reference tests/data/kernels/ggml_ssm_scan_avx512.bin
//
// Format (little-endian): "SSMSCAN1", int32 case count; per case int32
// n_tokens, n_heads, head_dim, n_groups, d_state, then float32 arrays in GGML's
// layouts (ours too): x [tokens][heads][head_dim], dt [tokens][heads],
// A [heads], B and C [tokens][groups][d_state], the state before
// [heads][head_dim][d_state], then GGML's y (as x) and the state after.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-cpu.h"
#include "ggml.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

// Uniform in [lo, hi), from a 64-bit LCG's top 24 bits.
static float uniform(float lo, float hi) {
  rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
  return lo + (hi - lo) * (float)(rng_state >> 40) / 16777216.0f;
}

static void fill(struct ggml_tensor* t, float lo, float hi) {
  float* d = (float*)t->data;
  for (int64_t i = 0; i < ggml_nelements(t); ++i) d[i] = uniform(lo, hi);
}

static void put(FILE* f, const void* data, size_t bytes) {
  if (fwrite(data, 1, bytes, f) != bytes) {
    perror("write");
    exit(1);
  }
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s OUT\n", argv[0]);
    return 1;
  }
  // n_tokens, n_heads, head_dim, n_groups, d_state
  static const int32_t cases[][5] = {
      {1, 6, 4, 3, 16}, {5, 6, 4, 3, 16}, {1, 4, 8, 2, 80}, {5, 4, 8, 2, 80},
      {1, 4, 8, 1, 128}, {7, 4, 8, 4, 128}, {3, 2, 4, 2, 200},
  };
  const int32_t n_cases = (int32_t)(sizeof cases / sizeof cases[0]);
  FILE* f = fopen(argv[1], "wb");
  if (!f) {
    perror(argv[1]);
    return 1;
  }
  put(f, "SSMSCAN1", 8);
  put(f, &n_cases, sizeof n_cases);
  for (int32_t k = 0; k < n_cases; ++k) {
    const int64_t T = cases[k][0], H = cases[k][1], P = cases[k][2], G = cases[k][3], N = cases[k][4];
    struct ggml_init_params params = {64 << 20, NULL, false};
    struct ggml_context* ctx = ggml_init(params);
    struct ggml_tensor* s = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, N, P, H, 1);
    struct ggml_tensor* x = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, P, H, T, 1);
    struct ggml_tensor* dt = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, H, T, 1);
    struct ggml_tensor* A = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 1, H);
    struct ggml_tensor* B = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, N, G, T, 1);
    struct ggml_tensor* C = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, N, G, T, 1);
    struct ggml_tensor* ids = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 1);
    fill(x, -1.0f, 1.0f);
    fill(dt, -4.0f, 3.0f);
    for (int64_t i = 0; i < T * H; i += 5) ((float*)dt->data)[i] = uniform(20.5f, 23.0f);  // past softplus's cut
    for (int64_t h = 0; h < H; ++h) ((float*)A->data)[h] = -expf(uniform(-2.0f, 1.0f));
    fill(B, -1.0f, 1.0f);
    fill(C, -1.0f, 1.0f);
    fill(s, -0.5f, 0.5f);
    ((int32_t*)ids->data)[0] = 0;
    struct ggml_tensor* out = ggml_ssm_scan(ctx, s, x, dt, A, B, C, ids, 1);
    struct ggml_cgraph* gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    if (ggml_graph_compute_with_ctx(ctx, gf, 2) != GGML_STATUS_SUCCESS) {
      fprintf(stderr, "ggml_graph_compute_with_ctx failed\n");
      return 1;
    }
    put(f, cases[k], sizeof cases[k]);
    struct ggml_tensor* inputs[] = {x, dt, A, B, C, s};
    for (size_t i = 0; i < sizeof inputs / sizeof inputs[0]; ++i) put(f, inputs[i]->data, ggml_nbytes(inputs[i]));
    put(f, out->data, ggml_nbytes(out));  // y, then the state after
    ggml_free(ctx);
  }
  fclose(f);
  fprintf(stderr, "wrote %d cases to %s\n", n_cases, argv[1]);
  return 0;
}
