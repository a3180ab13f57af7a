// A loaded model: what is backend-neutral (its file, hyper-parameters, weights
// as views of the file, tokenizer, chat template), and the executor that runs
// its forward pass. Loading never depends on the executor: a backend is one
// more Executor and one more case in make_executor.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "core/thread_pool.h"
#include "gguf/gguf.h"
#include "kernels/cpu/flavour.h"
#include "kernels/cpu/numerics.h"
#include "model/config.h"
#include "model/layer_program.h"
#include "model/tensor_parallel_comm.h"
#include "model/tensor_shard.h"
#include "model/forward_batch.h"
#include "model/kv_cache.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"

namespace inferd {

enum class Backend { kCpu };

// One stage of a pipeline-parallel model: stage `index` of `count` runs a
// contiguous share of the layers (pipeline_layers). The first stage also
// looks up the token embeddings, the last one runs the final norm and head.
struct PipelineStage {
  int index = 0;
  int count = 1;
  // The layers of each stage, in order, when the user gave them
  // (--pipeline-layer-partition, vLLM's VLLM_PP_LAYER_PARTITION); empty:
  // pipeline_layers balances them. Checked against the model as it loads.
  std::vector<int64_t> layer_counts;
  // The first and the last stage each compute half the LM head's vocabulary
  // rows (pipeline_head_rows), the last stage's final-norm rows crossing back
  // to the first: a large-vocabulary head then weighs on both ends, so the
  // layers split evenly, as a prompt's pass (which runs the head on its last
  // token only) needs. Without it the last stage computes the whole head.
  bool share_head = false;
};
struct LayerRange {
  int64_t begin = 0, end = 0;
};
// Stage `stage`'s layers, contiguous, balanced by the bytes each stage
// streams per step: layer_bytes[l] is layer l's weights, and the last stage
// also reads the head's head_bytes. The largest stage is as small as it can
// be (a step takes as long as its slowest stage, and a rank holds what it
// reads); under that bound the later stages take as many layers as fit, so
// the first stage, which also runs the scheduler and front end, is the
// lightest. Every stage gets one layer at least. Needs 1 <= count <=
// layer_bytes.size().
// With share_head, half the head's bytes count on the first stage and half
// on the last.
LayerRange pipeline_layers(const std::vector<uint64_t>& layer_bytes, uint64_t head_bytes, const PipelineStage& stage);
// The LM head's rows (of n_rows) that stage `stage` computes: all of them on
// the last stage, none before it; with share_head the first stage's are the
// first half, in whole groups of kShardRowGroup rows (so each half takes the
// kernels the whole matrix takes for those rows, bit for bit), the last
// stage's the rest.
ShardRange pipeline_head_rows(int64_t n_rows, const PipelineStage& stage);
// Stage `stage`'s layers by its layer_counts, or the error naming the rule
// they break (one count a stage, each at least 1, adding up to n_layer).
Result<LayerRange> partitioned_layers(const PipelineStage& stage, int64_t n_layer);
// Layer l's weight bytes in `file` (its "blk.l." tensors), and the head's
// (output.weight, or a tied model's token_embd.weight).
std::vector<uint64_t> layer_weight_bytes(const gguf::File& file, int64_t n_layer);
uint64_t head_weight_bytes(const gguf::File& file);

struct LoadOptions {
  // Called with the fraction of weight data paged in so far (for a progress bar).
  std::function<void(double)> progress;
  bool prefault = true;
  // Which llama.cpp CPU build's rounding the forward pass reproduces
  // (kernels/cpu/flavour.h): by default the one llama.cpp builds on this CPU.
  kernels::GgmlFlavour ggml_flavour = kernels::native_ggml_flavour();
  // Exact (llama.cpp's bits) or fast (integer accumulation) kernels for the
  // projections (kernels/cpu/numerics.h); chosen once, at load.
  kernels::Numerics numerics = kernels::Numerics::kExact;
  Backend backend = Backend::kCpu;
  // The CPU executor's threads: a pool of its own with n_threads (0: one per
  // hardware thread), or `thread_pool` when given, so that two models run one
  // after the other (a draft model and its target) share the cores instead of
  // two pools spinning against each other.
  int n_threads = 0;
  std::shared_ptr<ThreadPool> thread_pool;
  // > 0: the forward pass returns logits for the first this many token ids
  // only (a draft model's head: draft_model_proposer.h). The output matrix's
  // other rows are never read, which makes a large-vocabulary draft's step
  // cheaper; the embedding still looks up every id.
  int64_t max_output_rows = 0;
  // Read the file's metadata, tensors and tokenizer only (inferd info): no
  // weights are checked or paged in and no executor is made, so forward() must
  // not be called. A tokenizer inferd cannot read does not fail the load then:
  // tokenizer_error() says why and tokenizer() must not be called.
  bool describe_only = false;
  // Load as this pipeline stage: only its layers' weights (and the
  // embeddings on the first stage, the final norm and head on the last) are
  // paged in and repacked, and only they are run. Generating models only;
  // more stages than layers are refused.
  PipelineStage pipeline_stage;
  // Load as this rank of a tensor-parallel model (model/tensor_shard.h): its
  // heads, FFN columns and vocabulary rows only are paged in, repacked and
  // run; the forward pass adds the ranks' partial sums up through
  // tensor_comm (required when tensor_shard.count > 1). With a pipeline
  // stage too: that stage's layers' shard (and the head's on the last).
  TensorShard tensor_shard;
  std::shared_ptr<TensorParallelComm> tensor_comm;
};

class Model;

// Runs forward passes of one model: owns whatever the backend keeps beside the
// model's weights (weights copied into its own layouts, scratch, prefetch
// plans, the host threads it runs on). The KV cache memory is passed in.
class Executor {
 public:
  virtual ~Executor() = default;
  virtual void forward(const ForwardBatch& batch, KVCache& cache, std::vector<float>& logits) = 0;
  // A pipeline stage's pass over the model's layers (Model::layer_begin):
  // it starts from `hidden_in` (batch.size() x n_embd, the residual stream
  // after the layer before the range) unless the range starts at layer 0,
  // and returns in `out` the residual stream after its last layer unless the
  // range ends at the last layer (then the logits, as forward()). Every stage
  // adds the same numbers in the same order as the whole pass.
  // Only decoder executors run stages (Model::load refuses a range otherwise);
  // over every layer it is forward().
  // A last stage whose head is shared (PipelineStage::share_head) returns
  // the final norm's rows of batch.logit_rows instead of logits (n_embd
  // each), for head_logits() here and on the first stage.
  virtual void forward_stage(const ForwardBatch& batch, KVCache& cache, const float* hidden_in,
                             std::vector<float>& out) {
    (void)hidden_in;
    forward(batch, cache, out);
  }
  // The logits of this stage's head rows (Model::head_rows) for `n_rows`
  // final-norm rows (n_embd each): n_rows x head_rows().size(), row-major.
  // Only a stage that shares the head runs it.
  virtual void head_logits(const float* normed, int64_t n_rows, std::vector<float>& logits) {
    (void)normed, (void)n_rows, (void)logits;
  }
  // The host threads it runs on, for a second model to share (null: none).
  virtual std::shared_ptr<ThreadPool> thread_pool() const { return nullptr; }
  // Whether its kernels can write and read a KV cache group of this spec
  // (the dtype above all); an error names what they cannot.
  virtual Status supports_kv_cache(const kv::KVCacheSpec& spec) const = 0;
};

// The executor of options.backend for a loaded model (which must outlive it).
std::unique_ptr<Executor> make_executor(const Model& model, const LoadOptions& options);

class Model {
 public:
  // Opens, validates and maps a GGUF model. Fails with a message naming the
  // problem for a missing/corrupt file or an unsupported architecture.
  static Result<std::unique_ptr<Model>> load(const std::string& path, const LoadOptions& options);

  const ModelConfig& config() const { return config_; }
  // Each layer's phases (model/layer_program.h); empty when it cannot generate.
  const std::vector<LayerProgram>& layer_programs() const { return programs_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  // Why the tokenizer could not be read (describe_only loads only), else empty.
  const std::string& tokenizer_error() const { return tokenizer_error_; }
  const gguf::File& file() const { return *file_; }
  const ModelWeights& weights() const { return weights_; }
  bool can_generate() const { return config_.can_generate(); }
  kernels::GgmlFlavour ggml_flavour() const { return flavour_; }
  kernels::Numerics numerics() const { return numerics_; }
  // The model's chat template: the file's (tokenizer.chat_template), else its
  // architecture's default, else empty.
  std::string chat_template() const;

  // Logits per row: n_vocab, or LoadOptions::max_output_rows where smaller;
  // a pooled output instead (ModelConfig::returns_pooled): n_embd, or a
  // reranker's scores.
  int64_t n_logits() const {
    if (config_.returns_pooled())
      return config_.pooling == PoolingType::kRank ? weights_.cls_out.rows : config_.n_embd;
    return weights_.output ? n_output_rows_ : config_.n_vocab;
  }

  // Runs the batch through the network on the model's executor (see
  // Executor), writing each token's keys and values into `cache` at its slot,
  // and returns logits for batch.logit_rows (logit_rows.size() x n_logits(),
  // row-major) in `logits`. Not thread-safe: one forward pass at a time per Model.
  void forward(const ForwardBatch& batch, KVCache& cache, std::vector<float>& logits);
  // One pipeline stage's part of it (Executor::forward_stage).
  void forward_stage(const ForwardBatch& batch, KVCache& cache, const float* hidden_in, std::vector<float>& out) {
    executor_->forward_stage(batch, cache, hidden_in, out);
  }
  // The layers this process runs ([0, n_layer) unless loaded as a pipeline
  // stage: LoadOptions::pipeline_stage).
  int64_t layer_begin() const { return layers_.begin; }
  int64_t layer_end() const { return layers_.end; }
  bool first_stage() const { return layers_.begin == 0; }
  bool last_stage() const { return layers_.end == config_.n_layer; }
  // The LM head's vocabulary rows this process computes (pipeline_head_rows;
  // a tensor-parallel rank's share counts as the whole here), and whether
  // they are a pipeline's shared half (then head_logits computes them; a
  // middle stage holds none and shares nothing).
  ShardRange head_rows() const { return head_rows_; }
  bool head_shared() const { return head_shared_; }
  // Executor::head_logits.
  void head_logits(const float* normed, int64_t n_rows, std::vector<float>& logits) {
    executor_->head_logits(normed, n_rows, logits);
  }
  // Whether this stage reads the tensor of that name (what it pages in).
  bool stage_reads(std::string_view tensor) const;
  // A tensor-parallel rank's partial sums' exchange (null: a whole model).
  // Its config() then has this rank's heads and FFN width, its weights() its
  // shard (model/tensor_shard.h).
  const std::shared_ptr<TensorParallelComm>& tensor_comm() const { return tensor_comm_; }
  // What this rank holds, in the whole model's numbering, and the bytes of
  // its projections and head (a tensor-parallel rank only).
  const TensorShardPlan& tensor_shard_plan() const { return tensor_shard_plan_; }
  int64_t tensor_shard_bytes() const { return tensor_shard_bytes_; }
  // Whether a cache of this layout can be made for this model: every group's
  // spec is valid and one its executor runs (a KV dtype its attention kernels
  // do not read is refused here, before any cache is allocated).
  Status check_kv_cache(const KVLayout& layout) const;
  // The threads its forward passes run on (LoadOptions::thread_pool for a
  // draft model), or null for a model that cannot generate.
  std::shared_ptr<ThreadPool> thread_pool() const { return executor_ ? executor_->thread_pool() : nullptr; }

 private:
  Model() = default;

  std::unique_ptr<gguf::File> file_;
  ModelConfig config_;
  std::vector<LayerProgram> programs_;
  kernels::GgmlFlavour flavour_ = kernels::GgmlFlavour::kAvx512;
  kernels::Numerics numerics_ = kernels::Numerics::kExact;
  ModelWeights weights_;
  LayerRange layers_;  // pipeline_layers of LoadOptions::pipeline_stage
  int64_t n_output_rows_ = 0;  // the LM head's rows, all of them (a tensor-parallel rank holds a share)
  ShardRange head_rows_;       // of n_output_rows_: this stage's (pipeline_head_rows)
  bool head_shared_ = false;
  std::shared_ptr<TensorParallelComm> tensor_comm_;
  TensorShardPlan tensor_shard_plan_;
  int64_t tensor_shard_bytes_ = 0;
  // The bytes of the mapping a tensor-parallel rank reads (what it pages in).
  std::vector<std::pair<const void*, uint64_t>> shard_ranges() const;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::string tokenizer_error_;
  std::unique_ptr<Executor> executor_;  // null when the model cannot generate
};

}  // namespace inferd
