// The router of a mixture-of-experts FFN: from one token's router logits to
// the experts it uses and their weights, and the weighted sum of those
// experts' outputs, in the arithmetic of llama.cpp's build_moe_ffn on GGML's
// CPU backend (soft_max, argsort_top_k, get_rows, sum_rows, clamp, div,
// scale, then mul and one add per further expert), so that the experts chosen
// and their outputs are the bits llama.cpp computes.
#pragma once
#include <cstdint>

#include "kernels/cpu/flavour.h"

namespace inferd::kernels {

enum class RouterGating {
  kSoftmax,          // probabilities: softmax over every expert
  kSigmoid,          // probabilities: sigmoid of each logit
  kSoftmaxOfChosen,  // choose on the logits, weights: softmax over the chosen ones
};

struct RouterParams {
  RouterGating gating = RouterGating::kSoftmax;
  int64_t n_expert = 0;
  int64_t n_used = 0;
  bool normalize = false;                // weights divided by their sum (clamped below at 2^-14)
  float scale = 0.0f;                    // weights times this unless 0 or 1
  const float* selection_bias = nullptr; // added to the probabilities for choosing only (n_expert)
};

// Routes one token: logits (n_expert, overwritten with the probabilities)
// into chosen[0, n_used) (highest selection score first, as GGML's
// descending argsort; the lower index first on a tie) and weights[0, n_used).
// scratch: n_expert floats.
void route_token(const RouterParams& p, float* logits, float* scratch, int32_t* chosen, float* weights,
                 GgmlFlavour flavour);

// out[i] = sum over j of rows[j][i] * weights[j], i < n: each product rounded,
// then added in j order (GGML's mul, then one add per further expert).
void combine_experts(const float* const* rows, const float* weights, int64_t k, int64_t n, float* out);

}  // namespace inferd::kernels
