#include "model/linear.h"

#include <algorithm>
#include <cassert>
#include <cstring>

#include "core/thread_pool.h"
#include "kernels/cpu/float_matmul.h"
#include "kernels/cpu/kquant_layout.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/packed_layout.h"
#include "kernels/cpu/quants.h"

namespace inferd {

namespace {
bool runs_fast(const WeightView& w, kernels::Numerics numerics) {
  return numerics == kernels::Numerics::kFast && kernels::fast_gemm_applies(w.dtype) &&
         w.cols % kernels::kFastActBlock == 0;
}
bool runs_bf16(const WeightView& w, kernels::Numerics numerics) {
  return numerics == kernels::Numerics::kFast && kernels::bf16_gemm_applies(w.dtype, w.cols);
}
}  // namespace

Linear Linear::make(const WeightView& w, kernels::PackedArena* arena, kernels::GgmlFlavour flavour,
                    kernels::Numerics numerics, const kernels::RowsRepacked& done) {
  Linear l;
  l.view_ = w;
  if (runs_fast(w, numerics)) {
    l.fast_ = kernels::FastMatrix::pack(w.dtype, w.data, w.rows, w.cols, arena, done,
                                        kernels::fast_acts_for(kernels::kernel_table(), w.dtype));
    return l;
  }
  if (runs_bf16(w, numerics)) {
    l.bf16_ = kernels::Bf16Matrix::pack(w.dtype, w.data, w.rows, w.cols, arena, done);
    return l;
  }
  l.f32_avx512_order_ = w.dtype == DType::F32 && flavour == kernels::GgmlFlavour::kAvx512;
  // GGML sums some types (F32/F16/BF16 by tinyBLAS, repacked Q4_0/Q4_K) in an
  // order that depends on the token's chunk: a prompt cut into a piece of one
  // token would give that token other bits (a mixture's F32 router, then its
  // expert weights and everything after).
  l.each_token_alone_ = numerics == kernels::Numerics::kFast;
  if (kernels::can_pack(w.dtype))
    l.packed_ = kernels::PackedMatrix::pack(w.dtype, w.data, w.rows, w.cols, arena, done);
  if (kernels::RepackedQ4K::applies(w.dtype, w.rows))
    l.q4k_ = kernels::RepackedQ4K::pack(w.data, w.rows, w.cols, arena, done);
  if (!l.packed_ && !l.q4k_ && arena != nullptr) {
    // The kernels read these rows as they are in the file; the same bytes on
    // the arena's huge pages stream faster (docs/design.md, "Weights read in
    // place, copied to huge pages").
    const size_t row = row_bytes(w.dtype, w.cols);
    if (uint8_t* copy = arena->take(row * static_cast<size_t>(w.rows))) {
      const auto* src = static_cast<const uint8_t*>(w.data);
      for (int64_t r0 = 0; r0 < w.rows; r0 += kernels::kRowsRepackedStep) {
        const int64_t r1 = std::min(w.rows, r0 + kernels::kRowsRepackedStep);
        std::memcpy(copy + r0 * row, src + r0 * row, static_cast<size_t>(r1 - r0) * row);
        if (done) done(r1);
      }
      l.view_.data = copy;
      l.copied_ = true;
    }
  }
  return l;
}

size_t Linear::packed_bytes(const WeightView& w, kernels::Numerics numerics) {
  if (runs_fast(w, numerics))
    return kernels::PackedArena::space_for(kernels::FastMatrix::packed_bytes(w.dtype, w.rows, w.cols));
  if (runs_bf16(w, numerics)) return kernels::PackedArena::space_for(kernels::Bf16Matrix::packed_bytes(w.rows, w.cols));
  if (kernels::RepackedQ4K::applies(w.dtype, w.rows)) {
    return kernels::PackedArena::space_for(kernels::RepackedQ4K::packed_bytes(w.rows, w.cols));
  }
  if (!kernels::can_pack(w.dtype)) return kernels::PackedArena::space_for(row_bytes(w.dtype, w.cols) * w.rows);
  return kernels::PackedArena::space_for(kernels::PackedMatrix::packed_bytes(w.dtype, w.rows, w.cols));
}

bool Linear::same_input(const Linear& other) const {
  if (cols() != other.cols() || packed() != other.packed() || fast() != other.fast() || bf16() != other.bf16())
    return false;
  if (fast()) return fast_.acts() == other.fast_.acts();
  if (packed() || fast() || bf16()) return true;
  // GGML quantizes some of a repacked Q4_K's input with a Q8_K quantizer of its own.
  const bool repack = kernels::ggml_repacked(view_.dtype, rows());
  const bool other_repack = kernels::ggml_repacked(other.view_.dtype, other.rows());
  return repack == other_repack && kernels::vec_dot_type(view_.dtype) == kernels::vec_dot_type(other.view_.dtype);
}

void Linear::prepare(LinearInput& in, int64_t n_tokens) const {
  if (fast()) {
    in.fast.resize(n_tokens, cols(), fast_.acts());
    return;
  }
  if (bf16()) {
    in.bf16.resize(n_tokens, cols());
    return;
  }
  if (packed()) {
    in.packed.resize(n_tokens, cols());
    return;
  }
  in.row_bytes = kernels::matmul_act_row_bytes(view_.dtype, cols());
  const size_t need = in.row_bytes * static_cast<size_t>(n_tokens);
  if (in.rows.size() < need) in.rows.resize(need);
}

const kernels::TokenPlace* Linear::places_of(const StepTokens& tokens) const {
  if (!each_token_alone_) return tokens.places;
  // Every entry is {1, 0}, so a thread's buffer only ever grows.
  thread_local std::vector<kernels::TokenPlace> alone;
  const size_t n = static_cast<size_t>(tokens.n);
  if (alone.size() < n) alone.resize(n, kernels::TokenPlace{1, 0});
  return alone.data();
}

void Linear::quantize(const float* x, int64_t t0, int64_t t1, const StepTokens& tokens, LinearInput& in) const {
  if (fast()) {
    for (int64_t t = t0; t < t1; ++t) in.fast.quantize_blocks(x + t * cols(), t, 0, cols() / in.fast.block());
    return;
  }
  if (bf16()) {
    for (int64_t t = t0; t < t1; ++t) in.bf16.convert_blocks(x + t * cols(), t, 0, cols() / kernels::kBf16ActBlock);
    return;
  }
  if (packed()) {
    kernels::quantize_packed_rows(x, t0, t1, in.packed);
  } else {
    kernels::matmul_quantize_rows_ggml(view_.dtype, rows(), x, cols(), t0, t1, places_of(tokens), in.rows.data());
  }
}

void Linear::quantize_blocks(const float* x, int64_t t, int64_t b0, int64_t b1, const StepTokens& tokens,
                             LinearInput& in) const {
  if (fast()) {
    in.fast.quantize_blocks(x + t * cols(), t, b0, b1);
    return;
  }
  if (bf16()) {
    in.bf16.convert_blocks(x + t * cols(), t, b0, b1);
    return;
  }
  if (packed()) {
    kernels::quantize_packed_blocks(x, t, b0, b1, in.packed);
  } else {
    kernels::matmul_quantize_blocks_ggml(view_.dtype, rows(), x + t * cols(), cols(), b0, b1,
                                         each_token_alone_ ? kernels::TokenPlace{1, 0} : tokens.places[t],
                                         in.rows.data() + t * in.row_bytes);
  }
}

namespace {
std::pair<int64_t, int64_t> group_split(int64_t groups, int ti, int nt, int64_t align_rows) {
  const int64_t align = align_rows % kernels::kPackRows == 0 ? align_rows / kernels::kPackRows : 1;
  return ThreadPool::split(groups, ti, nt, align);
}
static_assert(kernels::kFastRows == kernels::kPackRows && kernels::kBf16Rows == kernels::kPackRows,
              "the fast tier's groups split as the packed ones");
}  // namespace

void Linear::compute(const LinearInput& in, const StepTokens& tokens, float* y, int thread_index, int n_threads,
                     int64_t align_rows) const {
  const auto [r0, r1] = thread_rows(thread_index, n_threads, align_rows);
  compute_rows(in, tokens, y, r0, r1);
}

namespace {
// The groups holding rows [r0, r1), which must start and end on group edges.
std::pair<int64_t, int64_t> groups_of_rows(int64_t groups, int64_t rows, int64_t r0, int64_t r1) {
  assert(r0 % kernels::kPackRows == 0 && (r1 % kernels::kPackRows == 0 || r1 == rows));
  (void)rows;
  return {r0 / kernels::kPackRows, std::min(groups, (r1 + kernels::kPackRows - 1) / kernels::kPackRows)};
}
}  // namespace

void Linear::compute_rows(const LinearInput& in, const StepTokens& tokens, float* y, int64_t r0, int64_t r1) const {
  if (r0 >= r1 || tokens.n == 0) return;
  if (fast()) {
    const auto [g0, g1] = groups_of_rows(fast_.groups(), rows(), r0, r1);
    kernels::fast_matmul_groups(fast_, in.fast, 0, tokens.n, g0, g1, y, rows());
    return;
  }
  if (bf16()) {
    const auto [g0, g1] = groups_of_rows(bf16_.groups(), rows(), r0, r1);
    kernels::bf16_matmul_groups(bf16_, in.bf16, 0, tokens.n, g0, g1, y, rows());
    return;
  }
  if (packed()) {
    const auto [g0, g1] = groups_of_rows(packed_.groups(), rows(), r0, r1);
    kernels::packed_matmul_groups(packed_, in.packed, g0, g1, y, rows(), tokens.n);
    return;
  }
  if (q4k_ && r0 % kernels::kQ4KGroupRows == 0 && r1 % kernels::kQ4KGroupRows == 0) {
    kernels::repacked_q4k_rows(q4k_, in.rows.data(), tokens.n, places_of(tokens), y, rows(), r0, r1);
    return;
  }
  if (f32_avx512_order_) {
    kernels::f32_rows_ggml_avx512_order(view_.f32(), rows(), cols(), reinterpret_cast<const float*>(in.rows.data()),
                                        tokens.n, places_of(tokens), y, r0, r1);
    return;
  }
  kernels::matmul_rows_ggml(view_.dtype, view_.data, rows(), cols(), in.rows.data(), tokens.n, places_of(tokens), y, r0,
                            r1);
}

void Linear::compute_rows_span(const LinearInput& in, int64_t first, const StepTokens& tokens, float* y, int64_t r0,
                               int64_t r1) const {
  if (r0 >= r1 || tokens.n == 0) return;
  if (fast()) {
    const auto [g0, g1] = groups_of_rows(fast_.groups(), rows(), r0, r1);
    kernels::fast_matmul_groups(fast_, in.fast, first, tokens.n, g0, g1, y, rows());
    return;
  }
  if (bf16()) {
    const auto [g0, g1] = groups_of_rows(bf16_.groups(), rows(), r0, r1);
    kernels::bf16_matmul_groups(bf16_, in.bf16, first, tokens.n, g0, g1, y, rows());
    return;
  }
  if (packed()) {
    const auto [g0, g1] = groups_of_rows(packed_.groups(), rows(), r0, r1);
    kernels::packed_matmul_span(packed_, in.packed, first, tokens.n, g0, g1, y, rows());
    return;
  }
  const uint8_t* act = in.rows.data() + static_cast<size_t>(first) * kernels::matmul_act_row_bytes(view_.dtype, cols());
  if (q4k_ && r0 % kernels::kQ4KGroupRows == 0 && r1 % kernels::kQ4KGroupRows == 0) {
    kernels::repacked_q4k_rows(q4k_, act, tokens.n, places_of(tokens), y, rows(), r0, r1);
    return;
  }
  if (f32_avx512_order_) {
    kernels::f32_rows_ggml_avx512_order(view_.f32(), rows(), cols(), reinterpret_cast<const float*>(act), tokens.n,
                                        places_of(tokens), y, r0, r1);
    return;
  }
  kernels::matmul_rows_ggml(view_.dtype, view_.data, rows(), cols(), act, tokens.n, places_of(tokens), y, r0, r1);
}

void Linear::copy_input_row(const LinearInput& from, int64_t t, LinearInput& to, int64_t r) const {
  if (fast()) {
    to.fast.copy_row(from.fast, t, r);
    return;
  }
  if (bf16()) {
    to.bf16.copy_row(from.bf16, t, r);
    return;
  }
  if (packed()) {
    std::memcpy(to.packed.row(r), from.packed.row(t), from.packed.row_bytes());
    return;
  }
  // Rows as this weight's kernels lay them out (an input prepared for several
  // layers keeps the last one's row_bytes).
  const size_t bytes = kernels::matmul_act_row_bytes(view_.dtype, cols());
  std::memcpy(to.rows.data() + static_cast<size_t>(r) * bytes, from.rows.data() + static_cast<size_t>(t) * bytes, bytes);
}

std::pair<const void*, size_t> Linear::rows_bytes(int64_t r0, int64_t r1) const {
  if (r0 >= r1) return {nullptr, 0};
  if (fast()) {
    const auto [g0, g1] = groups_of_rows(fast_.groups(), rows(), r0, r1);
    return {fast_.group(g0), static_cast<size_t>(fast_.group(g1) - fast_.group(g0))};
  }
  if (bf16()) {
    const auto [g0, g1] = groups_of_rows(bf16_.groups(), rows(), r0, r1);
    return {bf16_.group(g0), static_cast<size_t>(bf16_.group(g1) - bf16_.group(g0))};
  }
  if (packed()) {
    const auto [g0, g1] = groups_of_rows(packed_.groups(), rows(), r0, r1);
    return {packed_.group(g0), static_cast<size_t>(packed_.group(g1) - packed_.group(g0))};
  }
  if (q4k_ && r0 % kernels::kQ4KGroupRows == 0 && r1 % kernels::kQ4KGroupRows == 0) return q4k_.rows_bytes(r0, r1);
  const size_t rb = row_bytes(view_.dtype, cols());
  return {static_cast<const uint8_t*>(view_.data) + r0 * rb, (r1 - r0) * rb};
}

std::pair<int64_t, int64_t> Linear::thread_rows(int thread_index, int n_threads, int64_t align_rows) const {
  if (fast()) {
    const auto [g0, g1] = group_split(fast_.groups(), thread_index, n_threads, align_rows);
    return {std::min(rows(), g0 * kernels::kFastRows), std::min(rows(), g1 * kernels::kFastRows)};
  }
  if (bf16()) {
    const auto [g0, g1] = group_split(bf16_.groups(), thread_index, n_threads, align_rows);
    return {std::min(rows(), g0 * kernels::kBf16Rows), std::min(rows(), g1 * kernels::kBf16Rows)};
  }
  if (!packed()) {
    // Shares on align_rows, a multiple of the kernels' own 16-row split (and
    // of a repacked Q4_K's eight-row groups).
    if (align_rows > 1 && align_rows % kernels::kPackRows == 0)
      return ThreadPool::split(rows(), thread_index, n_threads, align_rows);
    return kernels::matmul_row_split(rows(), thread_index, n_threads);
  }
  const auto [g0, g1] = group_split(packed_.groups(), thread_index, n_threads, align_rows);
  return {std::min(rows(), g0 * kernels::kPackRows), std::min(rows(), g1 * kernels::kPackRows)};
}

std::pair<const void*, size_t> Linear::thread_bytes(int thread_index, int n_threads, int64_t align_rows) const {
  const auto [r0, r1] = thread_rows(thread_index, n_threads, align_rows);
  return rows_bytes(r0, r1);
}

}  // namespace inferd
