#include "kernels/cpu/moe_routing.h"

#include <cmath>
#include <limits>

#include "kernels/cpu/attention_ggml_avx2_impl.h"

namespace inferd::kernels {

namespace {

// e^(w - max) in place and their double sum, as ggml_vec_soft_max_f32: whole
// vectors of K::kLanes by GGML's vector expf, each vector's sum reduced as its
// build does; the tail one by one with libm's expf.
template <class K>
double exp_and_sum(float* w, int64_t n, float max) {
  constexpr int L = K::kLanes;
  double sum = 0;
  int64_t i = 0;
  for (; i + L <= n; i += L) {
    for (int l = 0; l < L; ++l) w[i + l] = K::expf(w[i + l] - max);
    sum += static_cast<double>(K::reduce_prefill(w + i));
  }
  for (; i < n; ++i) {
    const float e = std::exp(w[i] - max);
    sum += static_cast<double>(e);
    w[i] = e;
  }
  return sum;
}

// ggml_soft_max on one row of n (scale 1, no mask).
void softmax_row(float* w, int64_t n, GgmlFlavour flavour) {
  float max = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) max = std::max(max, w[i]);
  const double sum = flavour == GgmlFlavour::kAvx2 ? exp_and_sum<detail::ggml_avx2::Build>(w, n, max)
                                                   : exp_and_sum<detail::Avx512Build>(w, n, max);
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) w[i] *= inv;
}

}  // namespace

void route_token(const RouterParams& p, float* logits, float* scratch, int32_t* chosen, float* weights,
                 GgmlFlavour flavour) {
  const int64_t n = p.n_expert, k = p.n_used;
  float* probs = logits;
  switch (p.gating) {
    case RouterGating::kSoftmax: softmax_row(probs, n, flavour); break;
    case RouterGating::kSigmoid:
      for (int64_t i = 0; i < n; ++i) probs[i] = 1.0f / (1.0f + std::exp(-probs[i]));
      break;
    case RouterGating::kSoftmaxOfChosen: break;  // chosen on the logits themselves
  }
  const float* score = probs;
  if (p.selection_bias) {
    for (int64_t i = 0; i < n; ++i) scratch[i] = probs[i] + p.selection_bias[i];
    score = scratch;
  }
  // The k highest scores, highest first: what a descending sort puts first
  // (k is small: a selection, not a sort).
  for (int64_t j = 0; j < k; ++j) {
    int32_t best = -1;
    for (int64_t i = 0; i < n; ++i) {
      bool taken = false;
      for (int64_t c = 0; c < j && !taken; ++c) taken = chosen[c] == i;
      if (taken) continue;
      if (best < 0 || score[i] > score[best]) best = static_cast<int32_t>(i);
    }
    chosen[j] = best;
    weights[j] = probs[best];
  }
  if (p.gating == RouterGating::kSoftmaxOfChosen) softmax_row(weights, k, flavour);
  if (p.normalize) {
    // ggml_sum_rows (a double sum), clamped to the smallest normal f16.
    double sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += static_cast<double>(weights[j]);
    const float total = std::max(static_cast<float>(sum), 6.103515625e-5f);
    for (int64_t j = 0; j < k; ++j) weights[j] = weights[j] / total;
  }
  if (p.scale != 0.0f && p.scale != 1.0f)
    for (int64_t j = 0; j < k; ++j) weights[j] *= p.scale;
}

void combine_experts(const float* const* rows, const float* weights, int64_t k, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = rows[0][i] * weights[0];
  for (int64_t j = 1; j < k; ++j) {
    const float* r = rows[j];
    const float w = weights[j];
    for (int64_t i = 0; i < n; ++i) {
      const float product = r[i] * w;  // rounded before the add, as GGML's separate mul
      out[i] = out[i] + product;
    }
  }
}

}  // namespace inferd::kernels
