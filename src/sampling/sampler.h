// Turns one row of logits into the next token under a request's sampling
// parameters. Each request owns a Sampler whose random stream depends only on
// its seed, so the same seed and parameters give the same tokens whatever else
// shares the batch.
#pragma once
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/result.h"

namespace inferd {

struct SamplingParams {
  float temperature = 1.0f;       // 0: greedy
  int32_t top_k = 0;              // 0 or -1: disabled
  float top_p = 1.0f;             // (0, 1]
  float min_p = 0.0f;             // [0, 1]
  float repetition_penalty = 1.0f;  // > 0; applies to prompt and output tokens
  float frequency_penalty = 0.0f;   // [-2, 2]; output tokens only
  float presence_penalty = 0.0f;    // [-2, 2]; output tokens only
  std::optional<uint64_t> seed;

  // Error naming the first out-of-range field, if any.
  Status validate() const;
  bool greedy() const { return temperature <= 0.0f || top_k == 1; }
};

struct TokenLogprob {
  int32_t token;
  float logprob;
};

class Sampler {
 public:
  explicit Sampler(SamplingParams params);

  // Chooses a token from `logits` (n_vocab values; modified in place by the
  // penalties). `prompt` and `output` are the request's tokens so far.
  int32_t sample(float* logits, int64_t n_vocab, const std::vector<int32_t>& prompt,
                 const std::vector<int32_t>& output);

  const SamplingParams& params() const { return params_; }

 private:
  void apply_penalties(float* logits, int64_t n_vocab, const std::vector<int32_t>& prompt,
                       const std::vector<int32_t>& output);
  double uniform();  // [0, 1)

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;  // reused scratch
  std::vector<int32_t> counts_;                        // reused scratch
};

// Log-softmax value of `token` and the `n` most likely tokens, from raw logits.
std::vector<TokenLogprob> top_logprobs(const float* logits, int64_t n_vocab, int n);
float token_logprob(const float* logits, int64_t n_vocab, int32_t token);
// 1 + the tokens ranked above `token` (top_logprobs' order: higher logit,
// then lower id): 1 for the most likely token.
int32_t token_rank(const float* logits, int64_t n_vocab, int32_t token);

int32_t argmax(const float* logits, int64_t n_vocab);

}  // namespace inferd
