#include "model/model.h"

#include <algorithm>
#include <optional>

#include "model/cpu_encoder_executor.h"
#include "model/cpu_executor.h"

namespace inferd {

Result<std::unique_ptr<Model>> Model::load(const std::string& path, const LoadOptions& options) {
  auto file = gguf::File::open(path);
  if (!file) return file.error();
  std::unique_ptr<Model> m(new Model());
  m->file_ = std::move(*file);
  m->flavour_ = options.ggml_flavour;
  m->numerics_ = options.numerics;
  auto config = ModelConfig::from_gguf(*m->file_);
  if (!config) return make_error(path + ": " + config.error().message);
  m->config_ = *config;
  const PipelineStage stage = options.pipeline_stage;
  const bool whole = stage.count == 1;
  if (!whole) {
    if (!m->config_.can_generate() || m->config_.returns_pooled())
      return make_error(path + ": only a generating decoder model can be split into pipeline stages");
    if (stage.count < 1 || stage.count > m->config_.n_layer)
      return make_error(path + ": a pipeline of " + std::to_string(stage.count) + " stages needs at least " +
                        std::to_string(stage.count) + " layers (each stage runs one or more), and this model has " +
                        std::to_string(m->config_.n_layer) + "; use --pipeline-parallel-size <= " +
                        std::to_string(m->config_.n_layer));
  }
  if (whole) {
    m->layers_ = LayerRange{0, m->config_.n_layer};
  } else if (!stage.layer_counts.empty()) {
    auto layers = partitioned_layers(stage, m->config_.n_layer);
    if (!layers) return make_error(path + ": " + layers.error().message);
    m->layers_ = *layers;
  } else {
    m->layers_ = pipeline_layers(layer_weight_bytes(*m->file_, m->config_.n_layer), head_weight_bytes(*m->file_), stage);
  }
  auto tok = Tokenizer::from_gguf(*m->file_);
  if (!tok) {
    if (!options.describe_only) return make_error(path + ": " + tok.error().message);
    m->tokenizer_error_ = tok.error().message;
    return m;
  }
  m->tokenizer_ = std::move(*tok);
  if (options.describe_only) return m;
  if (m->can_generate()) {
    m->programs_ = build_layer_programs(m->config_);
    auto w = ModelWeights::from_gguf(*m->file_, m->config_, m->programs_);
    if (!w) return make_error(path + ": " + w.error().message);
    m->weights_ = std::move(*w);
    // The first rows of a row-major matrix are a view of their own.
    if (options.max_output_rows > 0 && options.max_output_rows < m->weights_.output.rows)
      m->weights_.output.rows = options.max_output_rows;
    m->n_output_rows_ = m->weights_.output.rows;
    // A pipeline's first and last stages share the head only as stages of
    // whole layers: a tensor-parallel last stage splits it among its ranks.
    m->head_shared_ = !whole && stage.share_head && options.tensor_shard.count == 1;
    PipelineStage head_stage = stage;
    head_stage.share_head = m->head_shared_;
    m->head_rows_ = whole ? ShardRange{0, m->n_output_rows_} : pipeline_head_rows(m->n_output_rows_, head_stage);
    m->head_shared_ = m->head_shared_ && m->head_rows_.size() > 0;  // a middle stage holds none
    if (m->head_shared_) m->weights_.output = shard_rows(m->weights_.output, m->head_rows_);
  }
  const TensorShard shard = options.tensor_shard;
  const bool sharded = shard.count > 1;
  if (sharded) {
    if (!options.tensor_comm) return make_error(path + ": a tensor-parallel rank needs its ranks' communicator");
    auto plan = plan_tensor_shard(m->config_, m->weights_, shard);
    if (!plan) return make_error(path + ": " + plan.error().message);
    m->tensor_shard_bytes_ = apply_tensor_shard(m->config_, m->weights_, *plan, {m->layers_.begin, m->layers_.end});
    m->tensor_shard_plan_ = *plan;
    m->tensor_comm_ = options.tensor_comm;
  }
  if (options.prefault) {
    const gguf::ProgressFn progress = options.progress ? options.progress : [](double) {};
    // What the passes read, as a stage reads it: an untied embedding table is
    // left to the lookups (a few rows a step) in one process too, so that it
    // does not sit in memory whole for nothing.
    if (sharded) m->file_->prefault(progress, m->shard_ranges());
    else m->file_->prefault(progress, [&m](const gguf::TensorInfo& t) { return m->stage_reads(t.name); });
  }
  // The executor is made last: it may copy the weights into its own layouts.
  if (m->can_generate()) m->executor_ = make_executor(*m, options);
  return m;
}

namespace {

// The layer of a "blk.N." tensor, or -1 for the model's other tensors.
int64_t block_of(std::string_view tensor) {
  if (!tensor.starts_with("blk.")) return -1;
  int64_t layer = 0;
  for (size_t i = 4; i < tensor.size() && tensor[i] >= '0' && tensor[i] <= '9'; ++i) layer = layer * 10 + (tensor[i] - '0');
  return layer;
}

// Stage boundaries from the back under `limit` bytes a stage: each stage, the
// last first, takes layers while its bytes stay within the limit and one
// layer is left for each stage before it; the first stage takes the rest.
// Returns the stages' first layers (begin[0] == 0), or nothing when the first
// stage's rest exceeds the limit.
// `first_head` and `last_head`: the head's bytes on the first and last stage.
std::optional<std::vector<int64_t>> stage_begins(const std::vector<uint64_t>& layer_bytes, uint64_t first_head,
                                                 uint64_t last_head, int count, uint64_t limit) {
  const auto n = static_cast<int64_t>(layer_bytes.size());
  std::vector<int64_t> begin(count, 0);
  int64_t end = n;
  for (int s = count - 1; s > 0; --s) {
    uint64_t bytes = s == count - 1 ? last_head : 0;
    int64_t b = end;
    while (b - 1 >= s && bytes + layer_bytes[b - 1] <= limit) bytes += layer_bytes[--b];
    if (b == end) return std::nullopt;  // not even one layer fits
    begin[s] = b;
    end = b;
  }
  uint64_t first = first_head + (count == 1 ? last_head : 0);
  for (int64_t l = 0; l < end; ++l) first += layer_bytes[l];
  if (first > limit) return std::nullopt;
  return begin;
}

}  // namespace

LayerRange pipeline_layers(const std::vector<uint64_t>& layer_bytes, uint64_t head_bytes, const PipelineStage& stage) {
  // The least limit under which the stages fit, by bisection: feasibility
  // only grows with the limit, and the whole model always fits.
  const bool shared = stage.share_head && stage.count > 1;
  const uint64_t first_head = shared ? head_bytes / 2 : 0, last_head = head_bytes - first_head;
  uint64_t lo = 0, hi = head_bytes;
  for (uint64_t b : layer_bytes) hi += b;
  while (lo < hi) {
    const uint64_t mid = lo + (hi - lo) / 2;
    if (stage_begins(layer_bytes, first_head, last_head, stage.count, mid)) hi = mid;
    else lo = mid + 1;
  }
  const std::vector<int64_t> begin = *stage_begins(layer_bytes, first_head, last_head, stage.count, hi);
  const int64_t end = stage.index + 1 < stage.count ? begin[stage.index + 1] : static_cast<int64_t>(layer_bytes.size());
  return {begin[stage.index], end};
}

ShardRange pipeline_head_rows(int64_t n_rows, const PipelineStage& stage) {
  const bool first = stage.index == 0, last = stage.index == stage.count - 1;
  if (stage.count == 1) return {0, n_rows};
  if (!stage.share_head) return last ? ShardRange{0, n_rows} : ShardRange{};
  const ShardSplit halves = split_rows(n_rows, kShardRowGroup, 2);
  if (first) return halves.of(0);
  return last ? halves.of(1) : ShardRange{};
}

Result<LayerRange> partitioned_layers(const PipelineStage& stage, int64_t n_layer) {
  const std::vector<int64_t>& counts = stage.layer_counts;
  std::string given;
  int64_t sum = 0;
  for (const int64_t c : counts) {
    given += (given.empty() ? "" : ",") + std::to_string(c);
    sum += c;
  }
  const auto refuse = [&](const std::string& rule) -> Result<LayerRange> {
    return make_error("--pipeline-layer-partition " + given + ": " + rule);
  };
  if (counts.size() != static_cast<size_t>(stage.count))
    return refuse("give one layer count for each of the " + std::to_string(stage.count) + " pipeline stages");
  for (const int64_t c : counts)
    if (c < 1) return refuse("every stage needs one layer at least");
  if (sum != n_layer)
    return refuse("the counts add up to " + std::to_string(sum) + ", and this model has " + std::to_string(n_layer) +
                  " layers");
  int64_t begin = 0;
  for (int s = 0; s < stage.index; ++s) begin += counts[static_cast<size_t>(s)];
  return LayerRange{begin, begin + counts[static_cast<size_t>(stage.index)]};
}

std::vector<uint64_t> layer_weight_bytes(const gguf::File& file, int64_t n_layer) {
  std::vector<uint64_t> bytes(static_cast<size_t>(n_layer), 0);
  for (const gguf::TensorInfo& t : file.tensors()) {
    const int64_t layer = block_of(t.name);
    if (layer >= 0 && layer < n_layer) bytes[static_cast<size_t>(layer)] += t.n_bytes;  // past n_layer: MTP blocks, never run
  }
  return bytes;
}

uint64_t head_weight_bytes(const gguf::File& file) {
  const gguf::TensorInfo* head = file.find_tensor("output.weight");
  if (!head) head = file.find_tensor("token_embd.weight");
  return head ? head->n_bytes : 0;
}

std::vector<std::pair<const void*, uint64_t>> Model::shard_ranges() const {
  // The embedding table is left to the lookups (a few rows a step), as a
  // pipeline stage after the first leaves it; a tied head's rows are the
  // output's view below.
  std::vector<std::pair<const void*, uint64_t>> ranges;
  auto add = [&ranges](const WeightView& w) {
    if (w) ranges.emplace_back(w.data, row_bytes(w.dtype, w.cols) * static_cast<uint64_t>(w.rows));
  };
  // A pipeline stage's shard: its layers only, and the head on the last.
  for (int64_t l = layers_.begin; l < layers_.end; ++l) {
    const LayerWeights& L = weights_.layers[l];
    for (const WeightView& p : L.proj) add(p);
    for (const WeightView* w : {&L.attn_norm, &L.ffn_norm, &L.bq, &L.bk, &L.bv, &L.bo, &L.q_norm, &L.k_norm,
                                &L.post_attn_norm, &L.post_ffn_norm})
      add(*w);
    if (const MoeWeights& m = L.moe; m) {  // this rank's experts (expert parallelism)
      for (const ExpertsView* e : {&m.gate, &m.up, &m.down})
        ranges.emplace_back(e->data, row_bytes(e->dtype, e->cols) * static_cast<uint64_t>(e->rows * e->n_expert));
      for (const WeightView* w : {&m.router, &m.router_bias, &m.gate_bias, &m.up_bias, &m.down_bias,
                                  &m.selection_bias, &m.gate_shexp, &m.up_shexp, &m.down_shexp, &m.gate_inp_shexp})
        add(*w);
    }
  }
  if (last_stage()) {
    add(weights_.output_norm);
    add(weights_.output);
  }
  add(weights_.rope_freqs);
  return ranges;
}

bool Model::stage_reads(std::string_view tensor) const {
  if (const int64_t layer = block_of(tensor); layer >= 0) return layer >= layers_.begin && layer < layers_.end;
  // A tied head reads the embedding table, the last stage's output. The
  // first stage's lookups read a few of its rows a step: the rest of the
  // table is left unread, as a tensor-parallel rank leaves it (shard_ranges).
  // A shared head's rows are read as they are repacked, not prefaulted whole.
  const bool whole_head = last_stage() && !head_shared_;
  if (tensor == "token_embd.weight") return whole_head && !file_->find_tensor("output.weight");
  if (tensor == "output.weight") return whole_head;
  if (tensor.starts_with("output")) return last_stage();  // output_norm
  return true;  // what every layer reads (RoPE factors)
}

std::string Model::chat_template() const {
  if (file_->find("tokenizer.chat_template"))
    if (auto t = file_->get_string("tokenizer.chat_template")) return *t;
  return config_.traits ? std::string(config_.traits->default_chat_template) : std::string();
}

void Model::forward(const ForwardBatch& batch, KVCache& cache, std::vector<float>& logits) {
  executor_->forward(batch, cache, logits);
}

Status Model::check_kv_cache(const KVLayout& layout) const {
  if (!executor_) return make_error("this model has no executor (it cannot generate)");
  for (const kv::KVCacheSpec& spec : layout.group_specs) {
    if (Status s = spec.validate(); !s) return s;
    if (Status s = executor_->supports_kv_cache(spec); !s) return s;
  }
  return {};
}

std::unique_ptr<Executor> make_executor(const Model& model, const LoadOptions& options) {
  switch (options.backend) {
    case Backend::kCpu: {
      auto pool = options.thread_pool ? options.thread_pool
                                      : std::make_shared<ThreadPool>(options.n_threads > 0
                                                                         ? options.n_threads
                                                                         : ThreadPool::hardware_threads());
      if (model.config().is_encoder()) return std::make_unique<CpuEncoderExecutor>(model, std::move(pool));
      return std::make_unique<CpuExecutor>(model, std::move(pool));
    }
  }
  return nullptr;
}

}  // namespace inferd
