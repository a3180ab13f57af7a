// Generation for a single sequence: prefill the prompt in chunks, then decode
// one token at a time, reusing the KV cache of the longest common prefix with
// the previous call (so a chat does not recompute earlier turns). The CLI's
// `generate` and `chat` run on this; the batching engine serves many sequences.
#pragma once
#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include "core/result.h"
#include "model/model.h"
#include "sampling/sampler.h"

namespace inferd {

struct GenerationOptions {
  int64_t max_tokens = 128;
  SamplingParams sampling;
  bool stop_at_end_of_generation = true;
  int64_t prefill_chunk = 512;  // tokens per forward pass while prefilling
  // When set, receives the logits at the prompt's last position (what the
  // first token is sampled from).
  std::vector<float>* prompt_logits = nullptr;
};

struct GenerationStats {
  int64_t prompt_tokens = 0;
  int64_t reused_prompt_tokens = 0;  // served from the cache of an earlier call
  int64_t generated_tokens = 0;
  double prefill_seconds = 0;
  double decode_seconds = 0;
};

class SequenceGenerator {
 public:
  // kv_dtype: the element type of its KV cache (one the model's executor
  // reads); skip_sliding_window: sliding-window layers' in f16 (KVLayout::plan).
  SequenceGenerator(Model& model, int64_t max_context, DType kv_dtype = kv::kDefaultKVCacheDType,
                    bool skip_sliding_window = false);

  // on_token is called with each new token; returning false stops generation.
  // Returns the generated tokens (the stopping end-of-generation token included).
  Result<std::vector<int32_t>> generate(const std::vector<int32_t>& prompt,
                                        const GenerationOptions& options,
                                        const std::function<bool(int32_t)>& on_token);

  // Runs the prompt only and returns the logits at its last position.
  Result<std::vector<float>> prompt_logits(const std::vector<int32_t>& prompt);

  // Feeds tokens[from, to) at positions from..to-1, after the cache's
  // positions [0, from), and returns the logits of the positions in
  // [first_logit, last_logit) among them, a row each, in order (scoring:
  // engine/perplexity.h). The next generate() recomputes its whole prompt.
  void feed(const std::vector<int32_t>& tokens, int64_t from, int64_t to, int64_t first_logit, int64_t last_logit,
            std::vector<float>& logits);

  const KVLayout& kv_layout() const { return cache_.layout(); }
  const GenerationStats& stats() const { return stats_; }
  int64_t max_context() const { return max_context_; }

 private:
  // Feeds tokens[from, to) at positions from..to-1; logits of positions
  // [first_logit, last_logit) into `logits`.
  void run(const std::vector<int32_t>& tokens, int64_t from, int64_t to, int64_t first_logit, int64_t last_logit,
           std::vector<float>& logits);

  Model& model_;
  int64_t max_context_;
  KVCache cache_;
  std::vector<std::vector<int32_t>> block_tables_;  // per KV group
  std::vector<int32_t> cached_;  // tokens whose keys/values are in the cache
  ForwardBatch batch_;
  std::vector<float> logits_;
  GenerationStats stats_;
};

}  // namespace inferd
