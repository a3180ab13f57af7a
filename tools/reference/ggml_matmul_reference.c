// Expected matmul outputs from GGML's CPU backend itself, for
// tests/unit/kernels_ggml_matmul_test.cpp.
//
// Runs ggml_mul_mat (weights x f32 activations) through the CPU backend the way
// llama.cpp does: a weight goes into the CPU "repack" extra buffer when the
// backend says it can take it there (ggml_backend_dev_supports_op with the
// weight in that buffer type, as llama-model-loader decides), else into a
// plain CPU buffer; the backend then picks vec_dot, llamafile's tinyBLAS, the
// tiled K-quant kernels or the repacked gemv/gemm, for N = 1, 2, 3, 4, 5, 8, 17
// activation rows (the Q4_0 and Q5_0 cases appended last: N = 1..9, 12, 16, 17). Every
// case is run with 1 and 3 threads, which must agree.
//
// Weights: the first 8 rows of real tensors of the model files when present,
// plus random rows quantized by GGML (ggml_quantize_chunk) for the other types.
// Activations: made by the generator below, which the test repeats exactly.
//
// Build (against a shared-libs build of llama.cpp, bench/build_llama_cpp.sh):
//   L=~/.cache/inferd/llama.cpp
//   cc -O2 -std=c11 -I$L/src/ggml/include tools/reference/ggml_matmul_reference.c
//      -L$L/build/bin -lggml -lggml-base -lggml-cpu -Wl,-rpath,$L/build/bin -o /tmp/ggml_matmul_reference
//   /tmp/ggml_matmul_reference ~/.cache/inferd/models tests/data/kernels/ggml_matmul_avx2.bin
//
// With --mxfp4 in place of MODEL_DIR it writes the MXFP4 cases only (the same
// format), which read the same in GGML's AVX2 and AVX-512 builds:
//   /tmp/ggml_matmul_reference --mxfp4 tests/data/kernels/ggml_matmul_mxfp4_avx512.bin
// against the native (AVX-512) build, and ..._avx2.bin against a build of
// ggml with -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AVX512=OFF (AVX, FMA,
// F16C, BMI2 on). Its mul_mat cases go through ggml_mul_mat; its ".mmid" cases
// through ggml_mul_mat_id, as gpt-oss multiplies its experts: a 3-D weight of
// two experts, every token routed to both (ids {0, 1} or {1, 0} by token), and
// each expert written as a case of its own (its rows, its outputs per token).
//
// Output (little-endian): "IFMM0001", u32 n_cases, then per case:
//   char name[48] | u32 ggml_type | u32 rows | u32 cols | u32 seed | u32 repacked (1: weight in the
//   repack buffer) | u64 weight_bytes | weight bytes | u32 n_runs | per run: u32 N | f32 y[N * rows]
//   (y[t * rows + r] = W row r . activation row t).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "gguf.h"

enum { kRealRows = 8, kRandomRows = 16, kMaxN = 17 };
static const int kNs[] = {1, 2, 3, 4, 5, 8, 17};
enum { kNumNs = sizeof(kNs) / sizeof(kNs[0]) };
// Every step size up to 9 (the repacked gemm takes a step's first N - N % 4
// tokens, the gemv the rest), and some larger.
static const int kStepNs[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 17};
enum { kNumStepNs = sizeof(kStepNs) / sizeof(kStepNs[0]) };

// Activation row t of a case (cols floats), repeated by the test: an xorshift32
// stream per row, each value one exact int times one power-of-two-based scale
// (a single rounding), and on every third row a tie between a negative and a
// positive extreme of each 256-block, the negative first (GGML's Q8_K
// quantizers break that tie differently).
static void make_activations(uint32_t seed, int t, int cols, float* x) {
  uint32_t s = seed * 2654435761u + (uint32_t)t * 40503u + 1u;
  const float k = (float)(1 + t % 5) * (1.0f / 8388608.0f);
  for (int c = 0; c < cols; ++c) {
    s ^= s << 13;
    s ^= s >> 17;
    s ^= s << 5;
    x[c] = (float)((int32_t)(s >> 8) - 8388608) * k;
  }
  if (t % 3 == 1) {
    for (int b = 0; b + 256 <= cols; b += 256) {
      x[b + 5] = -4.0f * (float)(1 + t % 5);
      x[b + 100] = 4.0f * (float)(1 + t % 5);
    }
  }
}

static ggml_backend_buffer_type_t repack_buft(ggml_backend_dev_t dev) {
  ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
  ggml_backend_dev_get_extra_bufts_t get =
      (ggml_backend_dev_get_extra_bufts_t)ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
  if (get == NULL) return NULL;
  for (ggml_backend_buffer_type_t* p = get(dev); p != NULL && *p != NULL; ++p) {
    if (strcmp(ggml_backend_buft_name(*p), "CPU_REPACK") == 0) return *p;
  }
  return NULL;
}

// Would llama.cpp put this weight into the repack buffer? The same test as
// llama-model-loader's: the device supports the op with the weight there.
static int goes_to_repack(ggml_backend_dev_t dev, ggml_backend_buffer_type_t buft, enum ggml_type type, int rows,
                          int cols) {
  if (buft == NULL) return 0;
  struct ggml_init_params ip = {16 * ggml_tensor_overhead() + ggml_graph_overhead(), NULL, true};
  struct ggml_context* ctx = ggml_init(ip);
  struct ggml_tensor* w = ggml_new_tensor_2d(ctx, type, cols, rows);
  struct ggml_tensor* x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, cols, 4);
  struct ggml_tensor* y = ggml_mul_mat(ctx, w, x);
  ggml_backend_buffer_t dummy = ggml_backend_buft_alloc_buffer(buft, 0);
  w->buffer = dummy;
  const int ok = ggml_backend_dev_supports_op(dev, y);
  w->buffer = NULL;
  ggml_backend_buffer_free(dummy);
  ggml_free(ctx);
  return ok;
}

// y (N x rows) = W x activations, on `threads` threads.
static void run_matmul(ggml_backend_t backend, ggml_backend_buffer_type_t wbuft, enum ggml_type type, int rows,
                       int cols, const void* wbytes, const float* x, int n, int threads, float* y) {
  struct ggml_init_params ip = {8 * ggml_tensor_overhead(), NULL, true};
  struct ggml_context* wctx = ggml_init(ip);
  struct ggml_tensor* w = ggml_new_tensor_2d(wctx, type, cols, rows);
  ggml_backend_buffer_t wbuf = ggml_backend_alloc_ctx_tensors_from_buft(wctx, wbuft);
  ggml_backend_tensor_set(w, wbytes, 0, ggml_nbytes(w));  // repacks in the repack buffer

  struct ggml_init_params gp = {16 * ggml_tensor_overhead() + ggml_graph_overhead(), NULL, true};
  struct ggml_context* ctx = ggml_init(gp);
  struct ggml_tensor* xt = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, cols, n);
  struct ggml_tensor* yt = ggml_mul_mat(ctx, w, xt);
  struct ggml_cgraph* g = ggml_new_graph(ctx);
  ggml_build_forward_expand(g, yt);
  ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, backend);
  ggml_backend_tensor_set(xt, x, 0, ggml_nbytes(xt));
  ggml_backend_cpu_set_n_threads(backend, threads);
  if (ggml_backend_graph_compute(backend, g) != GGML_STATUS_SUCCESS) {
    fprintf(stderr, "compute failed\n");
    exit(1);
  }
  ggml_backend_tensor_get(yt, y, 0, ggml_nbytes(yt));
  ggml_backend_buffer_free(buf);
  ggml_free(ctx);
  ggml_backend_buffer_free(wbuf);
  ggml_free(wctx);
}

// ggml_mul_mat_id of a [cols, rows, 2] weight (both experts' rows, expert 0
// first) with every token routed to both experts, token t's slots in the order
// {t % 2, 1 - t % 2}: y0 and y1 (N x rows each) the outputs of expert 0 and 1.
static void run_mul_mat_id(ggml_backend_t backend, ggml_backend_buffer_type_t wbuft, enum ggml_type type, int rows,
                           int cols, const void* wbytes, const float* x, int n, int threads, float* y0, float* y1) {
  struct ggml_init_params ip = {8 * ggml_tensor_overhead(), NULL, true};
  struct ggml_context* wctx = ggml_init(ip);
  struct ggml_tensor* w = ggml_new_tensor_3d(wctx, type, cols, rows, 2);
  ggml_backend_buffer_t wbuf = ggml_backend_alloc_ctx_tensors_from_buft(wctx, wbuft);
  ggml_backend_tensor_set(w, wbytes, 0, ggml_nbytes(w));

  struct ggml_init_params gp = {16 * ggml_tensor_overhead() + ggml_graph_overhead(), NULL, true};
  struct ggml_context* ctx = ggml_init(gp);
  struct ggml_tensor* xt = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, cols, 1, n);
  struct ggml_tensor* ids = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, 2, n);
  struct ggml_tensor* yt = ggml_mul_mat_id(ctx, w, xt, ids);  // [rows, 2, n]
  struct ggml_cgraph* g = ggml_new_graph(ctx);
  ggml_build_forward_expand(g, yt);
  ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, backend);
  ggml_backend_tensor_set(xt, x, 0, ggml_nbytes(xt));
  int32_t* id = malloc(sizeof(int32_t) * 2 * n);
  for (int t = 0; t < n; ++t) id[2 * t] = t % 2, id[2 * t + 1] = 1 - t % 2;
  ggml_backend_tensor_set(ids, id, 0, ggml_nbytes(ids));
  ggml_backend_cpu_set_n_threads(backend, threads);
  if (ggml_backend_graph_compute(backend, g) != GGML_STATUS_SUCCESS) {
    fprintf(stderr, "compute failed\n");
    exit(1);
  }
  float* y = malloc(ggml_nbytes(yt));
  ggml_backend_tensor_get(yt, y, 0, ggml_nbytes(yt));
  for (int t = 0; t < n; ++t) {
    for (int k = 0; k < 2; ++k) {
      float* dst = id[2 * t + k] == 0 ? y0 : y1;
      memcpy(dst + (size_t)t * rows, y + ((size_t)t * 2 + k) * rows, sizeof(float) * rows);
    }
  }
  free(id);
  free(y);
  ggml_backend_buffer_free(buf);
  ggml_free(ctx);
  ggml_backend_buffer_free(wbuf);
  ggml_free(wctx);
}

// Would llama.cpp put this 3-D expert weight into the repack buffer (its test
// for mul_mat_id: the device supports the op with the weight there)?
static int experts_go_to_repack(ggml_backend_dev_t dev, ggml_backend_buffer_type_t buft, enum ggml_type type,
                                int rows, int cols) {
  if (buft == NULL) return 0;
  struct ggml_init_params ip = {16 * ggml_tensor_overhead() + ggml_graph_overhead(), NULL, true};
  struct ggml_context* ctx = ggml_init(ip);
  struct ggml_tensor* w = ggml_new_tensor_3d(ctx, type, cols, rows, 2);
  struct ggml_tensor* x = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, cols, 1, 4);
  struct ggml_tensor* ids = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, 2, 4);
  struct ggml_tensor* y = ggml_mul_mat_id(ctx, w, x, ids);
  ggml_backend_buffer_t dummy = ggml_backend_buft_alloc_buffer(buft, 0);
  w->buffer = dummy;
  const int ok = ggml_backend_dev_supports_op(dev, y);
  w->buffer = NULL;
  ggml_backend_buffer_free(dummy);
  ggml_free(ctx);
  return ok;
}

struct Case {
  char name[48];
  enum ggml_type type;
  int rows, cols;
  uint32_t seed;
  void* w;
  size_t wbytes;
  const int* ns;  // the step sizes run (NULL: kNs)
  int n_ns;
  int mmid_expert;  // 0: a mul_mat case; 1 or 2: expert 0 or 1 of a mul_mat_id pair (w: both experts' rows)
};

// The first kRealRows rows of a model tensor, or 0 when the file is not there.
static int load_rows(const char* dir, const char* file, const char* tensor, struct Case* c) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, file);
  FILE* f = fopen(path, "rb");
  if (f == NULL) return 0;
  struct gguf_init_params gp = {true, NULL};
  struct gguf_context* g = gguf_init_from_file(path, gp);
  const int64_t id = g ? gguf_find_tensor(g, tensor) : -1;
  if (id < 0) {
    fprintf(stderr, "no tensor %s in %s\n", tensor, path);
    exit(1);
  }
  c->type = gguf_get_tensor_type(g, id);
  // Columns from the row size: the tensor's size over its row count is not
  // exposed without a ggml context, so read ne[0] from a meta context.
  struct ggml_context* meta = NULL;
  struct gguf_init_params gp2 = {true, &meta};
  gguf_free(g);
  g = gguf_init_from_file(path, gp2);
  struct ggml_tensor* t = ggml_get_tensor(meta, tensor);
  c->cols = (int)t->ne[0];
  c->rows = kRealRows;
  c->wbytes = ggml_row_size(c->type, c->cols) * kRealRows;
  c->w = malloc(c->wbytes);
  fseek(f, (long)(gguf_get_data_offset(g) + gguf_get_tensor_offset(g, id)), SEEK_SET);
  if (fread(c->w, 1, c->wbytes, f) != c->wbytes) exit(1);
  fclose(f);
  ggml_free(meta);
  gguf_free(g);
  return 1;
}

static void random_rows(enum ggml_type type, int rows, int cols, uint32_t seed, struct Case* c) {
  c->type = type;
  c->rows = rows;
  c->cols = cols;
  float* src = malloc(sizeof(float) * rows * cols);
  for (int r = 0; r < rows; ++r) {
    make_activations(seed + 7777u, r, cols, src + (size_t)r * cols);
    for (int i = 0; i < cols; ++i) src[(size_t)r * cols + i] *= 0.02f * (1 + r % 3);
  }
  c->wbytes = ggml_row_size(type, cols) * rows;
  c->w = malloc(c->wbytes);
  ggml_quantize_chunk(type, src, c->w, 0, rows, cols, NULL);
  free(src);
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s MODEL_DIR|--mxfp4 OUT.bin\n", argv[0]);
    return 2;
  }
  const int mxfp4_only = strcmp(argv[1], "--mxfp4") == 0;
  ggml_backend_t backend = ggml_backend_cpu_init();
  ggml_backend_dev_t dev = ggml_backend_get_device(backend);
  ggml_backend_buffer_type_t rbuft = repack_buft(dev);
  ggml_backend_buffer_type_t cbuft = ggml_backend_cpu_buffer_type();

  struct Case cases[64];
  int nc = 0;
  if (mxfp4_only) goto mxfp4;
  static const struct {
    const char *name, *file, *tensor;
  } real[] = {
      {"qwen05.attn_q.q5_0", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "blk.0.attn_q.weight"},
      {"qwen05.attn_v.q8_0", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "blk.0.attn_v.weight"},
      {"qwen05.output.q8_0", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "output.weight"},
      {"qwen05.ffn_down.q4_K", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "blk.11.ffn_down.weight"},
      {"qwen05.ffn_down.q6_K", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "blk.0.ffn_down.weight"},
      {"qwen15.attn_q.q4_K", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "blk.0.attn_q.weight"},
      {"qwen15.attn_v.q6_K", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "blk.0.attn_v.weight"},
      {"gemma.attn_output.q4_K", "gemma-3-270m-q4_k_m.gguf", "blk.0.attn_output.weight"},
      {"gemma.ffn_down.q6_K", "gemma-3-270m-q4_k_m.gguf", "blk.0.ffn_down.weight"},
      {"gemma.token_embd.q8_0", "gemma-3-270m-q4_k_m.gguf", "token_embd.weight"},
  };
  for (size_t i = 0; i < sizeof real / sizeof real[0]; ++i) {
    struct Case* c = &cases[nc];
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "%s", real[i].name);
    c->seed = 100 + (uint32_t)i;
    if (load_rows(argv[1], real[i].file, real[i].tensor, c)) ++nc;
    else fprintf(stderr, "skipping %s (no %s)\n", real[i].name, real[i].file);
  }
  static const enum ggml_type rnd[] = {GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1,
                                       GGML_TYPE_Q8_0, GGML_TYPE_Q2_K, GGML_TYPE_Q3_K, GGML_TYPE_Q4_K,
                                       GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_F16, GGML_TYPE_BF16,
                                       GGML_TYPE_F32};
  for (size_t i = 0; i < sizeof rnd / sizeof rnd[0]; ++i) {
    struct Case* c = &cases[nc++];
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "random.%s", ggml_type_name(rnd[i]));
    c->seed = 200 + (uint32_t)i;
    random_rows(rnd[i], kRandomRows, 512, c->seed, c);
  }
  // Appended later (the cases above keep their content): longer rows, and row
  // counts that keep Q4_K out of the repack buffer (rows % 8 != 0), so its
  // vec_dot and tiled orders are checked too.
  static const struct {
    enum ggml_type type;
    int rows, cols;
  } more[] = {
      {GGML_TYPE_Q4_K, 12, 1024}, {GGML_TYPE_Q5_K, 16, 2048}, {GGML_TYPE_Q5_K, 11, 1280},
      {GGML_TYPE_Q2_K, 13, 1536}, {GGML_TYPE_Q3_K, 13, 1536}, {GGML_TYPE_Q6_K, 13, 1536},
      {GGML_TYPE_Q5_1, 13, 1056}, {GGML_TYPE_Q4_0, 12, 1056}, {GGML_TYPE_F16, 13, 1040},
      {GGML_TYPE_BF16, 13, 1040}, {GGML_TYPE_F32, 13, 1040},
  };
  for (size_t i = 0; i < sizeof more / sizeof more[0]; ++i) {
    struct Case* c = &cases[nc++];
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "random.%s.%dx%d", ggml_type_name(more[i].type), more[i].rows, more[i].cols);
    c->seed = 300 + (uint32_t)i;
    random_rows(more[i].type, more[i].rows, more[i].cols, c->seed, c);
  }

  // Appended later still: Q4_0 at every small step size, in the repack buffer
  // (rows % 8 == 0: GGML's q4_0_8x8 gemv/gemm) and outside it (vec_dot and
  // tinyBLAS), with row counts that leave part of a 16-row group; then (later
  // again) Q5_0 the same way, in the shapes of Qwen2.5 0.5B and Gemma 3 270M.
  static const struct {
    enum ggml_type type;
    int rows, cols;
  } steps[] = {
      {GGML_TYPE_Q4_0, 24, 2048}, {GGML_TYPE_Q4_0, 64, 4096}, {GGML_TYPE_Q4_0, 8, 896},
      {GGML_TYPE_Q4_0, 20, 1024}, {GGML_TYPE_Q4_0, 7, 640},   {GGML_TYPE_Q5_0, 37, 896},
      {GGML_TYPE_Q5_0, 20, 640},  {GGML_TYPE_Q5_0, 7, 2048},
  };
  for (size_t i = 0; i < sizeof steps / sizeof steps[0]; ++i) {
    struct Case* c = &cases[nc++];
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "random.%s.%dx%d.steps", ggml_type_name(steps[i].type), steps[i].rows,
             steps[i].cols);
    c->seed = 400 + (uint32_t)i;
    random_rows(steps[i].type, steps[i].rows, steps[i].cols, c->seed, c);
    c->ns = kStepNs;
    c->n_ns = kNumStepNs;
  }

  goto write;
mxfp4:
  // MXFP4 (gpt-oss's experts): in the repack buffer (rows % 8 == 0, GGML's
  // mxfp4_8x8 gemv/gemm) and outside it (ggml_vec_dot_mxfp4_q8_0), even and
  // odd block counts, gpt-oss's 2880-wide rows; through mul_mat and mul_mat_id.
  {
    static const struct {
      int rows, cols, mmid;
    } mx[] = {
        {16, 512, 0}, {24, 2880, 0}, {64, 1056, 0}, {13, 1056, 0}, {20, 640, 0}, {7, 2080, 0},
        {16, 2880, 1}, {8, 1056, 1}, {12, 2880, 1}, {13, 1056, 1},
    };
    for (size_t i = 0; i < sizeof mx / sizeof mx[0]; ++i) {
      struct Case* c = &cases[nc];
      memset(c, 0, sizeof *c);
      c->seed = 500 + (uint32_t)i;
      c->ns = kStepNs;
      c->n_ns = kNumStepNs;
      if (!mx[i].mmid) {
        snprintf(c->name, sizeof c->name, "random.mxfp4.%dx%d.steps", mx[i].rows, mx[i].cols);
        random_rows(GGML_TYPE_MXFP4, mx[i].rows, mx[i].cols, c->seed, c);
        ++nc;
        continue;
      }
      random_rows(GGML_TYPE_MXFP4, 2 * mx[i].rows, mx[i].cols, c->seed, c);
      c->rows = mx[i].rows;
      for (int e = 0; e < 2; ++e) {
        if (e == 1) {
          cases[nc + 1] = *c;
          c = &cases[nc + 1];
        }
        c->mmid_expert = 1 + e;
        snprintf(c->name, sizeof c->name, "random.mxfp4.%dx%d.mmid.e%d", mx[i].rows, mx[i].cols, e);
      }
      nc += 2;
    }
  }
write:;
  FILE* out = fopen(argv[2], "wb");
  fwrite("IFMM0001", 1, 8, out);
  const uint32_t n32 = (uint32_t)nc;
  fwrite(&n32, 4, 1, out);
  float* x = malloc(sizeof(float) * kMaxN * 16384);
  for (int i = 0; i < nc; ++i) {
    struct Case* c = &cases[i];
    float* y1 = malloc(sizeof(float) * kMaxN * c->rows);
    float* y3 = malloc(sizeof(float) * kMaxN * c->rows);
    const int* ns = c->ns ? c->ns : kNs;
    const int n_ns = c->ns ? c->n_ns : kNumNs;
    const int rep = c->mmid_expert ? experts_go_to_repack(dev, rbuft, c->type, c->rows, c->cols)
                                   : goes_to_repack(dev, rbuft, c->type, c->rows, c->cols);
    // An expert's own rows: the second half of the pair's bytes for expert 1.
    const size_t expert_bytes = c->mmid_expert ? c->wbytes / 2 : c->wbytes;
    const uint8_t* expert_w = (const uint8_t*)c->w + (c->mmid_expert == 2 ? expert_bytes : 0);
    for (int t = 0; t < kMaxN; ++t) make_activations(c->seed, t, c->cols, x + (size_t)t * c->cols);
    fwrite(c->name, 1, 48, out);
    const uint32_t hdr[5] = {(uint32_t)c->type, (uint32_t)c->rows, (uint32_t)c->cols, c->seed, (uint32_t)rep};
    fwrite(hdr, 4, 5, out);
    const uint64_t wb = expert_bytes;
    fwrite(&wb, 8, 1, out);
    fwrite(expert_w, 1, expert_bytes, out);
    const uint32_t nn = (uint32_t)n_ns;
    fwrite(&nn, 4, 1, out);
    for (int k = 0; k < n_ns; ++k) {
      const int n = ns[k];
      if (c->mmid_expert) {
        float* other = malloc(sizeof(float) * kMaxN * c->rows);
        float* a = c->mmid_expert == 1 ? y1 : other;
        float* b = c->mmid_expert == 1 ? other : y1;
        run_mul_mat_id(backend, rep ? rbuft : cbuft, c->type, c->rows, c->cols, c->w, x, n, 1, a, b);
        a = c->mmid_expert == 1 ? y3 : other;
        b = c->mmid_expert == 1 ? other : y3;
        run_mul_mat_id(backend, rep ? rbuft : cbuft, c->type, c->rows, c->cols, c->w, x, n, 3, a, b);
        free(other);
      } else {
        run_matmul(backend, rep ? rbuft : cbuft, c->type, c->rows, c->cols, c->w, x, n, 1, y1);
        run_matmul(backend, rep ? rbuft : cbuft, c->type, c->rows, c->cols, c->w, x, n, 3, y3);
      }
      if (memcmp(y1, y3, sizeof(float) * n * c->rows) != 0) {
        fprintf(stderr, "%s N=%d: 1 and 3 threads disagree\n", c->name, n);
      }
      const uint32_t n_u = (uint32_t)n;
      fwrite(&n_u, 4, 1, out);
      fwrite(y1, sizeof(float), (size_t)n * c->rows, out);
    }
    printf("%-26s %-5s %2dx%-5d %s\n", c->name, ggml_type_name(c->type), c->rows, c->cols, rep ? "repack" : "cpu");
    free(y1);
    free(y3);
  }
  fclose(out);
  ggml_backend_free(backend);
  return 0;
}
