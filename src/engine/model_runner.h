// The model runner executes what the scheduler decided: it turns a
// SchedulerOutput into one flattened ForwardBatch (every scheduled token of
// every request end to end, with its position and KV slot), runs the forward
// pass, and samples from the logits where they are (sampling_stage.h): the
// engine gets back each request's tokens (and logprobs, beam candidates or
// pooled row), never the full rows. It owns the KV cache memory, sized once
// from a memory budget. It makes no policy (GUIDE rule 2): which tokens run
// and where they go is in the output.
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/result.h"
#include "engine/pipeline_link.h"
#include "engine/sampling_stage.h"
#include "engine/scheduler_output.h"
#include "engine/tensor_parallel_link.h"
#include "model/forward_batch.h"
#include "model/kv_cache.h"
#include "model/model.h"

namespace inferd {

struct ModelRunnerConfig {
  int32_t block_size = 16;  // tokens per KV block
  // The KV cache's element type (kv/kv_cache_spec.h); one the executor does
  // not read is refused at create().
  DType kv_cache_dtype = kv::kDefaultKVCacheDType;
  bool kv_cache_skip_sliding_window = false;  // sliding-window layers in f16
  // The KV cache's size: kv_cache_bytes if > 0, else this fraction of the
  // memory available now (MemAvailable).
  int64_t kv_cache_bytes = 0;
  double kv_cache_memory_fraction = 0.0;
  // > 0: at most this many blocks (more would never be used).
  int64_t max_blocks = 0;
  // > 0: exactly this many blocks, whatever the budget says (vLLM's
  // num_gpu_blocks_override): every layout of a model, one process or its
  // ranks, then caches the same tokens, each rank in its own share of bytes.
  int64_t n_blocks_override = 0;
  // Run a prefill-shaped and a decode-shaped pass at creation (as llama.cpp
  // does at load), so that the first request does not pay for first-touch
  // page faults, scratch growth and cold caches.
  bool warm_up = true;
  // The KV cache on shared memory that a consumer on this host can map (a KV
  // producer's; KVCache).
  bool kv_cache_shareable = false;
  // A model with recurrent layers: the state slots the cache holds (one per
  // request that can run at once; their memory comes out of the KV budget).
  int32_t n_state_slots = 0;
  // A pipeline stage (Model::layer_begin): the block count every stage can
  // hold, from this stage's own (a collective: every stage calls it once).
  std::function<int32_t(int32_t)> agree_on_blocks;
  // Rank 0 of a pipeline: where the other stages are (execute() runs the
  // first stage and gets the last one's samples back through it).
  std::shared_ptr<PipelineLink> pipeline;
  // Rank 0 of a tensor-parallel model (or of a pipeline's tensor-parallel
  // first stage): every forward pass here is first sent to the other ranks
  // (its stage's), whose passes it meets in its all-gathers.
  std::shared_ptr<TensorParallelLink> tensor_parallel;
};

// Bytes of host memory the system could give us now (MemAvailable), or 0 if unknown.
int64_t available_memory_bytes();

// The number of KV blocks (the reserved null block included) that `config`'s
// budget buys for this model, or an error naming the budget when it buys
// fewer than 2.
Result<int32_t> kv_blocks_for_budget(const ModelConfig& model, const ModelRunnerConfig& config);
// The same for a planned layout (a pipeline stage's: KVLayout::for_layers).
Result<int32_t> kv_blocks_for_budget(const KVLayout& layout, const ModelRunnerConfig& config);

class ModelRunner {
 public:
  static Result<std::unique_ptr<ModelRunner>> create(Model& model, const ModelRunnerConfig& config);

  // Fills `batch` from a step: per scheduled request, its new tokens at
  // positions num_computed_tokens.., their slots through the block table, its
  // slice of the batch, and (when it samples) the row of its last token, or
  // of its last num_draft_tokens + 1 tokens when it verifies drafts. Drafts
  // and output tokens recomputed after a preemption go in a decode_each slice
  // (the prompt part of a chunk in a slice of its own before it).
  static void build_batch(const SchedulerOutput& out, int64_t block_size, ForwardBatch& batch);

  // A request's sampling parameters and state, once, before it is first
  // scheduled; removed when the scheduler no longer runs it (SamplingStage).
  // With a pipeline, the sampling stage is the last rank's: they go there.
  void add_request(const std::string& id, SamplingRequest request) {
    if (pipeline_) return pipeline_->add_request(id, request);
    sampling_.add_request(id, std::move(request));
  }
  void remove_request(const std::string& id) {
    if (pipeline_) return pipeline_->remove_request(id);
    sampling_.remove_request(id);
  }
  size_t num_requests() const { return pipeline_ ? pipeline_->num_requests() : sampling_.num_requests(); }

  // Runs the step (compute_logits) and samples it (SamplingStage::sample):
  // per scheduled request, what it sampled. Valid (and movable from) until
  // the next execute().
  ModelRunnerOutput& execute(const SchedulerOutput& out, const StepSamplingInputs& inputs);

  // Rank 0 of a pipeline, one batch in three parts, so that the engine can
  // run the first stage of a batch while the later stages run the batches
  // before it (Engine's batches in flight): the first stage's pass ...
  void run_first_stage(const SchedulerOutput& out) { forward_stage(out, nullptr); }
  // ... hands the step and that stage's residual stream to the next stage
  // (after receive_samples() of the batch before, so that no two ranks wait
  // on each other's sends: distributed/pipeline.h) ...
  void hand_on(const SchedulerOutput& out, const StepSamplingInputs& inputs) {
    pipeline_->send_step(out, inputs);
    pipeline_->send_hidden(logits_);
  }
  // ... and what the last stage sampled for the oldest batch handed on
  // (with a shared head, after this stage's part of its logits went back).
  // Valid (and movable from) until the next receive_samples() or execute().
  ModelRunnerOutput& receive_samples();
  // A stage sharing the LM head (Model::head_shared): the logits of its head
  // rows for the last stage's final-norm rows. Valid until the next call.
  std::vector<float>& head_logits(const std::vector<float>& normed);
  int32_t pipeline_stages() const { return pipeline_ ? pipeline_->num_stages() : 1; }

  // A pipeline stage's pass (Model::forward_stage) after the step's block
  // copies: from `hidden_in` unless it is the first stage; returns the
  // residual stream it hands on, or on the last stage the logits, which
  // sample() then samples. Valid until the next call.
  std::vector<float>& forward_stage(const SchedulerOutput& out, const float* hidden_in);
  ModelRunnerOutput& sample(const SchedulerOutput& out, const StepSamplingInputs& inputs, std::vector<float>& logits);

  // The forward pass alone, after the step's block copies (copy on write). Returns, per scheduled request in
  // the order of out.scheduled: with `prompt_logits` set, a row of n_vocab() logits for each of its
  // positions before the prompt's last (prompt_logit_rows()); then with `sample` set,
  // num_draft_tokens + 1 rows. The rows stay valid (and
  // may be modified) until the next call. For a draft model's proposer, tests and benchmarks; a runner of
  // the whole model only (not a pipeline stage).
  std::vector<float>& compute_logits(const SchedulerOutput& out);

  // The rows of prompt positions a scheduled request gets before its sample rows.
  static int64_t prompt_logit_rows(const ScheduledRequest& s) {
    if (!s.prompt_logits) return 0;
    return std::max<int64_t>(0, std::min(s.num_computed_tokens + s.num_new_tokens, s.num_prompt_tokens - 1) -
                                    s.num_computed_tokens);
  }

  int32_t n_blocks() const { return static_cast<int32_t>(cache_.n_blocks()); }
  int32_t block_size() const { return static_cast<int32_t>(cache_.block_size()); }
  size_t kv_cache_bytes() const { return cache_.bytes(); }
  int64_t n_vocab() const { return model_.n_logits(); }  // logits per row
  Model& model() { return model_; }
  KVCache& kv_cache() { return cache_; }  // the pool's memory (offload tiers copy blocks)

 private:
  ModelRunner(Model& model, KVLayout layout, int32_t n_blocks, bool shareable_cache, int32_t n_state_slots,
              std::shared_ptr<PipelineLink> pipeline, std::shared_ptr<TensorParallelLink> tensor_parallel);
  // Forward passes over the reserved null block, whose contents nothing reads.
  void warm_up();

  Model& model_;
  KVCache cache_;
  ForwardBatch batch_;  // reused across steps
  std::vector<float> logits_;
  SamplingStage sampling_;
  ModelRunnerOutput output_;  // reused
  std::shared_ptr<PipelineLink> pipeline_;  // rank 0 of a pipeline, else null
  std::shared_ptr<TensorParallelLink> tensor_parallel_;  // rank 0 of a tensor-parallel model, else null
  std::vector<float> warm_up_hidden_;  // a later stage's warm-up input (zeros)
  // A shared head's input (the last stage's final-norm rows) and this
  // stage's logits of it (head_logits).
  std::vector<float> head_input_, head_logits_;
};

}  // namespace inferd
