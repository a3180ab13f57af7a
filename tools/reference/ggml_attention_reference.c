// Reference outputs of GGML's own attention and gated activations, built and
// run as llama.cpp's CPU backend runs them (flash attention off, f16 K/V
// cache). Compiled and run by ggml_attention_reference.py against a libggml
// built natively (on an AVX2-only CPU: GGML's AVX2 build); see that script.
//
// Attention: one graph per case, the shape of llama.cpp's build_attn_mha
// without flash attention:
//   kq  = mul_mat(K, Q)                   K f16 [D, n_kv, n_head_kv] (permuted
//                                         view of the cache), Q f32 [D, n_tokens, n_head]
//   kq  = soft_max_ext(kq, mask, scale, 0) mask f32 [n_kv, n_tokens], 0 or -inf
//   kqv = mul_mat(V, kq)                  V f16 [n_kv, D, n_head_kv] (the
//                                         transposed cache: positions contiguous)
//   out = cont(permute(kqv, 0, 2, 1, 3))  [D, n_head, n_tokens]
// n_kv is the number of positions padded to 256, as llama.cpp pads its KV
// view; query token t sits at position n_past + t and sees positions
// [max(0, pos - window + 1), pos] (window 0: all of [0, pos]).
// Inputs come from splitmix64 (gen_* below), which the C++ test repeats.
//
// Softmax alone: ggml_soft_max_ext on rows of scores with a mask (run_softmax).
//
// Activations: ggml_swiglu_split(gate, up) and ggml_geglu_split(gate, up) on
// the inputs printed with them, and a sweep of geglu(x, 1) over every finite
// f16 x, summarized by FNV-1a hashes of the output bits.
//
// Usage: ggml_attention_reference ATTENTION_OUT ACTIVATION_OUT
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-cpu.h"
#include "ggml.h"

static uint64_t splitmix64(uint64_t* s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// A value exactly representable in f16: an 11-bit integer times 2^-10, in [-1, 1).
static float gen_kv(uint64_t* s) { return (float)((int32_t)(splitmix64(s) >> 53) - 1024) * 0x1p-10f; }
// A query value in [-4, 4) with 24 significant bits (GGML rounds it to f16).
static float gen_q(uint64_t* s) { return (float)((int32_t)(splitmix64(s) >> 40) - (1 << 23)) * 0x1p-21f; }

static uint32_t bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static void print_hex(FILE* f, const char* tag, const float* x, int64_t n) {
  fputs(tag, f);
  for (int64_t i = 0; i < n; ++i) fprintf(f, " %08x", bits(x[i]));
  fputc('\n', f);
}

static const int kThreads = 2;

struct AttnCase {
  int D, n_head, n_head_kv, n_tokens, n_past, window;
  float scale;  // 0: 1/sqrt(D)
};

static void run_attention(FILE* out, const struct AttnCase* c, uint64_t seed) {
  const int D = c->D, H = c->n_head, HKV = c->n_head_kv, T = c->n_tokens;
  const int n_pos = c->n_past + T;
  const int n_kv = (n_pos + 255) / 256 * 256;
  const float scale = c->scale != 0.0f ? c->scale : 1.0f / sqrtf((float)D);

  struct ggml_init_params ip = {(size_t)512 << 20, NULL, false};
  struct ggml_context* ctx = ggml_init(ip);

  // The cache as llama.cpp lays it out: K rows of D * n_head_kv per position;
  // V transposed, one row of n_kv positions per (head, dimension).
  struct ggml_tensor* k_cache = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, (int64_t)D * HKV, n_kv);
  struct ggml_tensor* v_cache = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, n_kv, (int64_t)D * HKV);
  struct ggml_tensor* q_cur = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, D, H, T);
  struct ggml_tensor* mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n_kv, T);

  uint64_t sk = seed * 4 + 1, sv = seed * 4 + 2, sq = seed * 4 + 3;
  ggml_fp16_t* kd = (ggml_fp16_t*)k_cache->data;
  ggml_fp16_t* vd = (ggml_fp16_t*)v_cache->data;
  for (int p = 0; p < n_kv; ++p)
    for (int h = 0; h < HKV; ++h)
      for (int d = 0; d < D; ++d) {
        kd[(int64_t)p * D * HKV + h * D + d] = ggml_fp32_to_fp16(gen_kv(&sk));
        vd[(int64_t)(h * D + d) * n_kv + p] = ggml_fp32_to_fp16(gen_kv(&sv));
      }
  float* qd = (float*)q_cur->data;
  for (int64_t i = 0; i < (int64_t)T * H * D; ++i) qd[i] = gen_q(&sq);
  float* md = (float*)mask->data;
  for (int t = 0; t < T; ++t) {
    const int pos = c->n_past + t;
    const int lo = c->window > 0 && pos - c->window + 1 > 0 ? pos - c->window + 1 : 0;
    for (int p = 0; p < n_kv; ++p) md[(int64_t)t * n_kv + p] = p >= lo && p <= pos ? 0.0f : -INFINITY;
  }

  // Views as llama.cpp's KV cache returns them, then build_attn_mha's permutes.
  struct ggml_tensor* k = ggml_view_3d(ctx, k_cache, D, HKV, n_kv, (size_t)D * 2, k_cache->nb[1], 0);
  struct ggml_tensor* v = ggml_view_3d(ctx, v_cache, n_kv, HKV, D, v_cache->nb[1] * D, v_cache->nb[1], 0);
  struct ggml_tensor* q = ggml_permute(ctx, q_cur, 0, 2, 1, 3);
  k = ggml_permute(ctx, k, 0, 2, 1, 3);
  v = ggml_permute(ctx, v, 0, 2, 1, 3);

  struct ggml_tensor* kq = ggml_mul_mat(ctx, k, q);
  ggml_prec_set_acc(kq, GGML_PREC_F32);
  kq = ggml_soft_max_ext(ctx, kq, mask, scale, 0.0f);
  struct ggml_tensor* kqv = ggml_mul_mat(ctx, v, kq);
  struct ggml_tensor* cur = ggml_cont(ctx, ggml_permute(ctx, kqv, 0, 2, 1, 3));

  struct ggml_cgraph* gf = ggml_new_graph(ctx);
  ggml_build_forward_expand(gf, cur);
  if (ggml_graph_compute_with_ctx(ctx, gf, kThreads) != GGML_STATUS_SUCCESS) {
    fprintf(stderr, "graph compute failed\n");
    exit(1);
  }
  if (cur->ne[0] != D || cur->ne[1] != H || cur->ne[2] != T) {
    fprintf(stderr, "unexpected output shape\n");
    exit(1);
  }
  fprintf(out, "attn %d %d %d %d %d %d %08x %llu\n", D, H, HKV, T, c->n_past, c->window, bits(scale),
          (unsigned long long)seed);
  print_hex(out, "out", (const float*)cur->data, (int64_t)D * H * T);
  ggml_free(ctx);
}

// ggml_soft_max_ext alone (scale 1, no ALiBi) on rows of n_kv scores with a
// mask of 0 / -inf: the f32 weights before llama.cpp rounds them to f16 for
// the product with V, where most last-bit differences of e^x would vanish.
// Row r's scores are uniform in [-spread_r, 0] plus a few near 0; it sees
// positions [lo_r, hi_r).
static void run_softmax(FILE* out, int n_kv, int rows, uint64_t seed) {
  struct ggml_init_params ip = {(size_t)64 << 20, NULL, false};
  struct ggml_context* ctx = ggml_init(ip);
  struct ggml_tensor* x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n_kv, rows);
  struct ggml_tensor* mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n_kv, rows);
  float* xd = (float*)x->data;
  float* md = (float*)mask->data;
  uint64_t s = seed;
  for (int r = 0; r < rows; ++r) {
    const float spread = r % 3 == 0 ? 8.0f : r % 3 == 1 ? 40.0f : 120.0f;
    const int lo = (int)(splitmix64(&s) % (uint64_t)(n_kv / 2));
    const int hi = lo + 1 + (int)(splitmix64(&s) % (uint64_t)(n_kv - lo));
    for (int p = 0; p < n_kv; ++p) {
      const float u = (float)(splitmix64(&s) >> 40) * 0x1p-24f;  // [0, 1)
      xd[(int64_t)r * n_kv + p] = -u * spread;
      md[(int64_t)r * n_kv + p] = p >= lo && p < hi ? 0.0f : -INFINITY;
    }
  }
  struct ggml_tensor* y = ggml_soft_max_ext(ctx, x, mask, 1.0f, 0.0f);
  struct ggml_cgraph* gf = ggml_new_graph(ctx);
  ggml_build_forward_expand(gf, y);
  if (ggml_graph_compute_with_ctx(ctx, gf, kThreads) != GGML_STATUS_SUCCESS) {
    fprintf(stderr, "graph compute failed\n");
    exit(1);
  }
  for (int r = 0; r < rows; ++r) {
    fprintf(out, "softmax %d\n", n_kv);
    print_hex(out, "in", xd + (int64_t)r * n_kv, n_kv);
    print_hex(out, "mask", md + (int64_t)r * n_kv, n_kv);
    print_hex(out, "out", (const float*)y->data + (int64_t)r * n_kv, n_kv);
  }
  ggml_free(ctx);
}

// out = op(gate, up) for n elements; op 0: swiglu_split, 1: geglu_split.
static void run_glu(int op, const float* gate, const float* up, float* out, int64_t n) {
  struct ggml_init_params ip = {(size_t)64 << 20, NULL, false};
  struct ggml_context* ctx = ggml_init(ip);
  struct ggml_tensor* a = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, n);
  struct ggml_tensor* b = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, n);
  memcpy(a->data, gate, (size_t)n * 4);
  memcpy(b->data, up, (size_t)n * 4);
  struct ggml_tensor* r = op == 0 ? ggml_swiglu_split(ctx, a, b) : ggml_geglu_split(ctx, a, b);
  struct ggml_cgraph* gf = ggml_new_graph(ctx);
  ggml_build_forward_expand(gf, r);
  if (ggml_graph_compute_with_ctx(ctx, gf, 1) != GGML_STATUS_SUCCESS) {
    fprintf(stderr, "graph compute failed\n");
    exit(1);
  }
  memcpy(out, r->data, (size_t)n * 4);
  ggml_free(ctx);
}

static void run_activations(FILE* out) {
  enum { N = 1003 };  // not a multiple of 8 or 16: the scalar tails run too
  static float gate[N], up[N], y[N];
  uint64_t s = 77;
  // Special values first: the ends of e^x's range, GELU's +-10 cut-offs, zeros,
  // tiny values and values next to f16 rounding boundaries.
  const float special[] = {-120.0f, 120.0f, 0.0f, -0.0f, 88.0f, -88.0f, 87.5f, -87.5f, 89.0f, -89.0f,
                           100.0f, -100.0f, 10.0f, -10.0f, 9.999f, -9.999f, 10.001f, -10.001f, 1e-8f,
                           -1e-8f, 6e-5f, -6e-5f, 3e-8f, 1.0f, -1.0f, 0.5f, 1.00048828125f, 1.000732421875f,
                           -3.0f, 5.5f};
  const int n_special = (int)(sizeof special / sizeof special[0]);
  for (int i = 0; i < N; ++i) {
    const float u = (float)((int32_t)(splitmix64(&s) >> 40) - (1 << 23)) * 0x1p-23f;  // [-1, 1)
    if (i < n_special) {
      gate[i] = special[i];
    } else if (i % 7 == 0) {
      gate[i] = u * 1e-3f;  // small: the f16 table's fine steps
    } else {
      gate[i] = u * 12.0f;
    }
    up[i] = (float)((int32_t)(splitmix64(&s) >> 40) - (1 << 23)) * 0x1p-21f;  // [-4, 4)
  }
  for (int op = 0; op < 2; ++op) {
    run_glu(op, gate, up, y, N);
    fprintf(out, "%s %d\n", op == 0 ? "swiglu" : "geglu", N);
    print_hex(out, "gate", gate, N);
    print_hex(out, "up", up, N);
    print_hex(out, "out", y, N);
  }

  // geglu(x, 1) for every f16 x but NaNs, in order of the f16 bit pattern;
  // one FNV-1a hash of the output bits per 4096 patterns.
  static float xs[65536], ones[65536], ys[65536];
  int n = 0;
  for (int h = 0; h < 65536; ++h) {
    if ((h & 0x7c00) == 0x7c00 && (h & 0x03ff) != 0) continue;  // NaN
    xs[n] = ggml_fp16_to_fp32((ggml_fp16_t)h);
    ones[n] = 1.0f;
    ++n;
  }
  run_glu(1, xs, ones, ys, n);
  fprintf(out, "geglu_f16_sweep %d", n);
  for (int seg = 0; seg * 4096 < n; ++seg) {
    uint64_t hash = 0xcbf29ce484222325ull;
    for (int i = seg * 4096; i < n && i < (seg + 1) * 4096; ++i) {
      const uint32_t b = bits(ys[i]);
      for (int byte = 0; byte < 4; ++byte) hash = (hash ^ ((b >> (8 * byte)) & 0xff)) * 0x100000001b3ull;
    }
    fprintf(out, " %016llx", (unsigned long long)hash);
  }
  fputc('\n', out);
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s ATTENTION_OUT ACTIVATION_OUT\n", argv[0]);
    return 2;
  }
  ggml_cpu_init();
  FILE* fa = fopen(argv[1], "w");
  FILE* fg = fopen(argv[2], "w");
  if (!fa || !fg) {
    perror("fopen");
    return 1;
  }

  // D, n_head, n_head_kv, n_tokens, n_past, window, scale
  const struct AttnCase cases[] = {
      // one-token steps (ggml_vec_dot_f16 for both products)
      {64, 2, 1, 1, 0, 0, 0}, {64, 2, 1, 1, 4, 0, 0},  {64, 2, 1, 1, 15, 0, 0},  {64, 2, 1, 1, 31, 0, 0},
      {64, 2, 1, 1, 63, 0, 0}, {64, 2, 1, 1, 100, 0, 0}, {64, 2, 1, 1, 299, 0, 0}, {64, 4, 2, 1, 700, 0, 0},
      {64, 2, 1, 1, 700, 512, 0}, {64, 2, 1, 1, 90, 37, 0},
      {128, 2, 1, 1, 0, 0, 0}, {128, 2, 1, 1, 20, 0, 0}, {128, 2, 1, 1, 64, 0, 0}, {128, 2, 1, 1, 260, 0, 0},
      {128, 2, 1, 1, 300, 100, 0}, {128, 2, 1, 1, 50, 0, 1.0f},
      {256, 2, 1, 1, 0, 0, 0}, {256, 2, 1, 1, 9, 0, 0}, {256, 1, 1, 1, 77, 0, 1.0f}, {256, 2, 1, 1, 520, 0, 0},
      {256, 2, 1, 1, 600, 512, 0},
      // several tokens (tinyBLAS for both products)
      {64, 2, 1, 2, 0, 0, 0}, {64, 2, 1, 3, 13, 0, 0}, {64, 2, 1, 7, 0, 0, 0}, {64, 4, 2, 3, 250, 0, 0},
      {64, 2, 1, 3, 600, 0, 0}, {64, 2, 1, 3, 700, 512, 0}, {64, 2, 1, 5, 40, 19, 0},
      {128, 2, 1, 3, 0, 0, 0}, {128, 2, 1, 2, 33, 0, 0}, {128, 2, 1, 3, 300, 100, 0}, {128, 1, 1, 2, 500, 0, 1.0f},
      {256, 2, 1, 2, 0, 0, 0}, {256, 1, 1, 3, 45, 0, 0}, {256, 1, 1, 2, 333, 0, 0}, {256, 1, 1, 2, 600, 512, 1.0f},
      // head sizes that are not a multiple of 32: ggml_vec_dot_f16 ends in a double tail
      {80, 2, 1, 1, 50, 0, 0}, {80, 2, 1, 3, 50, 0, 0}, {96, 2, 1, 1, 130, 0, 0}, {96, 2, 1, 2, 130, 0, 0},
  };
  fprintf(fa, "# attn D n_head n_head_kv n_tokens n_past window scale_bits seed\n");
  fprintf(fa, "# out: f32 bits, [token][head][D]\n");
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) run_attention(fa, &cases[i], 1000 + i);
  fprintf(fa, "# softmax n_kv: in (scores), mask (0 or -inf), out (f32 weights)\n");
  run_softmax(fa, 256, 3, 5);
  run_softmax(fa, 512, 3, 6);
  run_activations(fg);
  fclose(fa);
  fclose(fg);
  return 0;
}
