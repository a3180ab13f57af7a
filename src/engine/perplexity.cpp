#include "engine/perplexity.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "engine/sequence_generator.h"

namespace inferd {

namespace {

double mean_error(double sum, double sum2, int64_t n) {
  if (n < 2) return 0.0;
  const double mean = sum / n;
  const double var = sum2 / n - mean * mean;
  return var > 0 ? std::sqrt(var / (n - 1)) : 0.0;
}

}  // namespace

RowScore score_row(const float* logits, int64_t n_vocab, int32_t token, std::vector<double>* log_probs) {
  int64_t top = 0;
  for (int64_t i = 1; i < n_vocab; ++i)
    if (logits[i] > logits[top]) top = i;
  const double max = logits[top];
  double sum = 0.0;
  for (int64_t i = 0; i < n_vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - max);
  const double log_sum = max + std::log(sum);
  if (log_probs) {
    log_probs->resize(static_cast<size_t>(n_vocab));
    for (int64_t i = 0; i < n_vocab; ++i) (*log_probs)[i] = static_cast<double>(logits[i]) - log_sum;
  }
  return {static_cast<double>(logits[token]) - log_sum, top};
}

double PerplexityResult::perplexity() const { return scored > 0 ? std::exp(sum_nll / scored) : 0.0; }

double PerplexityResult::perplexity_error() const {
  return perplexity() * mean_error(sum_nll, sum_nll2, scored);
}

double PerplexityResult::perplexity_base() const { return scored > 0 ? std::exp(sum_nll_base / scored) : 0.0; }

double PerplexityResult::kl_mean() const {
  double s = 0;
  for (float v : kl) s += v;
  return kl.empty() ? 0.0 : s / static_cast<double>(kl.size());
}

double PerplexityResult::kl_mean_error() const {
  double s = 0, s2 = 0;
  for (float v : kl) s += v, s2 += static_cast<double>(v) * v;
  return mean_error(s, s2, static_cast<int64_t>(kl.size()));
}

double PerplexityResult::kl_quantile(double q) const {
  if (kl.empty()) return 0.0;
  std::vector<float> sorted = kl;
  std::sort(sorted.begin(), sorted.end());
  const size_t i = std::min(sorted.size() - 1, static_cast<size_t>(q * static_cast<double>(sorted.size() - 1) + 0.5));
  return sorted[i];
}

double PerplexityResult::p_diff_rms() const {
  double s2 = 0;
  for (float v : p_diff) s2 += static_cast<double>(v) * v;
  return p_diff.empty() ? 0.0 : std::sqrt(s2 / static_cast<double>(p_diff.size()));
}

Result<PerplexityResult> measure_perplexity(Model& model, const std::vector<int32_t>& tokens,
                                            const PerplexityOptions& o,
                                            const std::function<void(const PerplexityResult&)>& on_window) {
  const ModelConfig& config = model.config();
  const int64_t n_vocab = config.n_vocab;
  if (o.context < 4) return make_error("the context must be at least 4 tokens");
  if (o.context > config.context_length)
    return make_error("the context (" + std::to_string(o.context) + ") exceeds the model's (" +
                      std::to_string(config.context_length) + ")");
  if (o.batch < 1) return make_error("the batch must be at least 1 token");
  const int64_t whole = static_cast<int64_t>(tokens.size()) / o.context;
  if (whole < 1)
    return make_error("the text has " + std::to_string(tokens.size()) + " tokens, fewer than one window of " +
                      std::to_string(o.context));
  const int64_t windows = o.max_windows < 0 ? whole : std::min(whole, o.max_windows);

  // A window's keys and values in the dtype asked for, and in f16 beside it.
  SequenceGenerator cache(model, o.context, o.kv_dtype);
  if (Status s = model.check_kv_cache(cache.kv_layout()); !s) return s.error();
  std::unique_ptr<SequenceGenerator> base;
  if (o.compare_with_f16) {
    Model& base_model = o.base_model ? *o.base_model : model;
    if (base_model.config().n_vocab != n_vocab) return make_error("the comparison model has another vocabulary");
    base = std::make_unique<SequenceGenerator>(base_model, o.context, DType::F16);
  }

  const Tokenizer& tok = model.tokenizer();
  const bool bos = tok.add_bos() && tok.bos_id() >= 0;
  // Position p's logits predict token p + 1: the scored positions.
  const int64_t first = o.context / 2, last = o.context - 1;

  PerplexityResult r;
  r.compared = o.compare_with_f16;
  std::vector<float> logits, base_logits;
  std::vector<double> log_probs, base_log_probs;
  for (int64_t w = 0; w < windows; ++w) {
    std::vector<int32_t> window(tokens.begin() + w * o.context, tokens.begin() + (w + 1) * o.context);
    if (bos) window[0] = tok.bos_id();
    for (int64_t from = 0; from < o.context; from += o.batch) {
      const int64_t to = std::min(o.context, from + o.batch);
      cache.feed(window, from, to, first, last, logits);
      if (base) base->feed(window, from, to, first, last, base_logits);
      for (int64_t p = std::max(from, first), row = 0; p < std::min(to, last); ++p, ++row) {
        const int32_t next = window[p + 1];
        const float* l = logits.data() + row * n_vocab;
        const RowScore s = score_row(l, n_vocab, next, base ? &log_probs : nullptr);
        r.sum_nll -= s.log_prob;
        r.sum_nll2 += s.log_prob * s.log_prob;
        ++r.scored;
        if (!base) continue;
        const RowScore b = score_row(base_logits.data() + row * n_vocab, n_vocab, next, &base_log_probs);
        r.sum_nll_base -= b.log_prob;
        double kl = 0;
        for (int64_t i = 0; i < n_vocab; ++i) kl += std::exp(base_log_probs[i]) * (base_log_probs[i] - log_probs[i]);
        r.kl.push_back(static_cast<float>(std::max(0.0, kl)));
        r.p_diff.push_back(static_cast<float>(std::exp(s.log_prob) - std::exp(b.log_prob)));
        r.same_top += s.top == b.top;
      }
    }
    ++r.windows;
    if (on_window) on_window(r);
  }
  return r;
}

}  // namespace inferd
