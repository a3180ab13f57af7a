#include "engine/model_runner.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <utility>

#include "engine/kv_capacity.h"
#include "kv/block_pool.h"

namespace inferd {

int64_t available_memory_bytes() {
  // MemAvailable counts reclaimable page cache, which MemFree does not.
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  int64_t kib = 0;
  while (in >> key >> kib) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return kib * 1024;
  }
  const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? int64_t{pages} * page : 0;
}

Result<int32_t> kv_blocks_for_budget(const ModelConfig& model, const ModelRunnerConfig& config) {
  if (config.block_size < 1) return make_error("the KV block size must be at least 1");
  return kv_blocks_for_budget(
      KVLayout::plan(model, config.block_size, config.kv_cache_dtype, config.kv_cache_skip_sliding_window), config);
}

Result<int32_t> kv_blocks_for_budget(const KVLayout& layout, const ModelRunnerConfig& config) {
  if (config.n_blocks_override > 0) {
    if (config.n_blocks_override < 2 || config.n_blocks_override > INT32_MAX)
      return make_error("a KV cache of " + std::to_string(config.n_blocks_override) +
                        " blocks was asked for; it takes at least 2 and at most " + std::to_string(INT32_MAX));
    return static_cast<int32_t>(config.n_blocks_override);
  }
  int64_t bytes = config.kv_cache_bytes;
  std::string source = std::to_string(bytes) + " bytes";
  if (bytes <= 0) {
    if (!(config.kv_cache_memory_fraction > 0.0 && config.kv_cache_memory_fraction <= 1.0))
      return make_error("set a KV cache size in bytes or a memory fraction in (0, 1]");
    const int64_t avail = available_memory_bytes();
    bytes = static_cast<int64_t>(static_cast<double>(avail) * config.kv_cache_memory_fraction);
    source = std::to_string(config.kv_cache_memory_fraction) + " of " + std::to_string(avail) +
             " available bytes";
  }
  // State slots (recurrent layers; the cache's spare one included) come first.
  const int64_t state_bytes = kv_state_slots_bytes(layout, config.n_state_slots);
  if (state_bytes >= bytes)
    return make_error("a KV cache of " + source + " does not hold the " + std::to_string(config.n_state_slots) +
                      " recurrent state slots of " + std::to_string(layout.state_slot_bytes()) + " bytes each");
  bytes -= state_bytes;
  const int64_t block_bytes = static_cast<int64_t>(layout.block_bytes());
  // A stage of recurrent layers only keeps no blocks: any count costs nothing.
  int64_t n = block_bytes > 0 ? bytes / block_bytes : INT32_MAX;
  if (config.max_blocks > 0) n = std::min(n, config.max_blocks);
  n = std::min<int64_t>(n, INT32_MAX);
  if (n < 2)
    return make_error("a KV cache of " + source + " holds " + std::to_string(n) +
                      " blocks; at least 2 blocks of " + std::to_string(block_bytes) +
                      " bytes are needed");
  return static_cast<int32_t>(n);
}

Result<std::unique_ptr<ModelRunner>> ModelRunner::create(Model& model, const ModelRunnerConfig& config) {
  if (!model.can_generate())
    return make_error(unsupported_architecture_message(model.config().architecture));
  if (config.block_size < 1) return make_error("the KV block size must be at least 1");
  KVLayout layout = KVLayout::plan(model.config(), config.block_size, config.kv_cache_dtype,
                                   config.kv_cache_skip_sliding_window);
  if (Status s = model.check_kv_cache(layout); !s) return s.error();
  // A pipeline stage's cache holds its own layers only.
  if (!model.first_stage() || !model.last_stage()) layout = layout.for_layers(model.layer_begin(), model.layer_end());
  auto n_blocks = kv_blocks_for_budget(layout, config);
  // Every stage agrees, even one whose budget failed (it offers 0 and all fail).
  if (config.agree_on_blocks) {
    const int32_t agreed = config.agree_on_blocks(n_blocks ? *n_blocks : 0);
    if (n_blocks && agreed < 2)
      return make_error("another rank's KV cache budget holds fewer than 2 blocks");
    if (n_blocks) n_blocks = agreed;
  }
  if (!n_blocks) return n_blocks.error();
  std::unique_ptr<ModelRunner> runner(new ModelRunner(model, std::move(layout), *n_blocks, config.kv_cache_shareable,
                                                      config.n_state_slots, config.pipeline,
                                                      config.tensor_parallel));
  if (config.warm_up) runner->warm_up();
  return runner;
}

void ModelRunner::warm_up() {
  const int32_t bos = model_.tokenizer().bos_id();
  for (const int64_t n_tokens : {int64_t{cache_.block_size()}, int64_t{1}}) {
    batch_.clear();
    const int32_t n_groups = cache_.layout().num_groups();
    SequenceSlice slice;
    slice.n_tokens = static_cast<int32_t>(n_tokens);
    slice.block_tables.assign(n_groups, {kv::BlockPool::kNullBlock});
    batch_.slots.resize(n_groups);
    for (int64_t pos = 0; pos < n_tokens; ++pos) {
      batch_.tokens.push_back(bos >= 0 && bos < model_.config().n_vocab ? bos : 0);
      batch_.positions.push_back(static_cast<int32_t>(pos));
      for (std::vector<int64_t>& group_slots : batch_.slots)
        group_slots.push_back(int64_t{kv::BlockPool::kNullBlock} * cache_.block_size() + pos);
    }
    batch_.logit_rows.push_back(static_cast<int32_t>(n_tokens - 1));
    batch_.sequences.push_back(std::move(slice));
    // A later stage starts from a residual stream: zeros do for a warm-up.
    const float* hidden_in = nullptr;
    if (!model_.first_stage()) {
      warm_up_hidden_.assign(static_cast<size_t>(n_tokens * model_.config().n_embd), 0.0f);
      hidden_in = warm_up_hidden_.data();
    }
    model_.forward_stage(batch_, cache_, hidden_in, logits_);
    // A shared head's rows run apart from the pass (Model::head_logits).
    if (model_.head_shared()) {
      warm_up_hidden_.assign(static_cast<size_t>(model_.config().n_embd), 0.0f);
      model_.head_logits(warm_up_hidden_.data(), 1, logits_);
    }
  }
  warm_up_hidden_ = {};
  batch_.clear();
  logits_.clear();
}

ModelRunner::ModelRunner(Model& model, KVLayout layout, int32_t n_blocks, bool shareable_cache, int32_t n_state_slots,
                         std::shared_ptr<PipelineLink> pipeline, std::shared_ptr<TensorParallelLink> tensor_parallel)
    : model_(model), cache_(std::move(layout), n_blocks, shareable_cache, n_state_slots),
      pipeline_(std::move(pipeline)), tensor_parallel_(std::move(tensor_parallel)) {}

void ModelRunner::build_batch(const SchedulerOutput& out, int64_t block_size, ForwardBatch& batch) {
  batch.clear();
  // One slice: the request's new tokens at positions [p0, p1).
  auto add_slice = [&](const ScheduledRequest& s, int64_t p0, int64_t p1, bool decode_each, bool prompt_piece) {
    SequenceSlice slice;
    slice.first_token = static_cast<int32_t>(batch.size());
    slice.n_tokens = static_cast<int32_t>(p1 - p0);
    slice.decode_each = decode_each;
    slice.prompt_piece = prompt_piece;
    slice.state_slot = s.state_slot;
    // Attention reads positions [0, p1 - 1]: only that much of the tables.
    const size_t n_groups = s.block_tables.size();
    if (batch.slots.size() < n_groups) batch.slots.resize(n_groups);
    slice.block_tables.resize(n_groups);
    for (size_t g = 0; g < n_groups; ++g) {
      const std::vector<int32_t>& table = s.block_tables[g];
      slice.block_tables[g].assign(table.begin(), table.begin() + (p1 - 1) / block_size + 1);
      for (int64_t pos = p0; pos < p1; ++pos) batch.slots[g].push_back(kv_slot(table, block_size, pos));
    }
    for (int64_t pos = p0; pos < p1; ++pos) {
      batch.tokens.push_back(s.token_ids[pos - s.num_computed_tokens]);
      batch.positions.push_back(static_cast<int32_t>(pos));
    }
    batch.sequences.push_back(std::move(slice));
  };
  for (const ScheduledRequest& s : out.scheduled) {
    const int64_t begin = s.num_computed_tokens, end = begin + s.num_new_tokens;
    const size_t first_slice = batch.sequences.size();
    // Recurrent layers: a slice ends at each position where the state is
    // saved (the executor saves it after a slice), which changes no result:
    // a sequence's slices run in order and its tokens' arithmetic does not
    // depend on where they are cut.
    auto add_slices = [&](int64_t p0, int64_t p1, bool decode_each, bool prompt_piece) {
      for (const kv::StateSave& save : s.state_saves) {
        if (save.position <= p0 || save.position > p1) continue;
        add_slice(s, p0, save.position, decode_each && save.position - p0 > 1, prompt_piece);
        batch.sequences.back().save_state_to = save.slot;
        p0 = save.position;
      }
      if (p1 > p0) add_slice(s, p0, p1, decode_each && p1 - p0 > 1, prompt_piece);
    };
    // Output tokens recomputed after a preemption were first computed each as
    // a decode (or a verified draft): recomputed the same way, their keys and
    // values are the same bits, and so is everything sampled after them.
    const int64_t outputs_from = s.num_draft_tokens > 0 ? begin : std::clamp(s.num_prompt_tokens, begin, end);
    // A prompt's tokens are computed as one prompt pass computes them, in
    // whatever pieces the steps cut it (SequenceSlice::prompt_piece).
    const bool prompt_pieces = s.num_prompt_tokens > 1 && s.num_prompt_tokens != ScheduledRequest::kUnmarked;
    if (outputs_from > begin) add_slices(begin, outputs_from, false, prompt_pieces);
    if (end > outputs_from) add_slices(outputs_from, end, end - outputs_from > 1, false);
    if (s.state_source >= 0) batch.sequences[first_slice].load_state_from = s.state_source;
    const int64_t first = batch.size() - s.num_new_tokens;  // its token at position `begin`
    for (int64_t r = 0; r < prompt_logit_rows(s); ++r) batch.logit_rows.push_back(static_cast<int32_t>(first + r));
    if (s.sample)
      for (int64_t row = batch.size() - 1 - s.num_draft_tokens; row < batch.size(); ++row)
        batch.logit_rows.push_back(static_cast<int32_t>(row));
  }
}

ModelRunnerOutput& ModelRunner::execute(const SchedulerOutput& out, const StepSamplingInputs& inputs) {
  if (pipeline_) {  // rank 0: the first stage here, the samples from the last
    run_first_stage(out);
    hand_on(out, inputs);
    return receive_samples();
  }
  std::vector<float>& logits = compute_logits(out);
  sampling_.sample(out, inputs, logits.data(), n_vocab(), output_);
  return output_;
}

std::vector<float>& ModelRunner::forward_stage(const SchedulerOutput& out, const float* hidden_in) {
  // Rank 0 of a tensor-parallel first stage: its peers run the same step.
  if (tensor_parallel_) tensor_parallel_->send_step(out);
  for (const kv::BlockCopy& c : out.block_copies) cache_.copy_block(c.src, c.dst);
  build_batch(out, cache_.block_size(), batch_);
  if (batch_.size() == 0) {
    logits_.clear();
    return logits_;
  }
  model_.forward_stage(batch_, cache_, hidden_in, logits_);
  return logits_;
}

ModelRunnerOutput& ModelRunner::receive_samples() {
  if (model_.head_shared()) {  // this stage's half of the head, for the last stage to sample
    pipeline_->receive_head_input(head_input_);
    pipeline_->send_head_part(head_logits(head_input_));
  }
  pipeline_->receive_output(output_);
  return output_;
}

std::vector<float>& ModelRunner::head_logits(const std::vector<float>& normed) {
  const auto n_rows = static_cast<int64_t>(normed.size()) / model_.config().n_embd;
  model_.head_logits(normed.data(), n_rows, head_logits_);
  return head_logits_;
}

ModelRunnerOutput& ModelRunner::sample(const SchedulerOutput& out, const StepSamplingInputs& inputs,
                                       std::vector<float>& logits) {
  sampling_.sample(out, inputs, logits.data(), n_vocab(), output_);
  return output_;
}

std::vector<float>& ModelRunner::compute_logits(const SchedulerOutput& out) {
  // The other ranks run the same step (copies, batch, pass) beside this one.
  if (tensor_parallel_) tensor_parallel_->send_step(out);
  // Copies on write first: the step may write the copies' destinations.
  for (const kv::BlockCopy& c : out.block_copies) cache_.copy_block(c.src, c.dst);
  build_batch(out, cache_.block_size(), batch_);
  if (batch_.size() == 0) {
    logits_.clear();
    return logits_;
  }
  model_.forward(batch_, cache_, logits_);
  return logits_;
}

}  // namespace inferd
