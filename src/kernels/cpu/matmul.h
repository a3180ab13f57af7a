// Matrix multiplication of a (possibly quantized) weight matrix by a batch of
// f32 activation rows: the projection at the heart of every layer.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"

namespace inferd::kernels {

// Scratch memory reused across calls so the hot path does not allocate.
struct Workspace {
  std::vector<uint8_t> quantized_activations;
};

// y[t * rows + r] = dot(W row r, x row t) for t < n_tokens, r < rows.
// W: `rows` rows of `cols` elements in `wtype` (GGML layout, row-major).
// x: n_tokens x cols f32; y: n_tokens x rows f32.
// Reduction order is fixed by (cols, wtype) alone, so a row's result never
// depends on n_tokens or on how work is split across threads.
void matmul(DType wtype, const void* W, int64_t rows, int64_t cols, const float* x,
            int64_t n_tokens, float* y, ThreadPool& pool, Workspace& ws);

// matmul() with an explicit kernel table (kernel_table.h) instead of the one
// chosen at startup: lets tests run every SIMD level in one process.
struct KernelTable;
void matmul_with(const KernelTable& kernels, DType wtype, const void* W, int64_t rows,
                 int64_t cols, const float* x, int64_t n_tokens, float* y, ThreadPool& pool,
                 Workspace& ws);

// matmul() in two halves, for callers that run inside a parallel region of
// their own (the forward pass): each thread quantizes some activation rows,
// and after a barrier computes some weight rows.
// Bytes per activation row as the kernels for `wtype` want it.
size_t matmul_act_row_bytes(DType wtype, int64_t cols);
// Rows [t0, t1) of x (rows of cols floats) into act (rows of matmul_act_row_bytes).
void matmul_quantize_rows(DType wtype, const float* x, int64_t cols, int64_t t0, int64_t t1, uint8_t* act);
// Weight rows [r0, r1) against all n_tokens activation rows.
void matmul_rows(DType wtype, const void* W, int64_t rows, int64_t cols, const uint8_t* act,
                 int64_t n_tokens, float* y, int64_t r0, int64_t r1);
// The same two halves in the order llama.cpp's CPU backend (GGML, AVX2 build,
// CPU repack buffer on, as llama.cpp runs it) sums each product. For some
// types that order depends on how many tokens the matmul holds, and llama.cpp
// runs one sequence's chunk (its ubatch) per matmul; inferd follows that per
// sequence, so a token's result depends on its own sequence's share of the
// step and its place in it, never on other sequences or the thread split
// (docs/design.md, "Numerics against llama.cpp").
struct TokenPlace {
  int32_t chunk = 1;  // tokens of this token's sequence in the step
  int32_t index = 0;  // this token's place among them
};
// n tokens of one sequence: {n, 0}, {n, 1}, ... (tests, single-sequence callers).
std::vector<TokenPlace> one_chunk(int64_t n);
enum class GgmlOrder {
  kVecDot,      // ggml_vec_dot_* (tinyBLAS sums each pair the same way)
  kTiled,       // its tiled K-quant matmul: Q2_K..Q6_K outside the repack buffer, chunks of 8 tokens or more
  kRepackGemm,  // its repacked gemm (Q4_K, Q4_0; rows % 8 == 0): a chunk's first chunk - chunk % 4 tokens
  kRepackGemv,  // its repacked gemv: the rest of the chunk
  kTinyBlas,    // tinyBLAS on F32/F16/BF16: chunks of 2+ tokens, rows % 4 == 0, cols % 8 == 0
};
GgmlOrder ggml_order_for(DType wtype, int64_t rows, int64_t cols, TokenPlace place);
// Whether llama.cpp puts such a weight in its CPU repack buffer (Q4_K's input
// is then quantized its own way for some tokens; Q4_0's gets the same bytes).
bool ggml_repacked(DType wtype, int64_t rows);
// Rows [t0, t1) of x into act, quantized as GGML quantizes them for weights of
// `rows` rows of wtype (the repacked Q4_K gemm's tokens have a Q8_K quantizer
// of their own); places[t] for each token.
void matmul_quantize_rows_ggml(DType wtype, int64_t rows, const float* x, int64_t cols, int64_t t0, int64_t t1,
                               const TokenPlace* places, uint8_t* act);
// Columns per block of that input (256 for Q8_K, 32 for Q8_0/Q8_1, 1 for
// floats). Blocks are quantized independently, so threads can share a row.
int64_t matmul_act_block(DType wtype);
// Blocks [b0, b1) of one row (x_row, cols floats) into their place in act_row,
// the same bytes matmul_quantize_rows_ggml writes there for the whole row.
void matmul_quantize_blocks_ggml(DType wtype, int64_t rows, const float* x_row, int64_t cols, int64_t b0, int64_t b1,
                                 TokenPlace place, uint8_t* act_row);
// Weight rows [r0, r1) against all n_tokens activation rows, in GGML's order.
void matmul_rows_ggml(DType wtype, const void* W, int64_t rows, int64_t cols, const uint8_t* act, int64_t n_tokens,
                      const TokenPlace* places, float* y, int64_t r0, int64_t r1);
// The same with an explicit kernel table (tests run every SIMD level).
void matmul_quantize_rows_ggml_with(const KernelTable& table, DType wtype, int64_t rows, const float* x, int64_t cols,
                                    int64_t t0, int64_t t1, const TokenPlace* places, uint8_t* act);
void matmul_quantize_blocks_ggml_with(const KernelTable& table, DType wtype, int64_t rows, const float* x_row,
                                      int64_t cols, int64_t b0, int64_t b1, TokenPlace place, uint8_t* act_row);
void matmul_rows_ggml_with(const KernelTable& table, DType wtype, const void* W, int64_t rows, int64_t cols,
                           const uint8_t* act, int64_t n_tokens, const TokenPlace* places, float* y, int64_t r0,
                           int64_t r1);
// This thread's weight rows: contiguous, aligned so threads never share a cache line of y.
std::pair<int64_t, int64_t> matmul_row_split(int64_t rows, int thread_index, int n_threads);

}  // namespace inferd::kernels
