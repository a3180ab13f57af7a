#include "engine/engine.h"

#include <algorithm>
#include <cassert>
#include <chrono>
#include <cmath>
#include <random>

#include <spdlog/spdlog.h>

#include "core/dtype.h"
#include "engine/kv_capacity.h"
#include "model/token_cost.h"

namespace inferd {

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string str(int64_t v) { return std::to_string(v); }

}  // namespace

namespace {
// The recurrent-state part of the KV cache's config (all zero for models
// without recurrent layers).
kv::KVCacheConfig state_cache_config(const Model& model, const EngineConfig& config) {
  const bool recurrent = model.config().has_recurrent_layers();
  return {.n_state_slots = recurrent ? config.max_num_seqs : 0,
          .n_state_snapshots = recurrent && config.enable_prefix_caching ? config.state_snapshots : 0,
          .state_snapshot_interval = config.state_snapshot_interval,
          .state_checkpoints = recurrent ? config.speculative.state_checkpoints() : 0};
}
}  // namespace

ModelRunnerConfig Engine::runner_config(const Model& model, const EngineConfig& config) {
  const int64_t max_model_len = config.max_model_len > 0 ? config.max_model_len : model.config().context_length;
  ModelRunnerConfig rc;
  rc.block_size = config.block_size;
  rc.kv_cache_bytes = config.kv_cache_bytes;
  rc.kv_cache_memory_fraction = config.kv_cache_memory_fraction;
  rc.n_blocks_override = config.num_gpu_blocks_override;
  rc.kv_cache_dtype = config.kv_cache_dtype;
  rc.kv_cache_skip_sliding_window = config.kv_cache_skip_sliding_window;
  rc.warm_up = config.warm_up;
  // Every state slot the cache keeps: running requests', checkpoints, snapshots.
  rc.n_state_slots = state_slots_in_cache(state_cache_config(model, config));
  // A kv_producer's KV cache goes on shared memory, which consumers on this
  // host map (core/shared_bytes.h). Not a kv_both instance's: it decodes too,
  // and shared memory has no transparent huge pages on most systems.
  rc.kv_cache_shareable = config.kv_transfer && config.kv_transfer->produce && !config.kv_transfer->consume;
  // More blocks than every running request at full length needs would only
  // ever hold cached prefixes; a budget given as a fraction of memory stops there.
  const KVLayout kv_layout = KVLayout::plan(model.config(), config.block_size, config.kv_cache_dtype,
                                            config.kv_cache_skip_sliding_window);
  if (max_model_len > 0 && config.kv_cache_bytes <= 0)
    rc.max_blocks = int64_t{config.max_num_seqs} * kv_layout.blocks_for_request(max_model_len, config.block_size) + 1;
  return rc;
}

Result<std::unique_ptr<Engine>> Engine::create(Model& model, const EngineConfig& config) {
  if (!model.can_generate())
    return make_error(unsupported_architecture_message(model.config().architecture));
  if (config.max_num_seqs < 1) return make_error("max_num_seqs must be at least 1");
  if (config.block_size < 1) return make_error("the KV block size must be at least 1");
  if (config.max_logprobs < 0) return make_error("max_logprobs must be >= 0");
  if (Status s = config.speculative.validate(); !s) return make_error("speculative config: " + s.error().message);
  const int64_t max_model_len =
      config.max_model_len > 0 ? config.max_model_len : model.config().context_length;
  // A model with recurrent layers keeps one state per running request, which
  // is not kept in blocks: prefix caching keeps snapshots of it, speculation
  // a checkpoint before the drafts; neither offload nor transfer can send it.
  const bool recurrent = model.config().has_recurrent_layers();
  if (recurrent) {
    const std::string arch = model.config().architecture;
    if (config.speculative.enabled() && config.speculative.method == SpeculativeConfig::Method::kDraftModel)
      return make_error("draft-model speculative decoding is not supported for '" + arch +
                        "' yet (n-gram speculation is): its recurrent layers' checkpoints are tested with n-gram drafts only");
    if (config.state_snapshots < 0) return make_error("state_snapshots must be >= 0");
    if (config.state_snapshot_interval < 0 || config.state_snapshot_interval % config.block_size != 0)
      return make_error("state_snapshot_interval must be a multiple of the block size");
    if (config.offload.enabled())
      return make_error("KV offload tiers are not supported for '" + arch +
                        "': its recurrent layers' state is not kept in KV blocks");
    if (config.kv_transfer)
      return make_error("the KV transfer is not supported for '" + arch +
                        "': its recurrent layers' state is not kept in KV blocks");
    if (config.enable_prefix_caching && config.state_snapshots == 0)
      spdlog::info("prefix caching is off for '{}': no state snapshots to resume a cached prefix from", arch);
  }
  const kv::KVCacheConfig state_config = state_cache_config(model, config);

  if (config.pipeline && (config.offload.enabled() || config.kv_transfer))
    return make_error("KV offload tiers and the KV transfer do not run with pipeline parallelism yet (issue 40): "
                      "each rank's KV cache holds its own layers only");
  if (config.tensor_parallel && (config.offload.enabled() || config.kv_transfer))
    return make_error("KV offload tiers and the KV transfer do not run with tensor parallelism yet (issue 40): "
                      "each rank's KV cache holds its own KV heads only");
  if (Status s = check_kv_cache_dtype(model, config.kv_cache_dtype, config.block_size,
                                      config.kv_cache_skip_sliding_window);
      !s)
    return s.error();
  const KVLayout kv_layout = KVLayout::plan(model.config(), config.block_size, config.kv_cache_dtype,
                                            config.kv_cache_skip_sliding_window);
  ModelRunnerConfig rc = runner_config(model, config);
  rc.pipeline = config.pipeline;
  if (config.pipeline) rc.agree_on_blocks = [link = config.pipeline](int32_t n) { return link->agree_on_blocks(n); };
  rc.tensor_parallel = config.tensor_parallel;
  if (config.tensor_parallel)
    rc.agree_on_blocks = [link = config.tensor_parallel](int32_t n) { return link->agree_on_blocks(n); };
  auto runner = ModelRunner::create(model, rc);
  if (!runner) return runner.error();

  SchedulerConfig sc;
  sc.max_num_batched_tokens = config.max_num_batched_tokens;
  sc.max_num_seqs = config.max_num_seqs;
  sc.long_prefill_token_threshold = config.long_prefill_token_threshold;
  sc.context_positions_per_token = token_cost(model).context_positions_per_token(config.chunk_attention_cost);
  sc.max_model_len = max_model_len;
  sc.kv = {.n_blocks = (*runner)->n_blocks(),
           .block_size = config.block_size,
           .enable_prefix_caching = config.enable_prefix_caching,
           .group_windows = kv_layout.group_windows,
           .n_state_slots = state_config.n_state_slots,
           .n_state_snapshots = state_config.n_state_snapshots,
           .state_snapshot_interval = state_config.state_snapshot_interval,
           .state_checkpoints = state_config.state_checkpoints};
  if (Status s = sc.validate(); !s) return s.error();
  EngineConfig effective = config;
  effective.max_model_len = max_model_len;
  if (recurrent && state_config.n_state_snapshots == 0) effective.enable_prefix_caching = false;  // as the KV manager

  std::unique_ptr<DraftModelProposer> drafter;
  if (config.speculative.enabled() && config.speculative.method == SpeculativeConfig::Method::kDraftModel) {
    LoadOptions options;
    options.thread_pool = model.thread_pool();  // one after the other on the same cores
    options.ggml_flavour = model.ggml_flavour();
    options.numerics = model.numerics();
    options.max_output_rows = config.speculative.draft_vocab_size;
    auto draft = Model::load(config.speculative.draft_model, options);
    if (!draft) return make_error("cannot load the draft model: " + draft.error().message);
    // Room for every token the target's cache holds, plus each running
    // request's drafts: the draft's cache is never what stops a request. The
    // draft keeps its cache in the default dtype (f16) whatever the target's
    // --kv-cache-dtype: it is small, and its drafts are only proposals the
    // target verifies (DraftModelProposer sizes it the same way).
    const KVLayout draft_layout = KVLayout::plan((*draft)->config(), config.block_size);
    const int64_t target_tokens = kv_tokens_for_blocks(kv_layout, sc.kv.n_blocks);
    const int64_t draft_blocks =
        draft_layout.blocks_for_request(target_tokens, config.block_size) +
        int64_t{config.max_num_seqs} *
            draft_layout.blocks_for_request(config.speculative.num_speculative_tokens + config.block_size, config.block_size) +
        1;
    DraftProposerConfig dc;
    dc.block_size = config.block_size;
    dc.n_blocks = static_cast<int32_t>(std::min<int64_t>(draft_blocks, INT32_MAX));
    dc.max_batch_tokens = config.max_num_batched_tokens;
    dc.p_min = config.speculative.draft_p_min;
    dc.enable_prefix_caching = config.enable_prefix_caching;
    dc.warm_up = config.warm_up;
    auto proposer = DraftModelProposer::create(model, std::move(*draft), dc);
    if (!proposer) return proposer.error();
    drafter = std::move(*proposer);
  }
  std::unique_ptr<KVCacheBlocks> kv_blocks;
  std::unique_ptr<kvstore::TieredConnector> offload;
  if (config.offload.enabled()) {
    if (!config.enable_prefix_caching) return make_error("KV offload tiers need prefix caching");
    kv_blocks = std::make_unique<KVCacheBlocks>((*runner)->kv_cache());
    auto connector = kvstore::TieredConnector::create(config.offload, *kv_blocks,
                                                      kv_fingerprint(model, (*runner)->kv_cache()));
    if (!connector) return make_error("KV offload: " + connector.error().message);
    offload = std::move(*connector);
  }
  if (config.kv_transfer && !config.enable_prefix_caching)
    return make_error("the KV transfer needs prefix caching (blocks are found by their prefix keys)");
  const uint64_t fingerprint =
      config.kv_transfer ? kv_fingerprint(model, (*runner)->kv_cache()) : 0;
  std::unique_ptr<Engine> engine(new Engine(model, effective, sc, std::move(*runner), std::move(drafter),
                                            std::move(kv_blocks), std::move(offload)));
  if (config.kv_transfer)
    if (Status s = engine->start_kv_transfer(fingerprint); !s) return s.error();
  return engine;
}

Status Engine::start_kv_transfer(uint64_t fingerprint) {
  const EngineConfig::KVTransfer& t = *config_.kv_transfer;
  KVCache& cache = runner_->kv_cache();
  const ModelConfig& mc = model_.config();
  kvtransfer::AgentConfig ac;
  // Everything about the blocks' bytes is the cache's specs'.
  ac.descriptor = kv_descriptor(mc, cache, fingerprint);
  // Keys and values: each n_blocks blocks of block_stride bytes (a block's layers one after another).
  // (A latent cache has keys only.)
  const bool values = cache.storage_spec().has_values();
  ac.pool.regions = {cache.keys_base()};
  if (values) ac.pool.regions.push_back(cache.values_base());
  if (cache.keys_fd() >= 0) {
    ac.pool.region_fds = {cache.keys_fd()};
    if (values) ac.pool.region_fds.push_back(cache.values_fd());
    ac.pool.shared_name = KVCache::kSharedName;
  } else if (t.produce && !t.consume) {
    spdlog::warn("KV transfer: the KV cache is not on shared memory ({}); consumers on this host read it by system "
                 "calls", cache.shared_error());
  }
  ac.pool.slabs = 1;
  ac.pool.n_blocks = cache.n_blocks();
  ac.pool.segment_bytes = cache.block_stride();
  ac.engine_id = t.engine_id;
  if (t.produce) {
    leases_ = std::make_unique<kvtransfer::LeaseTable>();
    ac.listen = true;
    ac.ip = t.ip;
    ac.port = t.port;
    ac.leases = leases_.get();
  }
  auto agent = kvtransfer::UcxAgent::create(ac);
  if (!agent) return agent.error();
  agent_ = std::move(*agent);
  agent_->set_on_finished([this] {
    {
      std::lock_guard<std::mutex> lock(cmd_mu_);
      load_finished_ = true;
    }
    cmd_cv_.notify_one();
  });
  if (t.consume) {
    transfer_ = std::make_unique<kvtransfer::TransferConnector>(*agent_, t.timeout_seconds);
    if (offload_) {  // the tiers' own copies first, the producer's for the rest
      tiers_then_transfer_ = std::make_unique<kv::ChainedConnector>(*offload_, *transfer_);
      scheduler_.set_connector(tiers_then_transfer_.get());
    } else {
      scheduler_.set_connector(transfer_.get());
    }
  }
  next_lease_ = (std::random_device{}() | uint64_t{1} << 32) << 20;
  publish_stats();
  return {};
}

void Engine::end_leases() {
  if (!leases_) return;
  for (uint64_t id : leases_->take_ended(now_seconds())) {
    scheduler_.end_lease(id);
    lease_block_count_.erase(id);
  }
}

Engine::Engine(Model& model, const EngineConfig& config, const SchedulerConfig& sched,
               std::unique_ptr<ModelRunner> runner, std::unique_ptr<DraftModelProposer> drafter,
               std::unique_ptr<KVCacheBlocks> kv_blocks, std::unique_ptr<kvstore::TieredConnector> offload)
    : model_(model),
      tokenizer_(model.tokenizer()),
      config_(config),
      runner_(std::move(runner)),
      scheduler_(sched),
      drafter_(std::move(drafter)),
      kv_blocks_(std::move(kv_blocks)),
      offload_(std::move(offload)) {
  scheduler_.set_connector(offload_.get());
  if (config_.pipeline) pipeline_batches_ = drafter_ || config_.speculative.enabled() ? 1 : runner_->pipeline_stages();
  for (int32_t id = 0; id < tokenizer_.n_vocab(); ++id)
    if (tokenizer_.is_eog(id)) eog_tokens_.push_back(id);
  publish_stats();
}

Engine::~Engine() {
  stop();
  abort_all();  // whoever still waits on a stream gets a final output
}

void Engine::abort_all() {
  std::vector<Command> cmds;
  {
    std::lock_guard<std::mutex> lock(cmd_mu_);
    cmds.swap(commands_);
  }
  for (Command& c : cmds) apply(c);
  std::vector<std::string> ids;
  for (const auto& [id, live] : live_) ids.push_back(id);
  for (const std::string& id : ids) {
    release(id);
    finish(id, RequestStatus::kFinishedAborted, RequestOutput{});
  }
  drain_in_flight();
  end_step();
}

void Engine::drain_in_flight() {
  for (; !in_flight_.empty(); in_flight_.pop_front()) runner_->receive_samples();
}

Result<Engine::Handle> Engine::add_request(GenerationParams p) {
  const double arrival = now_seconds();
  const int64_t n_vocab = model_.config().n_vocab;
  for (size_t i = 0; i < p.prompt_token_ids.size(); ++i)
    if (p.prompt_token_ids[i] < 0 || p.prompt_token_ids[i] >= n_vocab)
      return make_error("prompt token " + str(static_cast<int64_t>(i)) + " (id " +
                        str(p.prompt_token_ids[i]) + ") is outside the vocabulary of " +
                        str(n_vocab) + " tokens");
  for (int32_t t : p.stop_token_ids)
    if (t < 0 || t >= n_vocab)
      return make_error("stop token id " + str(t) + " is outside the vocabulary of " +
                        str(n_vocab) + " tokens");
  for (const std::string& s : p.stop)
    if (s.empty()) return make_error("a stop string is empty");
  if (p.logprobs > config_.max_logprobs)
    return make_error("logprobs is " + str(p.logprobs) + "; at most " + str(config_.max_logprobs) +
                      " are allowed");
  if (p.prompt_logprobs > config_.max_logprobs)
    return make_error("prompt_logprobs is " + str(p.prompt_logprobs) + "; at most " + str(config_.max_logprobs) +
                      " are allowed");
  std::unique_ptr<GrammarMatcher> matcher;
  if (p.grammar) {
    if (p.grammar->n_vocab() > n_vocab)
      return make_error("the grammar was compiled for a vocabulary of " + str(p.grammar->n_vocab()) +
                        " tokens; the model has " + str(n_vocab));
    auto m = p.grammar->new_matcher();  // on the caller's thread, not the loop's
    if (!m) return m.error();
    matcher = std::move(*m);
  }

  const ModelConfig& mc = model_.config();
  if (p.pooled && !mc.can_embed() && !mc.can_rank())
    return make_error("this model cannot embed or rank: its GGUF has no pooling type (an embedding GGUF has one, "
                      "e.g. a bert encoder's or Qwen3-Embedding's)");
  if (!p.pooled && mc.returns_pooled())
    return make_error(std::string("this model is an embedding/reranking model (pooling ") + pooling_name(mc.pooling) +
                      "): it returns pooled vectors, not tokens, and cannot generate text");
  if (p.pooled && p.prompt_token_ids.empty()) return make_error("the input is empty");
  if (p.pooled && static_cast<int64_t>(p.prompt_token_ids.size()) > mc.context_length)
    return make_error("the input has " + str(static_cast<int64_t>(p.prompt_token_ids.size())) +
                      " tokens, more than the model's " + str(mc.context_length) + " positions");

  Request r;
  r.prompt_token_ids = std::move(p.prompt_token_ids);
  r.sampling = p.sampling;
  r.max_tokens = p.max_tokens;
  if (tokenizer_.eos_id() >= 0) r.eos_token_id = tokenizer_.eos_id();
  r.stop_token_ids = std::move(p.stop_token_ids);
  // Every end-of-generation token (EOS, EOT, <|im_end|>, ...) stops, not just EOS.
  if (!p.ignore_eos) r.stop_token_ids.insert(r.stop_token_ids.end(), eog_tokens_.begin(), eog_tokens_.end());
  r.ignore_eos = p.ignore_eos;
  r.needs_prompt_logits = p.prompt_logprobs >= 0;
  r.pooled = p.pooled;
  if (r.pooled) {
    if (p.beam_search || matcher || p.logprobs >= 0 || p.prompt_logprobs >= 0)
      return make_error("an embedding request takes no beam search, grammar or logprobs");
    r.max_tokens = 1;  // one pass, one output row (no token is appended)
    r.stop_token_ids.clear();
  }
  r.cache_salt = std::move(p.cache_salt);
  r.arrival_time = arrival;
  if (p.reasoning && p.reasoning->end.empty()) return make_error("the reasoning end marker is empty");
  // A request's beams are named after it (see below): no request may take such a name.
  if (p.request_id.find(kBeamSuffix) != std::string::npos)
    return make_error(std::string("a request id may not contain '") + kBeamSuffix + "'");
  if (p.beam_search) {
    if (Status s = p.beam_search->validate(); !s) return s.error();
    if (matcher) return make_error("beam search cannot be combined with structured output (a grammar)");
    if (p.logprobs >= 0) return make_error("logprobs are not returned with beam search");
    if (p.prompt_logprobs >= 0) return make_error("prompt logprobs are not returned with beam search");
    r.beam_group = "pending";
    r.beam_width = p.beam_search->beam_width;
  }
  r.id = "pending";  // validated before an id is spent on it
  // The scheduler's config never changes after construction: safe to read here.
  if (Status s = Scheduler::validate_request(r, scheduler_.config()); !s) return s.error();

  Handle h;
  {
    std::lock_guard<std::mutex> lock(cmd_mu_);
    h.request_id = p.request_id.empty() ? str(static_cast<int64_t>(next_id_++)) : std::move(p.request_id);
    h.stream = std::make_shared<RequestStream>(h.request_id);
    r.id = h.request_id;
    if (p.beam_search) {  // the first beam; its forks are numbered on
      r.beam_group = h.request_id;
      r.id = kv_pull_id(h.request_id, true);
    }
    // A beam search's beams share its prompt but run as forks: none holds a lease.
    if (p.kv_hold_for_remote_decode && leases_ && !p.beam_search) r.kv_lease_id = ++next_lease_;
    commands_.emplace_back(AddCommand{std::move(r), h.stream, std::move(p.stop), std::max(-1, p.logprobs),
                                      std::max(-1, p.prompt_logprobs), std::move(matcher), std::move(p.reasoning), p.render_special,
                                      p.beam_search});
  }
  cmd_cv_.notify_one();
  return h;
}

void Engine::abort(const std::string& request_id) {
  {
    std::lock_guard<std::mutex> lock(cmd_mu_);
    commands_.emplace_back(AbortCommand{request_id});
  }
  cmd_cv_.notify_one();
}

void Engine::apply(Command& cmd) {
  if (auto* add = std::get_if<AddCommand>(&cmd)) {
    // A beam search's request is its beam group; the scheduler runs its beams.
    const std::string id = add->request.beam_group.empty() ? add->request.id : add->request.beam_group;
    if (live_.count(id)) {  // a caller-chosen id already in use: refuse this one only
      RequestOutput out;
      out.request_id = id;
      out.finished = true;
      out.status = RequestStatus::kFinishedAborted;
      out.error = "request id '" + id + "' is already in use";
      emit(add->stream, std::move(out));
      return;
    }
    Live live{add->stream, RequestText(tokenizer_, add->render_special, add->stop), add->logprobs};
    live.matcher = std::move(add->matcher);
    if (live.matcher && add->reasoning) {
      live.reasoning = std::move(add->reasoning);
      live.gate = live.reasoning->starts_inside ? Live::Gate::kThinking
                  : live.reasoning->start.empty() ? Live::Gate::kOpen
                                                  : Live::Gate::kMaybe;
    }
    live.metrics.arrival_time = add->request.arrival_time;
    live.metrics.num_prompt_tokens = add->request.num_prompt_tokens();
    live.kv_lease_id = add->request.kv_lease_id;
    const int64_t n_prompt = add->request.num_prompt_tokens();
    if (add->beam_search) {
      live.beams = std::make_unique<BeamGroup>(BeamSearch(*add->beam_search, n_prompt, add->request.max_tokens));
      live.beams->ids.push_back(add->request.id);
      live.beams->text.emplace(tokenizer_, add->render_special, std::move(add->stop));
      beam_owner_[add->request.id] = id;
    }
    runner_->add_request(add->request.id, sampling_request(add->request, live, add->prompt_logprobs));
    Status st = scheduler_.add_request(std::move(add->request));
    live_.emplace(id, std::move(live));
    if (!st) {  // checked in add_request already; only a bug gets here
      RequestOutput out;
      out.error = st.error().message;
      finish(id, RequestStatus::kFinishedAborted, std::move(out));
      return;
    }
    ++requests_added_;
    prompt_tokens_ += n_prompt;
  } else {
    const std::string& id = std::get<AbortCommand>(cmd).request_id;
    if (release(id)) finish(id, RequestStatus::kFinishedAborted, RequestOutput{});
  }
}

SamplingRequest Engine::sampling_request(const Request& r, const Live& live, int32_t prompt_logprobs) const {
  SamplingRequest sr;
  if (live.beams) {
    sr.kind = SamplingRequest::Kind::kBeam;
    sr.beam_candidates = live.beams->search.candidates_per_beam();
    return sr;
  }
  if (r.pooled) {
    sr.kind = SamplingRequest::Kind::kPooled;
    return sr;
  }
  sr.params = r.sampling;
  sr.prompt_token_ids = r.prompt_token_ids;
  sr.logprobs = live.logprobs;
  sr.prompt_logprobs = prompt_logprobs;
  sr.constrained = live.matcher != nullptr;
  return sr;
}

Engine::Live& Engine::owner(const std::string& scheduler_id) {
  auto it = beam_owner_.find(scheduler_id);
  return live_.at(it == beam_owner_.end() ? scheduler_id : it->second);
}

bool Engine::release(const std::string& request_id) {
  if (beam_owner_.count(request_id)) return false;  // one beam alone: only its search ends it
  auto it = live_.find(request_id);
  if (it == live_.end() || !it->second.beams) return scheduler_.abort(request_id);
  BeamGroup& g = *it->second.beams;
  for (const std::string& beam : g.ids) {
    scheduler_.abort(beam);
    beam_owner_.erase(beam);
    runner_->remove_request(beam);
  }
  g.ids.clear();
  return true;
}

std::vector<RequestOutput> Engine::end_step() {
  publish_stats();
  return outputs_.flush(finished_listener_);
}

void Engine::finish(const std::string& id, RequestStatus status, RequestOutput out) {
  auto it = live_.find(id);
  if (it == live_.end()) return;
  Live& live = it->second;
  // The scheduler no longer runs it (released by the caller): the sampling stage forgets it.
  if (live.beams) {
    for (const std::string& beam : live.beams->ids) {
      beam_owner_.erase(beam);
      runner_->remove_request(beam);
    }
  } else {
    runner_->remove_request(id);
  }
  out.request_id = id;
  out.finished = true;
  out.status = status;
  if (live.kv_lease_id != 0) {
    // The scheduler has retired the request: a finished prefill left its
    // prompt's full blocks under the lease, held from now until the consumer
    // releases it or it expires.
    out.kv_lease_blocks = scheduler_.lease_blocks(live.kv_lease_id);
    int64_t n = 0;
    for (const auto& g : out.kv_lease_blocks)
      for (int32_t b : g) n += b != kv::BlockPool::kNullBlock;
    if (n > 0 && leases_) {
      out.kv_lease_id = live.kv_lease_id;
      leases_->add(live.kv_lease_id, now_seconds() + config_.kv_transfer->lease_seconds);
      lease_block_count_[live.kv_lease_id] = n;
    } else {
      out.kv_lease_blocks.clear();
      scheduler_.end_lease(live.kv_lease_id);
    }
  }
  live.metrics.finished_time = now_seconds();
  out.metrics = std::move(live.metrics);
  emit(live.stream, std::move(out));
  live_.erase(it);
  if (drafter_) drafter_->forget(id);
}

const std::vector<std::vector<int32_t>>& Engine::start_continuations(const std::string& start) {
  auto it = start_continuations_.find(start);
  if (it != start_continuations_.end()) return it->second;
  std::vector<std::vector<int32_t>> sets(start.size());
  const std::string_view marker(start);
  for (int32_t id = 0; id < tokenizer_.n_vocab(); ++id) {
    const std::string piece = tokenizer_.token_to_piece(id, /*render_special=*/true);
    if (piece.empty()) continue;
    for (size_t k = 0; k < marker.size(); ++k) {
      const std::string_view rest = marker.substr(k);
      if (rest.starts_with(piece) || std::string_view(piece).starts_with(rest)) sets[k].push_back(id);
    }
  }
  return start_continuations_.emplace(start, std::move(sets)).first->second;
}

Status Engine::maybe_thinking_mask(Live& live, int64_t n_vocab) {
  const std::vector<int32_t>& cont = start_continuations(live.reasoning->start)[live.gate_text.size()];
  live.gate_mask.assign(static_cast<size_t>((n_vocab + 31) / 32), 0u);
  if (live.gate_grammar_ok) {
    // What was written so far (a piece of the marker, or nothing) is also a
    // valid start of the answer: the answer may go on from here.
    auto mask = live.matcher->compute_mask();
    if (!mask) return mask.error();
    live.gate_grammar_mask.assign(mask->begin(), mask->end());  // for advance_grammar, after sampling
    const size_t words = std::min(mask->size(), live.gate_mask.size());
    for (size_t w = 0; w < words; ++w) live.gate_mask[w] = (*mask)[w];
  }
  for (int32_t id : cont)
    if (id < n_vocab) live.gate_mask[static_cast<size_t>(id) / 32] |= 1u << (id % 32);
  return {};
}

void Engine::prepare_sampling(const SchedulerOutput& out) {
  grammar_errors_.assign(out.scheduled.size(), std::string());
  sampling_inputs_.allowed.clear();
  const int64_t n_vocab = runner_->n_vocab();
  for (size_t i = 0; i < out.scheduled.size(); ++i) {
    const ScheduledRequest& s = out.scheduled[i];
    if (!s.sample || beam_owner_.count(s.request_id)) continue;
    Live& live = live_.at(s.request_id);
    // While the output thinks (Live::Gate), the grammar waits for its end.
    if (!live.matcher || live.gate == Live::Gate::kThinking) continue;
    assert(s.num_draft_tokens == 0);  // requests with a grammar do not speculate
    if (sampling_inputs_.allowed.empty()) sampling_inputs_.allowed.resize(out.scheduled.size());
    AllowedTokens& allowed = sampling_inputs_.allowed[i];
    if (live.gate == Live::Gate::kOpen) {
      auto mask = live.matcher->compute_mask();  // valid until the matcher's next call: after sampling
      if (mask)
        allowed = {*mask, live.matcher->n_vocab()};
      else
        grammar_errors_[i] = mask.error().message;  // the request ends after update()
    } else if (Status st = maybe_thinking_mask(live, n_vocab); st) {
      allowed = {live.gate_mask, static_cast<int32_t>(n_vocab)};
    } else {
      grammar_errors_[i] = st.error().message;
    }
  }
}

Status Engine::advance_grammar(Live& live, int32_t token) {
  switch (live.gate) {
    case Live::Gate::kOpen:
      return live.matcher->commit(token);
    case Live::Gate::kMaybe: {
      const std::string& start = live.reasoning->start;
      const std::string piece = tokenizer_.token_to_piece(token, /*render_special=*/true);
      const std::string text = live.gate_text + piece;
      if (piece.empty() || !(std::string_view(start).starts_with(text) || text.starts_with(start))) {
        // Not the thinking: the answer began (the mask allowed this token only
        // if the grammar does).
        live.gate = Live::Gate::kOpen;
        live.gate_text.clear();
        return live.matcher->commit(token);
      }
      // A piece of the marker. It may still be the answer's start too (a
      // grammar that begins with '<'): the grammar follows it while it can.
      // (A token the grammar does not allow is never given to it: that would
      // leave the matcher in error.)
      if (live.gate_grammar_ok) {
        if (token_allowed(live.gate_grammar_mask, token)) {
          live.gate_grammar_used = true;
          if (Status st = live.matcher->commit(token); !st) return st;
        } else {
          live.gate_grammar_ok = false;
        }
      }
      if (text.size() < start.size()) {
        live.gate_text = text;  // more of the marker to come
        return {};
      }
      // The thinking opened: the grammar starts afresh after it.
      if (live.gate_grammar_used) {
        auto fresh = live.matcher->grammar()->new_matcher();
        if (!fresh) return fresh.error();
        live.matcher = std::move(*fresh);
      }
      live.gate = Live::Gate::kThinking;
      live.gate_text = text.substr(start.size());
      break;
    }
    case Live::Gate::kThinking:
      live.gate_text += tokenizer_.token_to_piece(token, /*render_special=*/true);
      break;
  }
  // Inside the thinking: has the end marker been written?
  const std::string& end = live.reasoning->end;
  if (live.gate_text.find(end) != std::string::npos) {
    live.gate = Live::Gate::kOpen;  // the grammar starts at the next token
    live.gate_text.clear();
  } else if (live.gate_text.size() >= end.size()) {
    live.gate_text.erase(0, live.gate_text.size() - (end.size() - 1));
  }
  return {};
}

std::vector<RequestOutput> Engine::step() {
  // The loop thread owns the engine's state while it runs.
  assert(!loop_running_.load());
  return run_step();
}

std::vector<RequestOutput> Engine::run_step() {
  apply_commands();
  end_leases();
  if (pipeline_batches_ > 0) return run_pipelined_step();
  // Loads of aborted requests still hold their blocks: schedule() collects them too.
  if (!scheduler_.has_unfinished_requests() && !scheduler_.has_loads_in_flight()) return end_step();
  const SchedulerOutput out = scheduler_.schedule();
  count_scheduled(out);
  if (!out.empty()) {
    StepSamples sampled = execute(out);
    update(out, sampled);
  }
  return end_step();
}

void Engine::apply_commands() {
  std::vector<Command> cmds;
  {
    std::lock_guard<std::mutex> lock(cmd_mu_);
    cmds.swap(commands_);
  }
  for (Command& c : cmds) apply(c);
}

void Engine::count_scheduled(const SchedulerOutput& out) {
  const double t_scheduled = now_seconds();
  std::string last_preempted;  // a beam group's beams are preempted together: counted once
  for (const std::string& id : out.preempted_request_ids) {
    auto b = beam_owner_.find(id);
    if (b != beam_owner_.end() && b->second == last_preempted) continue;
    last_preempted = b != beam_owner_.end() ? b->second : std::string();
    ++owner(id).metrics.num_preemptions;
  }
  for (const ScheduledRequest& s : out.scheduled) {
    RequestMetrics& m = owner(s.request_id).metrics;
    if (m.first_scheduled_time == 0.0) {
      m.first_scheduled_time = t_scheduled;
      m.num_cached_tokens = s.num_cached_tokens;
    }
    const int64_t n_prompt = scheduler_.find(s.request_id)->num_prompt_tokens();
    const int64_t end = s.num_computed_tokens + s.num_new_tokens;
    computed_prompt_tokens_ += std::max<int64_t>(0, std::min(end, n_prompt) - s.num_computed_tokens);
    computed_tokens_ += s.num_new_tokens;
  }
}

// Batches in flight (vLLM's batch queue for pipeline parallelism): while the
// later stages run the batches handed on before, rank 0 schedules the next
// batch from the requests in none of them (Scheduler: in_flight), runs its
// first stage, then takes the oldest batch's samples and hands the new batch
// on, and only then updates the requests of the batch that came back. Every
// request's tokens are computed by the same kernels over the same rows as in
// one step after another: outputs are those of one process.
std::vector<RequestOutput> Engine::run_pipelined_step() {
  // A beam search runs with one batch in the pipeline: its beams must sample in one batch (select_beams).
  const bool one_batch = !beam_owner_.empty();
  const size_t max_batches = one_batch ? 1 : static_cast<size_t>(pipeline_batches_);
  scheduler_.set_batches_in_flight(static_cast<int32_t>(max_batches));
  SchedulerOutput out;
  if (in_flight_.size() < max_batches && scheduler_.has_unfinished_requests()) {
    out = scheduler_.schedule();
    count_scheduled(out);
  }
  const auto t0 = std::chrono::steady_clock::now();
  if (!out.empty()) {
    prepare_sampling(out);
    runner_->run_first_stage(out);
  }
  std::optional<InFlightBatch> back;
  ModelRunnerOutput* sampled = nullptr;
  if (!in_flight_.empty() && (out.empty() || in_flight_.size() + 1 >= max_batches)) {
    sampled = &runner_->receive_samples();
    back = std::move(in_flight_.front());
    in_flight_.pop_front();
  }
  if (!out.empty()) {
    runner_->hand_on(out, sampling_inputs_);
    in_flight_.push_back({std::move(out), std::move(grammar_errors_)});
  }
  forward_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (back) {
    grammar_errors_ = std::move(back->grammar_errors);
    StepSamples step = take_samples(back->out, *sampled);
    update(back->out, step);
  }
  return end_step();
}

Engine::StepSamples Engine::execute(const SchedulerOutput& out) {
  prepare_sampling(out);
  const auto t0 = std::chrono::steady_clock::now();
  ModelRunnerOutput& sampled = runner_->execute(out, sampling_inputs_);
  forward_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return take_samples(out, sampled);
}

Engine::StepSamples Engine::take_samples(const SchedulerOutput& out, ModelRunnerOutput& sampled) {
  StepSamples step;
  step.t_token = now_seconds();
  step.logprobs.resize(out.scheduled.size());
  // What each request sampled: its tokens go to update() (sampled_), its
  // grammar follows them, its drafts' acceptance goes to its proposer.
  sampled_.resize(out.scheduled.size());
  for (size_t i = 0; i < out.scheduled.size(); ++i) {
    const ScheduledRequest& s = out.scheduled[i];
    SampledRequest& result = sampled.requests[i];
    std::vector<int32_t>& tokens = sampled_[i];
    tokens.swap(result.tokens);  // the stage clears what it gets back
    if (!scheduler_.find(s.request_id)) continue;  // aborted while its batch was in flight
    if (beam_owner_.count(s.request_id)) continue;  // its candidates go to its group's search
    Live& live = live_.at(s.request_id);
    for (SampledLogprobs& lp : result.prompt_logprobs) live.pending_prompt_logprobs.push_back(std::move(lp));
    if (!s.sample) continue;
    if (scheduler_.find(s.request_id)->pooled) {  // its row is its output (finished in update())
      live.pooled = std::move(result.pooled);
      step.pooled_done.push_back(s.request_id);
      continue;
    }
    if (live.matcher)
      for (const int32_t token : tokens)
        if (grammar_errors_[i].empty())
          if (Status st = advance_grammar(live, token); !st) grammar_errors_[i] = st.error().message;
    step.logprobs[i].swap(result.logprobs);
    if (s.num_draft_tokens > 0) drafts_verified(live, s.num_draft_tokens, tokens);
  }
  step.beams = select_beams(out, sampled);
  return step;
}

void Engine::update(const SchedulerOutput& out, StepSamples& step) {
  auto updates = scheduler_.update(out, sampled_);
  if (!updates) {
    // The step does not match the scheduler's state (a bug): end its requests
    // rather than let them continue from a corrupt state.
    for (const ScheduledRequest& s : out.scheduled) {
      auto b = beam_owner_.find(s.request_id);
      const std::string id = b == beam_owner_.end() ? s.request_id : b->second;
      if (!release(id)) continue;
      RequestOutput o;
      o.error = "internal error: " + updates.error().message;
      finish(id, RequestStatus::kFinishedAborted, std::move(o));
    }
    return;
  }
  size_t k = 0;  // updates come in the order of out.scheduled
  for (RequestUpdate& u : *updates) {
    while (out.scheduled[k].request_id != u.request_id) ++k;
    if (beam_owner_.count(u.request_id)) continue;  // a beam: its group's search follows below
    output_update(u, std::move(step.logprobs[k]), std::move(grammar_errors_[k]), step.t_token);
  }
  // Pooled requests end with their step.
  for (const std::string& id : step.pooled_done) {
    if (!scheduler_.find(id)) continue;
    (void)scheduler_.finish_request(id, RequestStatus::kFinishedStopped);
    Live& live = live_.at(id);
    live.metrics.first_token_time = live.metrics.last_token_time = step.t_token;
    RequestOutput o;
    o.embedding = std::move(live.pooled);
    finish(id, RequestStatus::kFinishedStopped, std::move(o));
  }
  apply_beams(step.beams, step.t_token);
  propose_drafts(*updates);
}

void Engine::output_update(RequestUpdate& u, std::vector<SampledLogprobs> logprobs, std::string grammar_error,
                           double t_token) {
  Live& live = live_.at(u.request_id);
  RequestOutput o;
  o.request_id = u.request_id;
  o.prompt_logprobs = std::move(live.pending_prompt_logprobs);
  live.pending_prompt_logprobs.clear();
  // Several tokens (accepted drafts): a stop string completed by one
  // before the last ends the request at that token.
  const size_t kept = live.text.append(u.new_token_ids, u.status == RequestStatus::kFinishedStopped);
  if (kept < u.new_token_ids.size()) {
    u.new_token_ids.resize(kept);
    u.status = RequestStatus::kRunning;  // the stop string decides below
  }
  for (size_t t = 0; t < kept; ++t) {
    o.token_times.push_back(t_token);
    live.metrics.token_times.push_back(t_token);
    if (live.metrics.first_token_time == 0.0) live.metrics.first_token_time = t_token;
    live.metrics.last_token_time = t_token;
    ++live.metrics.num_output_tokens;
    ++generation_tokens_;
  }
  if (live.logprobs >= 0) {
    logprobs.resize(kept);
    o.logprobs = std::move(logprobs);
  }
  o.token_ids = std::move(u.new_token_ids);

  if (!grammar_error.empty()) {
    // The grammar engine failed (e.g. a step ran out of its resource limits):
    // end the request with the reason rather than continue unconstrained.
    if (!is_finished(u.status)) (void)scheduler_.finish_request(u.request_id, RequestStatus::kFinishedAborted);
    std::string unused;
    o.text = live.text.release(true, &unused);
    o.error = std::move(grammar_error);
    finish(u.request_id, RequestStatus::kFinishedAborted, std::move(o));
    return;
  }
  // A complete grammar finishes the request with "stop", also when the same
  // token reached max_tokens (the output is whole).
  const bool grammar_done = live.matcher && live.matcher->is_stopped();
  if (grammar_done && u.status != RequestStatus::kFinishedStopped) {
    if (!is_finished(u.status)) (void)scheduler_.finish_request(u.request_id, RequestStatus::kFinishedStopped);
    u.status = RequestStatus::kFinishedStopped;
  }
  const bool finished = is_finished(u.status);
  std::string stop_at;
  o.text = live.text.release(finished, &stop_at);
  if (!stop_at.empty()) {
    // A stop string outranks the length limit reached by the same token.
    if (!finished) (void)scheduler_.finish_request(u.request_id, RequestStatus::kFinishedStopped);
    o.stop_string = std::move(stop_at);
    finish(u.request_id, RequestStatus::kFinishedStopped, std::move(o));
  } else if (finished) {
    finish(u.request_id, u.status, std::move(o));
  } else {
    emit(live.stream, std::move(o));
  }
}

Status Engine::check_invariants() const {
  if (Status s = scheduler_.check_invariants(); !s) return s;
  // The sampling stage keeps state for exactly the scheduler requests the engine runs.
  size_t runs = 0;
  for (const auto& [id, live] : live_) runs += live.beams ? live.beams->ids.size() : 1;
  if (runner_->num_requests() != runs)
    return make_error("the sampling stage keeps " + str(static_cast<int64_t>(runner_->num_requests())) +
                      " requests; the engine runs " + str(static_cast<int64_t>(runs)));
  if (offload_)
    if (Status s = offload_->check_invariants(); !s) return make_error("KV offload: " + s.error().message);
  if (!drafter_) return {};
  if (Status s = drafter_->check_invariants(); !s) return make_error("the draft model's KV cache: " + s.error().message);
  for (const std::string& id : drafter_->sequence_ids())
    if (!scheduler_.find(id))
      return make_error("the draft model keeps KV for request '" + id + "', which has ended");
  return {};
}

bool Engine::has_pending_work() {
  std::lock_guard<std::mutex> lock(cmd_mu_);
  return !commands_.empty() || scheduler_.has_unfinished_requests() || !in_flight_.empty();
}

void Engine::loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(cmd_mu_);
      // Requests that only wait for their KV blocks need no step: the loop
      // sleeps until a pull finishes (the agent wakes it), and wakes now and
      // then while leases are held, to end the expired ones.
      const auto ready = [&] {
        const bool only_loading = scheduler_.num_running() == 0 && scheduler_.num_waiting() == 0;
        return stop_requested_ || !commands_.empty() || load_finished_ || !in_flight_.empty() ||
               (scheduler_.has_unfinished_requests() && !only_loading);
      };
      if (scheduler_.has_loads_in_flight() || !lease_block_count_.empty())
        cmd_cv_.wait_for(lock, std::chrono::milliseconds(100), ready);
      else
        cmd_cv_.wait(lock, ready);
      if (stop_requested_) return;
      load_finished_ = false;
    }
    run_step();
  }
}

void Engine::start() {
  if (thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(cmd_mu_);
    stop_requested_ = false;
  }
  loop_running_.store(true);
  thread_ = std::thread([this] { loop(); });
}

void Engine::stop() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(cmd_mu_);
    stop_requested_ = true;
  }
  cmd_cv_.notify_all();
  thread_.join();
  loop_running_.store(false);
}

void Engine::publish_stats() {
  EngineStats s;
  s.scheduler = scheduler_.stats();
  s.kv_total_blocks = scheduler_.kv_cache().num_usable_blocks();
  s.kv_cache_dtype = runner_->kv_cache().storage_spec().dtype;
  s.kv_cache_skip_sliding_window = config_.kv_cache_skip_sliding_window;
  s.kv_bytes_per_token = runner_->kv_cache().layout().bytes_per_token();
  s.kv_capacity_tokens = kv_tokens_for_blocks(runner_->kv_cache().layout(), s.kv_total_blocks);
  const kv::KVCacheManager& kv = scheduler_.kv_cache();
  s.kv_state_slots = kv.num_state_slots();
  s.kv_state_snapshots = kv.state_snapshots().num_slots();
  s.kv_state_snapshots_cached = kv.state_snapshots().num_cached();
  s.kv_state_checkpoints = kv.num_state_slots() * kv.num_state_checkpoints();
  s.kv_state_bytes_per_sequence = runner_->kv_cache().layout().state_slot_bytes();
  s.kv_state_bytes = static_cast<int64_t>(runner_->kv_cache().state_bytes());
  s.requests_added = requests_added_;
  s.prompt_tokens = prompt_tokens_;
  s.computed_prompt_tokens = computed_prompt_tokens_;
  s.generation_tokens = generation_tokens_;
  s.computed_tokens = computed_tokens_;
  s.forward_seconds = forward_seconds_;
  if (drafter_) s.draft_forward_seconds = drafter_->forward_seconds();
  if (config_.tensor_parallel) s.collectives = config_.tensor_parallel->collective_stats();
  s.speculative = spec_stats_;
  if (offload_) s.offload = offload_->stats();
  if (transfer_) s.kv_transfer = transfer_->stats();
  else if (agent_) s.kv_transfer.agent = agent_->stats();
  if (leases_) s.kv_leases = leases_->stats();
  for (const auto& [lease, blocks] : lease_block_count_) s.kv_lease_blocks += blocks;
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_ = std::move(s);
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return stats_;
}

}  // namespace inferd
