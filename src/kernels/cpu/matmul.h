// Matrix multiplication of a (possibly quantized) weight matrix by a batch of
// f32 activation rows: the projection at the heart of every layer.
#pragma once
#include <cstdint>
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

}  // namespace inferd::kernels
