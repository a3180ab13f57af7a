// A loaded model: its file, hyper-parameters, weights, tokenizer and the CPU
// forward pass over a ForwardBatch.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/result.h"
#include "core/thread_pool.h"
#include "gguf/gguf.h"
#include "kernels/cpu/matmul.h"
#include "model/config.h"
#include "model/forward_batch.h"
#include "model/kv_cache.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"

namespace inferd {

struct LoadOptions {
  // Called with the fraction of weight data paged in so far (for a progress bar).
  std::function<void(double)> progress;
  bool prefault = true;
};

class Model {
 public:
  // Opens, validates and maps a GGUF model. Fails with a message naming the
  // problem for a missing/corrupt file or an unsupported architecture.
  static Result<std::unique_ptr<Model>> load(const std::string& path, const LoadOptions& options);

  const ModelConfig& config() const { return config_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const gguf::File& file() const { return *file_; }
  const ModelWeights& weights() const { return weights_; }
  bool can_generate() const { return architecture_can_generate(config_.architecture); }

  // Runs the batch through the network, writing each token's keys and values
  // into `cache` at its slot, and returns logits for batch.logit_rows
  // (logit_rows.size() x n_vocab, row-major) in `logits`.
  // Not thread-safe: one forward pass at a time per Model.
  void forward(const ForwardBatch& batch, KVCache& cache, std::vector<float>& logits,
               ThreadPool& pool);

 private:
  Model() = default;
  void attention(const ForwardBatch& batch, KVCache& cache, int64_t layer, ThreadPool& pool);

  std::unique_ptr<gguf::File> file_;
  ModelConfig config_;
  ModelWeights weights_;
  std::unique_ptr<Tokenizer> tokenizer_;

  // Activations for the current step, grown on demand and then reused.
  struct Scratch {
    std::vector<float> x, h, q, k, v, attn, gate, up, logits_in;
    std::vector<float> rope_cos, rope_sin;  // per token, rope_dim/2 each
    kernels::Workspace ws;
  } s_;
};

}  // namespace inferd
