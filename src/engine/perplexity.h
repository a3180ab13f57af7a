// Perplexity of a model over a text, the way llama.cpp's llama-perplexity
// measures it, and how far another KV cache dtype moves the model's
// predictions from an f16 cache's (KL divergence, same top token), computed
// side by side in one run: what a compressed KV cache costs in quality.
//
// The text's tokens are cut into windows of `context` tokens (the first of
// each window replaced by BOS where the tokenizer adds one), each window is
// run from an empty cache, and the second half of each window is scored:
// position p predicts token p + 1, for p in [context / 2, context - 1). The
// same windows and positions as llama-perplexity, so the figures compare.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "core/dtype.h"
#include "core/result.h"
#include "kv/kv_cache_spec.h"
#include "model/model.h"

namespace inferd {

struct PerplexityOptions {
  int64_t context = 512;      // tokens per window (llama-perplexity -c)
  int64_t batch = 512;        // tokens per forward pass (-b)
  int64_t max_windows = -1;   // -1: every whole window of the text (--chunks)
  DType kv_dtype = kv::kDefaultKVCacheDType;
  // Also run each window on an f16 cache and compare the two distributions
  // at every scored position.
  bool compare_with_f16 = false;
  // The model that comparison runs on, when not the measured one: the same
  // file loaded with other numerics (the exact tier, to measure the fast
  // tier's KL divergence from it).
  Model* base_model = nullptr;
};

struct PerplexityResult {
  int64_t windows = 0;
  int64_t scored = 0;  // positions scored
  double sum_nll = 0, sum_nll2 = 0;

  // Perplexity, e^(mean negative log-likelihood), and its standard error
  // (llama-perplexity's: the mean's standard error carried through e^x).
  double perplexity() const;
  double perplexity_error() const;

  // With compare_with_f16: the f16 cache's figures at the same positions,
  // KL(f16 || this dtype) per position, whether the most likely token is the
  // same, and the change in the probability of the text's next token.
  bool compared = false;
  double sum_nll_base = 0;
  std::vector<float> kl;      // per scored position, in order
  std::vector<float> p_diff;  // p(next token) - p_f16(next token)
  int64_t same_top = 0;

  double perplexity_base() const;
  double kl_mean() const;
  double kl_mean_error() const;
  // The q-th quantile (0..1) of the per-position KL divergences.
  double kl_quantile(double q) const;
  double p_diff_rms() const;
  double same_top_share() const { return scored > 0 ? static_cast<double>(same_top) / scored : 0.0; }
};

// Scores `tokens` (the whole text, encoded with its BOS). on_window, when
// given, sees the running result after each window. An error when the text
// is shorter than one window, the options are out of range, or the model's
// executor cannot read the KV dtype.
Result<PerplexityResult> measure_perplexity(Model& model, const std::vector<int32_t>& tokens,
                                            const PerplexityOptions& options,
                                            const std::function<void(const PerplexityResult&)>& on_window = {});

// log p(token) and the index of the largest logit of one row of logits
// (log-softmax in double, the largest logit's first index on ties), and the
// row's log-probabilities into log_probs when it is not null.
struct RowScore {
  double log_prob;
  int64_t top;
};
RowScore score_row(const float* logits, int64_t n_vocab, int32_t token, std::vector<double>* log_probs);

}  // namespace inferd
