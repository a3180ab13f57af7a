// Weight matrix x activation rows, split across the thread pool by weight rows.
//
// 1. Activations are quantized once into ws (to vec_dot_type(wtype)), in
//    parallel over tokens when there are several.
// 2. Each thread owns a contiguous range of weight rows. Decode (one token) is
//    a streaming GEMV over those rows, a few rows per kernel call so their
//    accumulation chains overlap. With several tokens, tokens are tiled so a
//    tile's activations stay in L2, and the kernels work on register tiles of
//    rows x tokens (a weight block unpacked once for several tokens, an
//    activation block loaded once for several rows).
// Every (row, token) result comes from the same kernel arithmetic whatever the
// tiling or thread split, so outputs are bit-identical across batch sizes.
#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/quants.h"

namespace inferd::kernels {

namespace {

// Rows per thread chunk are a multiple of this: 16 floats = one cache line of
// y, so threads never write the same line.
constexpr int64_t kRowAlign = 16;
// Activation bytes per token tile: about a quarter of a Zen 4 / recent Intel L2.
constexpr size_t kTokenTileBytes = 256 * 1024;
// Below this many multiply-adds a matmul runs on the calling thread alone:
// handing it to the pool would cost more than the work.
constexpr int64_t kMinParallelWork = 16 * 1024;

struct Job {
  const TypeKernels* k;
  GemmTileFn gemm;  // the tile kernel in the order to follow; null: k->vec_dot per pair
  const uint8_t* w;
  size_t w_row;
  const uint8_t* act;
  size_t act_row;
  int64_t rows, cols, n_tokens;
  float* y;
};

// y[t * rows + r] for r in [r0, r0+nr), t in [t0, t0+nt).
void tile(const Job& j, int64_t r0, int nr, int64_t t0, int nt) {
  const uint8_t* w = j.w + r0 * j.w_row;
  const uint8_t* act = j.act + t0 * j.act_row;
  float* out = j.y + t0 * j.rows + r0;
  if (j.gemm != nullptr) {
    j.gemm(j.cols, w, j.w_row, nr, act, j.act_row, nt, out, 1, static_cast<size_t>(j.rows));
    return;
  }
  for (int r = 0; r < nr; ++r) {
    for (int t = 0; t < nt; ++t) out[t * j.rows + r] = j.k->vec_dot(j.cols, w + r * j.w_row, act + t * j.act_row);
  }
}

void compute_rows(const Job& j, int64_t r0, int64_t r1) {
  if (j.n_tokens == 1) {
    // Decode: stream the weight rows once, a few rows per call.
    const int64_t step = j.k->gemv_rows;
    for (int64_t r = r0; r < r1; r += step) tile(j, r, static_cast<int>(std::min(step, r1 - r)), 0, 1);
    return;
  }
  // Tokens in tiles whose activations stay in L2 while every row of this
  // thread's range passes over them; inside, register tiles of rows x tokens.
  const int64_t rstep = j.k->tile_rows, tstep = j.k->tile_tokens;
  int64_t ttile = static_cast<int64_t>(kTokenTileBytes / std::max<size_t>(j.act_row, 1));
  ttile = std::max(tstep, ttile / tstep * tstep);
  for (int64_t t0 = 0; t0 < j.n_tokens; t0 += ttile) {
    const int64_t t1 = std::min(j.n_tokens, t0 + ttile);
    for (int64_t r = r0; r < r1; r += rstep) {
      const int nr = static_cast<int>(std::min(rstep, r1 - r));
      for (int64_t t = t0; t < t1; t += tstep) tile(j, r, nr, t, static_cast<int>(std::min(tstep, t1 - t)));
    }
  }
}

}  // namespace

void matmul(DType wtype, const void* W, int64_t rows, int64_t cols, const float* x,
            int64_t n_tokens, float* y, ThreadPool& pool, Workspace& ws) {
  matmul_with(kernel_table(), wtype, W, rows, cols, x, n_tokens, y, pool, ws);
}

void matmul_with(const KernelTable& table, DType wtype, const void* W, int64_t rows,
                 int64_t cols, const float* x, int64_t n_tokens, float* y, ThreadPool& pool,
                 Workspace& ws) {
  if (rows <= 0 || n_tokens <= 0) return;
  const TypeKernels& wk = table.type[static_cast<uint32_t>(wtype) % kNumTypeSlots];
  if (wk.vec_dot == nullptr || !is_supported_weight_type(wtype)) {
    std::fprintf(stderr, "inferd: matmul called with unsupported weight type %s\n", dtype_name(wtype));
    std::abort();
  }
  const DType atype = vec_dot_type(wtype);

  Job job{&wk, wk.gemm_tile, static_cast<const uint8_t*>(W), row_bytes(wtype, cols), nullptr, 0, rows, cols, n_tokens, y};

  if (atype == DType::F32) {
    job.act = reinterpret_cast<const uint8_t*>(x);  // used as is
    job.act_row = static_cast<size_t>(cols) * sizeof(float);
  } else {
    const QuantizeRowFn quantize = table.type[static_cast<uint32_t>(atype)].quantize_row;
    job.act_row = row_bytes(atype, cols);
    const size_t need = job.act_row * static_cast<size_t>(n_tokens);
    if (ws.quantized_activations.size() < need) ws.quantized_activations.resize(need);
    uint8_t* q = ws.quantized_activations.data();
    if (n_tokens == 1 || pool.size() == 1) {
      for (int64_t t = 0; t < n_tokens; ++t) quantize(x + t * cols, q + t * job.act_row, cols);
    } else {
      struct QuantizeJob {
        QuantizeRowFn quantize;
        const float* x;
        uint8_t* q;
        int64_t cols, n_tokens;
        size_t q_row;
      } qjob{quantize, x, q, cols, n_tokens, job.act_row};
      // One pointer captured: std::function keeps it inline, no allocation.
      const QuantizeJob* qj = &qjob;
      pool.run([qj](int ti, int nt) {
        const auto [t0, t1] = ThreadPool::split(qj->n_tokens, ti, nt);
        for (int64_t t = t0; t < t1; ++t) qj->quantize(qj->x + t * qj->cols, qj->q + t * qj->q_row, qj->cols);
      });
    }
    job.act = q;
  }

  if (pool.size() == 1 || rows * cols * n_tokens < kMinParallelWork) {
    compute_rows(job, 0, rows);
    return;
  }
  const Job* j = &job;  // one pointer captured: std::function keeps it inline, no allocation
  pool.run([j](int ti, int nt) {
    const auto [r0, r1] = ThreadPool::split(j->rows, ti, nt, kRowAlign);
    if (r0 < r1) compute_rows(*j, r0, r1);
  });
}

size_t matmul_act_row_bytes(DType wtype, int64_t cols) { return row_bytes(vec_dot_type(wtype), cols); }

void matmul_quantize_rows(DType wtype, const float* x, int64_t cols, int64_t t0, int64_t t1, uint8_t* act) {
  const DType atype = vec_dot_type(wtype);
  const size_t row = row_bytes(atype, cols);
  for (int64_t t = t0; t < t1; ++t) {
    if (atype == DType::F32) {
      std::memcpy(act + t * row, x + t * cols, row);
    } else {
      kernel_table().type[static_cast<uint32_t>(atype)].quantize_row(x + t * cols, act + t * row, cols);
    }
  }
}

void matmul_rows(DType wtype, const void* W, int64_t rows, int64_t cols, const uint8_t* act,
                 int64_t n_tokens, float* y, int64_t r0, int64_t r1) {
  const TypeKernels& wk = kernel_table().type[static_cast<uint32_t>(wtype) % kNumTypeSlots];
  const Job job{&wk, wk.gemm_tile, static_cast<const uint8_t*>(W), row_bytes(wtype, cols), act,
                matmul_act_row_bytes(wtype, cols), rows, cols, n_tokens, y};
  if (r0 < r1) compute_rows(job, r0, r1);
}

bool ggml_repacked(DType wtype, int64_t rows) {
  // ggml_repack_get_optimal_repack_type on an AVX2 CPU: Q4_K (q4_K_8x8),
  // Q4_0 (q4_0_8x8) and MXFP4 (mxfp4_8x8) with rows % 8 == 0; llama.cpp puts
  // every such matmul weight in the repack buffer (experts of mul_mat_id
  // too), and its kernels then run for any number of tokens.
  return (wtype == DType::Q4_K || wtype == DType::Q4_0 || wtype == DType::MXFP4) && rows % 8 == 0;
}

GgmlOrder ggml_order_for(DType wtype, int64_t rows, int64_t cols, TokenPlace place) {
  // llamafile_sgemm on AVX2: float weights from 2 tokens, when its 4-row tiles
  // and 8-element steps fit the matrix (it declines otherwise, and vec_dot runs).
  if (wtype == DType::F32 || wtype == DType::F16 || wtype == DType::BF16)
    return place.chunk >= 2 && rows % 4 == 0 && cols % 8 == 0 ? GgmlOrder::kTinyBlas : GgmlOrder::kVecDot;
  if (ggml_repacked(wtype, rows))
    return place.index < place.chunk - place.chunk % 4 ? GgmlOrder::kRepackGemm : GgmlOrder::kRepackGemv;
  // ggml_compute_forward_mul_mat_tiled: K-quants outside that buffer, 8 tokens or more.
  const bool kquant = wtype == DType::Q2_K || wtype == DType::Q3_K || wtype == DType::Q4_K ||
                      wtype == DType::Q5_K || wtype == DType::Q6_K;
  if (kquant && place.chunk >= 8) return GgmlOrder::kTiled;
  return GgmlOrder::kVecDot;
}

std::vector<TokenPlace> one_chunk(int64_t n) {
  std::vector<TokenPlace> places(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) places[t] = {static_cast<int32_t>(n), static_cast<int32_t>(t)};
  return places;
}

namespace {
// n columns of one row of x (n a multiple of the input's block) into out, as
// GGML quantizes them for this weight and token place. Every input type is a
// run of independent blocks, so a span of blocks gives the same bytes as the
// whole row gives there.
void quantize_span_ggml(const KernelTable& table, DType wtype, int64_t rows, int64_t cols, TokenPlace place,
                        const float* x, int64_t n, uint8_t* out) {
  const DType atype = vec_dot_type(wtype);
  if (atype == DType::F32) {
    std::memcpy(out, x, static_cast<size_t>(n) * sizeof(float));
  } else if (atype == DType::Q8_K && ggml_order_for(wtype, rows, cols, place) == GgmlOrder::kRepackGemm) {
    // The repacked Q4_K gemm's tokens are quantized in fours
    // (ggml_quantize_mat_q8_K_4x8). Q4_0's (ggml_quantize_mat_q8_0_4x8) get
    // the same bytes as quantize_row_q8_0, reordered: the branch below.
    table.quantize_q8_k_x4(x, out, n);
  } else if (atype == DType::Q8_0) {
    table.quantize_q8_0_cpu(x, out, n);
  } else {
    table.type[static_cast<uint32_t>(atype)].quantize_row(x, out, n);
  }
}
}  // namespace

void matmul_quantize_rows_ggml_with(const KernelTable& table, DType wtype, int64_t rows, const float* x, int64_t cols,
                                    int64_t t0, int64_t t1, const TokenPlace* places, uint8_t* act) {
  const size_t row = matmul_act_row_bytes(wtype, cols);
  for (int64_t t = t0; t < t1; ++t)
    quantize_span_ggml(table, wtype, rows, cols, places[t], x + t * cols, cols, act + t * row);
}

void matmul_quantize_rows_ggml(DType wtype, int64_t rows, const float* x, int64_t cols, int64_t t0, int64_t t1,
                               const TokenPlace* places, uint8_t* act) {
  matmul_quantize_rows_ggml_with(kernel_table(), wtype, rows, x, cols, t0, t1, places, act);
}

int64_t matmul_act_block(DType wtype) { return info(vec_dot_type(wtype)).block_size; }

void matmul_quantize_blocks_ggml_with(const KernelTable& table, DType wtype, int64_t rows, const float* x_row,
                                      int64_t cols, int64_t b0, int64_t b1, TokenPlace place, uint8_t* act_row) {
  if (b0 >= b1) return;
  const DTypeInfo& a = info(vec_dot_type(wtype));
  quantize_span_ggml(table, wtype, rows, cols, place, x_row + b0 * a.block_size, (b1 - b0) * a.block_size,
                     act_row + static_cast<size_t>(b0 * a.block_bytes));
}

void matmul_quantize_blocks_ggml(DType wtype, int64_t rows, const float* x_row, int64_t cols, int64_t b0, int64_t b1,
                                 TokenPlace place, uint8_t* act_row) {
  matmul_quantize_blocks_ggml_with(kernel_table(), wtype, rows, x_row, cols, b0, b1, place, act_row);
}

void matmul_rows_ggml_with(const KernelTable& table, DType wtype, const void* W, int64_t rows, int64_t cols,
                           const uint8_t* act, int64_t n_tokens, const TokenPlace* places, float* y, int64_t r0,
                           int64_t r1) {
  if (r0 >= r1) return;
  const TypeKernels& wk = table.type[static_cast<uint32_t>(wtype) % kNumTypeSlots];
  const size_t act_row = matmul_act_row_bytes(wtype, cols);
  // Runs of consecutive tokens that take the same order, each run in one pass
  // over the rows (a batch of decoding sequences is one run: the weights are
  // read once for all of them).
  for (int64_t t0 = 0; t0 < n_tokens;) {
    const GgmlOrder order = ggml_order_for(wtype, rows, cols, places[t0]);
    int64_t t1 = t0 + 1;
    while (t1 < n_tokens && ggml_order_for(wtype, rows, cols, places[t1]) == order) ++t1;
    GemmTileFn gemm = wk.gemm_tile;
    switch (order) {
      case GgmlOrder::kRepackGemm: gemm = wk.repack_gemm_tile; break;
      case GgmlOrder::kRepackGemv: gemm = wk.repack_tile; break;
      case GgmlOrder::kTiled: gemm = wk.tiled_tile; break;
      case GgmlOrder::kTinyBlas: gemm = wk.tinyblas_tile; break;
      case GgmlOrder::kVecDot: break;
    }
    const Job job{&wk, gemm, static_cast<const uint8_t*>(W), row_bytes(wtype, cols), act + t0 * act_row, act_row,
                  rows, cols, t1 - t0, y + t0 * rows};
    compute_rows(job, r0, r1);
    t0 = t1;
  }
}

void matmul_rows_ggml(DType wtype, const void* W, int64_t rows, int64_t cols, const uint8_t* act, int64_t n_tokens,
                      const TokenPlace* places, float* y, int64_t r0, int64_t r1) {
  matmul_rows_ggml_with(kernel_table(), wtype, W, rows, cols, act, n_tokens, places, y, r0, r1);
}

std::pair<int64_t, int64_t> matmul_row_split(int64_t rows, int thread_index, int n_threads) {
  return ThreadPool::split(rows, thread_index, n_threads, kRowAlign);
}

}  // namespace inferd::kernels
