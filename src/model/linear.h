// One projection's weights in the form the kernels run fastest, and its two
// steps for a forward pass that runs inside one parallel region: quantize the
// input rows (threads split tokens), then multiply (threads split weight rows).
//
// Q4_0/Q4_1/Q5_0/Q8_0/MXFP4 weights are repacked at load time into row-interleaved
// groups (kernels/cpu/packed.h), and so are the Q4_K weights llama.cpp repacks
// (kernels/cpu/kquant_pack.h, its own layout and GGML's orders); other types
// run on their GGML rows in the mapped file.
// Either way each product is summed in the order llama.cpp's CPU backend uses
// for that weight (kernels/cpu/matmul.h, matmul_rows_ggml), so
// for some types it depends on each token's place in its sequence's share of
// the step (StepTokens), never on other sequences or the threads.
// With the fast numerics (kernels/cpu/numerics.h) the block formats are
// repacked for the fast tier's kernels instead (kernels/cpu/fast_gemm.h),
// whose results depend on nothing but the token's own row, and F16/BF16
// weights into BF16 pairs for the tier's BF16 product (kernels/cpu/bf16_gemm.h);
// F32 weights (a mixture's router) keep the exact kernels in both tiers; in the
// fast tier those kernels (and any other weight it leaves to them) sum every
// token as a one-token step's (TokenPlace{1, 0}, whatever StepTokens says), so
// that there too a token's result does not depend on the step's shape.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/cpu/bf16_gemm.h"
#include "kernels/cpu/fast_gemm.h"
#include "kernels/cpu/flavour.h"
#include "kernels/cpu/kquant_pack.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/numerics.h"
#include "kernels/cpu/packed.h"
#include "model/weights.h"

namespace inferd {

// A projection's input, quantized as its kernels want it. One input can feed
// several projections that want the same form (Linear::same_input).
struct LinearInput {
  kernels::PackedActivations packed;  // for packed weights
  kernels::FastActivations fast;      // for the fast tier's weights
  kernels::Bf16Activations bf16;      // for the fast tier's F16/BF16 weights
  std::vector<uint8_t> rows;          // for GGML-layout weights
  size_t row_bytes = 0;
};

// The token rows a projection runs on: how many, and where each sits in its
// sequence's share of the step (which GGML kernel llama.cpp would use for it).
struct StepTokens {
  int64_t n = 0;
  const kernels::TokenPlace* places = nullptr;  // n entries
};

class Linear {
 public:
  Linear() = default;
  // Repacks w when the packed kernels take its type (into arena when given).
  // flavour: whose order F32 weights are summed in (kernels/cpu/float_matmul.h;
  // the other types' orders are the same in both GGML builds).
  // numerics: the fast tier repacks the block formats for its own kernels.
  // done: told as the copy's rows are finished, when make() copies w at all
  // (kernels::RowsRepacked), so that the caller can release w's pages behind it.
  static Linear make(const WeightView& w, kernels::PackedArena* arena = nullptr,
                     kernels::GgmlFlavour flavour = kernels::GgmlFlavour::kAvx2,
                     kernels::Numerics numerics = kernels::Numerics::kExact,
                     const kernels::RowsRepacked& done = {});
  // The arena space make() repacks w into (0 when it reads w in place).
  static size_t packed_bytes(const WeightView& w, kernels::Numerics numerics = kernels::Numerics::kExact);

  int64_t rows() const { return view_.rows; }
  int64_t cols() const { return view_.cols; }
  bool packed() const { return static_cast<bool>(packed_); }
  // True when the fast tier's integer kernels run this projection.
  bool fast() const { return static_cast<bool>(fast_); }
  // True when the fast tier's BF16 product runs it (F16/BF16 weights).
  bool bf16() const { return static_cast<bool>(bf16_); }
  // True when the kernels read a repacked copy, not the weight's bytes in the file.
  bool reads_copy() const { return packed() || fast() || bf16() || static_cast<bool>(q4k_) || copied_; }
  // True when `other` wants its input quantized exactly as this one does.
  bool same_input(const Linear& other) const;

  // Sizes `in` for n_tokens rows (call before the parallel region).
  void prepare(LinearInput& in, int64_t n_tokens) const;
  // Quantizes rows [t0, t1) of x (tokens.n x cols floats) into `in`.
  void quantize(const float* x, int64_t t0, int64_t t1, const StepTokens& tokens, LinearInput& in) const;
  // Columns per block of the quantized input. Blocks are quantized one by one,
  // so threads can share one token's row.
  int64_t quantize_block() const {
    if (fast()) return kernels::FastActivations::block_of(fast_.acts());
    if (bf16()) return kernels::kBf16ActBlock;
    return packed() ? kernels::kPackedActBlock : kernels::matmul_act_block(view_.dtype);
  }
  // Quantizes the blocks [b0, b1) of row t of x (tokens.n x cols floats).
  void quantize_blocks(const float* x, int64_t t, int64_t b0, int64_t b1, const StepTokens& tokens,
                       LinearInput& in) const;
  // y[t * rows + r] for this thread's share of the rows and all n_tokens tokens.
  // The shares start on multiples of align_rows when it is a multiple of 16
  // (the packed weights' row group), so that a thread can go on to work on its
  // own rows' outputs without waiting for the others.
  void compute(const LinearInput& in, const StepTokens& tokens, float* y, int thread_index, int n_threads,
               int64_t align_rows = 1) const;
  // y[t * rows + r] for rows [r0, r1) and all n_tokens tokens; for packed
  // weights r0 and r1 must be multiples of the 16-row group (or r1 == rows()).
  void compute_rows(const LinearInput& in, const StepTokens& tokens, float* y, int64_t r0, int64_t r1) const;
  // compute_rows() on the input rows [first, first + tokens.n) of `in` only
  // (tokens.places for those rows); y[i * rows + r] for the i-th of them.
  void compute_rows_span(const LinearInput& in, int64_t first, const StepTokens& tokens, float* y, int64_t r0,
                         int64_t r1) const;
  // Copies input row t of `from` to row r of `to` (both prepared by this Linear,
  // or by one of the same input form): a token's quantized row, gathered for an expert.
  void copy_input_row(const LinearInput& from, int64_t t, LinearInput& to, int64_t r) const;
  // The weight bytes compute_rows() reads for rows [r0, r1): one contiguous range.
  std::pair<const void*, size_t> rows_bytes(int64_t r0, int64_t r1) const;
  // The rows [r0, r1) that compute() gives this thread.
  std::pair<int64_t, int64_t> thread_rows(int thread_index, int n_threads, int64_t align_rows = 1) const;
  // The weight bytes compute() reads for this thread: one contiguous range.
  std::pair<const void*, size_t> thread_bytes(int thread_index, int n_threads, int64_t align_rows = 1) const;

 private:
  WeightView view_;
  kernels::PackedMatrix packed_;
  kernels::FastMatrix fast_;  // the fast tier's codes (then nothing else is packed)
  kernels::Bf16Matrix bf16_;  // the fast tier's BF16 pairs (then nothing else is packed)
  kernels::RepackedQ4K q4k_;  // GGML-order Q4_K in eight-row groups (its input as for view_)
  bool copied_ = false;       // view_ points at a verbatim copy of the file's rows in the arena
  bool f32_avx512_order_ = false;  // F32 weights summed as GGML's AVX-512 build sums them
  // The fast tier on the exact kernels: each token in a one-token step's order,
  // never its chunk's (kernels/cpu/matmul.h, TokenPlace), as the tier promises.
  bool each_token_alone_ = false;
  // tokens.places, or n places of a one-token step when each_token_alone_.
  const kernels::TokenPlace* places_of(const StepTokens& tokens) const;
};

}  // namespace inferd
