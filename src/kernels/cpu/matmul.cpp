// Weight matrix x activation rows, split across the thread pool by weight rows.
//
// 1. Activations are quantized once into ws (to vec_dot_type(wtype)), in
//    parallel over tokens when there are several.
// 2. Each thread owns a contiguous range of weight rows. Decode (one token) is
//    a plain streaming GEMV over those rows. With several tokens, tokens are
//    tiled so a tile's activations stay in L2, and each weight row is dotted
//    with up to kMaxMultiRows tokens at once (the multi-row kernel unpacks the
//    weight block once for all of them).
// Every (row, token) result comes from the same kernel arithmetic whatever the
// tiling or thread split, so outputs are bit-identical across batch sizes.
#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/quants.h"

namespace inferd::kernels {

namespace {

// Rows per thread chunk are a multiple of this: 16 floats = one cache line of
// y, so threads never write the same line.
constexpr int64_t kRowAlign = 16;
// Activation bytes per token tile: about a quarter of a Zen 4 / recent Intel L2.
constexpr size_t kTokenTileBytes = 256 * 1024;

struct Job {
  VecDotFn dot;
  VecDotMultiFn dot_multi;  // may be null: fall back to dot per token
  const uint8_t* w;
  size_t w_row;
  const uint8_t* act;
  size_t act_row;
  int64_t rows, cols, n_tokens;
  float* y;
};

void compute_rows(const Job& j, int64_t r0, int64_t r1) {
  if (j.n_tokens == 1) {
    for (int64_t r = r0; r < r1; ++r) j.y[r] = j.dot(j.cols, j.w + r * j.w_row, j.act);
    return;
  }
  int64_t tile = static_cast<int64_t>(kTokenTileBytes / std::max<size_t>(j.act_row, 1));
  tile = std::max<int64_t>(kMaxMultiRows, tile / kMaxMultiRows * kMaxMultiRows);
  float out[kMaxMultiRows];
  for (int64_t t0 = 0; t0 < j.n_tokens; t0 += tile) {
    const int64_t t1 = std::min(j.n_tokens, t0 + tile);
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* wrow = j.w + r * j.w_row;
      for (int64_t t = t0; t < t1; t += kMaxMultiRows) {
        const int nb = static_cast<int>(std::min<int64_t>(kMaxMultiRows, t1 - t));
        const uint8_t* arow = j.act + t * j.act_row;
        if (j.dot_multi != nullptr) {
          j.dot_multi(j.cols, wrow, arow, j.act_row, nb, out);
        } else {
          for (int k = 0; k < nb; ++k) out[k] = j.dot(j.cols, wrow, arow + k * j.act_row);
        }
        for (int k = 0; k < nb; ++k) j.y[(t + k) * j.rows + r] = out[k];
      }
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

  Job job{wk.vec_dot, wk.vec_dot_multi, static_cast<const uint8_t*>(W), row_bytes(wtype, cols),
          nullptr, 0, rows, cols, n_tokens, y};

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
      pool.run([&](int ti, int nt) {
        const auto [t0, t1] = ThreadPool::split(n_tokens, ti, nt);
        for (int64_t t = t0; t < t1; ++t) quantize(x + t * cols, q + t * job.act_row, cols);
      });
    }
    job.act = q;
  }

  pool.run([&](int ti, int nt) {
    const auto [r0, r1] = ThreadPool::split(rows, ti, nt, kRowAlign);
    if (r0 < r1) compute_rows(job, r0, r1);
  });
}

}  // namespace inferd::kernels
