#include "sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/argmax.h"

namespace inferd {

Status SamplingParams::validate() const {
  if (!(temperature >= 0.0f) || !std::isfinite(temperature))
    return make_error("temperature must be a finite number >= 0");
  if (top_k < -1) return make_error("top_k must be -1, 0 (disabled) or a positive number");
  if (!(top_p > 0.0f && top_p <= 1.0f)) return make_error("top_p must be in (0, 1]");
  if (!(min_p >= 0.0f && min_p <= 1.0f)) return make_error("min_p must be in [0, 1]");
  if (!(repetition_penalty > 0.0f) || !std::isfinite(repetition_penalty))
    return make_error("repetition_penalty must be a finite number > 0");
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f))
    return make_error("frequency_penalty must be in [-2, 2]");
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f))
    return make_error("presence_penalty must be in [-2, 2]");
  return {};
}

int32_t argmax(const float* logits, int64_t n_vocab) {
  const kernels::RangeMax best = kernels::range_max(logits, n_vocab);
  return best.index < 0 ? 0 : static_cast<int32_t>(best.index);  // every logit NaN: 0
}

namespace {
double log_sum_exp(const float* logits, int64_t n) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, logits[i]);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(logits[i]) - mx);
  return mx + std::log(sum);
}
}  // namespace

float token_logprob(const float* logits, int64_t n_vocab, int32_t token) {
  return static_cast<float>(logits[token] - log_sum_exp(logits, n_vocab));
}

int32_t token_rank(const float* logits, int64_t n_vocab, int32_t token) {
  int32_t ahead = 0;
  for (int64_t i = 0; i < n_vocab; ++i)
    ahead += logits[i] > logits[token] || (logits[i] == logits[token] && i < token);
  return ahead + 1;
}

std::vector<TokenLogprob> top_logprobs(const float* logits, int64_t n_vocab, int n) {
  const double lse = log_sum_exp(logits, n_vocab);
  std::vector<int32_t> idx(n_vocab);
  for (int64_t i = 0; i < n_vocab; ++i) idx[i] = static_cast<int32_t>(i);
  n = static_cast<int>(std::min<int64_t>(n, n_vocab));
  std::partial_sort(idx.begin(), idx.begin() + n, idx.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  std::vector<TokenLogprob> out;
  for (int i = 0; i < n; ++i) out.push_back({idx[i], static_cast<float>(logits[idx[i]] - lse)});
  return out;
}

Sampler::Sampler(SamplingParams params) : params_(params) {
  rng_.seed(params_.seed ? *params_.seed : std::random_device{}());
}

double Sampler::uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

void Sampler::apply_penalties(float* logits, int64_t n_vocab, const std::vector<int32_t>& prompt,
                              const std::vector<int32_t>& output) {
  const SamplingParams& p = params_;
  if (p.repetition_penalty != 1.0f) {
    // As in vLLM and HF: divide positive logits, multiply negative ones, once
    // per distinct token seen in prompt or output.
    counts_.assign(n_vocab, 0);
    for (const auto* seq : {&prompt, &output})
      for (int32_t t : *seq)
        if (t >= 0 && t < n_vocab && !counts_[t]++) {
          float& l = logits[t];
          l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
        }
  }
  if (p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f) {
    counts_.assign(n_vocab, 0);
    for (int32_t t : output)
      if (t >= 0 && t < n_vocab) ++counts_[t];
    for (int32_t t : output) {
      if (t < 0 || t >= n_vocab || counts_[t] == 0) continue;
      logits[t] -= p.frequency_penalty * counts_[t] + p.presence_penalty;
      counts_[t] = 0;  // apply once per distinct token
    }
  }
}

int32_t Sampler::sample(float* logits, int64_t n_vocab, const std::vector<int32_t>& prompt,
                        const std::vector<int32_t>& output) {
  apply_penalties(logits, n_vocab, prompt, output);
  if (params_.greedy()) return argmax(logits, n_vocab);

  const bool truncates = (params_.top_k > 0 && params_.top_k < n_vocab) || params_.top_p < 1.0f ||
                         params_.min_p > 0.0f;
  if (!truncates) {
    // Plain temperature sampling: no need to sort the vocabulary; walk it in
    // id order.
    float mx = logits[0];
    for (int64_t i = 1; i < n_vocab; ++i) mx = std::max(mx, logits[i]);
    const float inv_t = 1.0f / params_.temperature;
    double total = 0.0;
    candidates_.resize(n_vocab);
    for (int64_t i = 0; i < n_vocab; ++i) {
      const float w = std::exp((logits[i] - mx) * inv_t);
      candidates_[i] = {w, static_cast<int32_t>(i)};
      total += w;
    }
    double r = uniform() * total;
    for (const auto& c : candidates_) {
      r -= c.first;
      if (r < 0) return c.second;
    }
    return static_cast<int32_t>(n_vocab - 1);
  }

  // Candidates sorted by logit (ties by id, so the order is deterministic).
  candidates_.clear();
  for (int64_t i = 0; i < n_vocab; ++i)
    candidates_.emplace_back(logits[i] / params_.temperature, static_cast<int32_t>(i));
  auto by_logit = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  size_t keep = candidates_.size();
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < keep) {
    keep = params_.top_k;
    std::partial_sort(candidates_.begin(), candidates_.begin() + keep, candidates_.end(), by_logit);
  } else {
    std::sort(candidates_.begin(), candidates_.end(), by_logit);
  }
  candidates_.resize(keep);

  // Softmax over the survivors.
  const float mx = candidates_[0].first;
  double total = 0.0;
  for (auto& c : candidates_) {
    c.first = std::exp(c.first - mx);
    total += c.first;
  }
  // min-p: drop tokens below min_p times the top probability.
  if (params_.min_p > 0.0f) {
    const float threshold = params_.min_p * candidates_[0].first;
    size_t n = 1;
    while (n < candidates_.size() && candidates_[n].first >= threshold) ++n;
    for (size_t i = n; i < candidates_.size(); ++i) total -= candidates_[i].first;
    candidates_.resize(n);
  }
  // top-p: the smallest prefix whose mass reaches top_p.
  if (params_.top_p < 1.0f) {
    double cumulative = 0.0, kept_total = 0.0;
    size_t n = 0;
    while (n < candidates_.size()) {
      cumulative += candidates_[n].first / total;
      kept_total += candidates_[n].first;
      ++n;
      if (cumulative >= params_.top_p) break;
    }
    candidates_.resize(n);
    total = kept_total;
  }
  double r = uniform() * total;
  for (const auto& c : candidates_) {
    r -= c.first;
    if (r < 0) return c.second;
  }
  return candidates_.back().second;
}

}  // namespace inferd
