// The CPU executor of encoder models (ArchitectureTraits::encoder: BERT): one
// barrier-synchronised pass over a ForwardBatch on a thread pool, walking the
// layers' programs (LayerNormPhase, PlainFfnPhase, non-causal AttentionPhase)
// with the decoders' projection kernels (Linear), and pooling each sequence's
// hidden states into its output (ModelConfig::pooling).
//
// Every sequence of the batch is one whole input: it attends to itself only,
// over its own keys and values, kept in the step's scratch; an encoder keeps
// nothing between steps, so the KV cache passed in is not used. A token's
// arithmetic depends only on its own sequence (Linear sums by each token's
// place in its sequence), so an input's output is the same alone or batched.
#pragma once
#include <memory>
#include <vector>

#include "model/linear.h"
#include "model/model.h"

namespace inferd {

class CpuEncoderExecutor final : public Executor {
 public:
  CpuEncoderExecutor(const Model& model, std::shared_ptr<ThreadPool> pool);

  // Writes one row per batch.logit_rows entry: the pooled output of the
  // sequence holding that token (n_embd floats, or a reranker's scores).
  void forward(const ForwardBatch& batch, KVCache& cache, std::vector<float>& outputs) override;
  std::shared_ptr<ThreadPool> thread_pool() const override { return pool_; }
  // It keeps no keys or values across steps: any cache the engine makes is left alone.
  Status supports_kv_cache(const kv::KVCacheSpec&) const override { return {}; }
  // The floats per output row (Model::n_logits).
  int64_t output_width() const;

 private:
  struct LayerLinears {
    Linear q, k, v, o, up, down;
  };
  struct Pass {
    const ForwardBatch* batch;
    float* outputs;
    StepTokens tokens;
  };
  void forward_thread(const Pass& pass, int ti, int nt);
  // x <- LayerNorm(x + h + bias) for tokens [t0, t1) (h, bias: when given).
  void add_layer_norm(float* x, const float* h, const float* bias, const float* weight, const float* norm_bias,
                      int64_t t0, int64_t t1) const;
  void attention(const Pass& pass, const AttentionPhase& phase, int ti, int nt);
  // The pooled output of sequence `seq` into out.
  void pool_sequence(const SequenceSlice& seq, float* out) const;

  std::shared_ptr<ThreadPool> pool_;
  const ModelConfig& config_;
  const std::vector<LayerProgram>& programs_;
  const ModelWeights& weights_;
  std::unique_ptr<kernels::PackedArena> packed_arena_;
  std::vector<LayerLinears> linears_;

  // The step's activations, grown on demand and reused.
  struct Scratch {
    std::vector<float> x, h, q, k, v, attn, up;
    LinearInput in_q, in_k, in_v, in_o, in_up, in_down;
    std::vector<kernels::TokenPlace> places;
    std::vector<int32_t> token_seq;  // each token's sequence
  } s_;
};

}  // namespace inferd
