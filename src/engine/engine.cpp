#include "engine/engine.h"

#include <algorithm>
#include <cassert>
#include <chrono>
#include <cmath>
#include <random>

#include <spdlog/spdlog.h>

#include "core/dtype.h"
#include "engine/kv_capacity.h"

namespace inferd {

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string str(int64_t v) { return std::to_string(v); }

}  // namespace

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
  // cannot be cut back to a past position, shared, nor sent as blocks.
  const bool recurrent = model.config().has_recurrent_layers();
  if (recurrent) {
    const std::string arch = model.config().architecture;
    if (config.speculative.enabled())
      return make_error("speculative decoding is not supported for '" + arch +
                        "': its recurrent (Gated DeltaNet) layers' state cannot be rolled back past rejected drafts");
    if (config.offload.enabled())
      return make_error("KV offload tiers are not supported for '" + arch +
                        "': its recurrent layers' state is not kept in KV blocks");
    if (config.kv_transfer)
      return make_error("the KV transfer is not supported for '" + arch +
                        "': its recurrent layers' state is not kept in KV blocks");
    if (config.enable_prefix_caching)
      spdlog::info("prefix caching is off for '{}': a cached prefix would need its recurrent layers' state too", arch);
  }

  ModelRunnerConfig rc;
  rc.block_size = config.block_size;
  rc.kv_cache_bytes = config.kv_cache_bytes;
  rc.kv_cache_memory_fraction = config.kv_cache_memory_fraction;
  rc.kv_cache_dtype = config.kv_cache_dtype;
  rc.warm_up = config.warm_up;
  rc.n_state_slots = recurrent ? config.max_num_seqs : 0;
  // A kv_producer's KV cache goes on shared memory, which consumers on this
  // host map (core/shared_bytes.h). Not a kv_both instance's: it decodes too,
  // and shared memory has no transparent huge pages on most systems.
  rc.kv_cache_shareable = config.kv_transfer && config.kv_transfer->produce && !config.kv_transfer->consume;
  // More blocks than every running request at full length needs would only
  // ever hold cached prefixes; a budget given as a fraction of memory stops there.
  if (Status s = check_kv_cache_dtype(model, config.kv_cache_dtype, config.block_size); !s) return s.error();
  const KVLayout kv_layout = KVLayout::plan(model.config(), config.block_size, config.kv_cache_dtype);
  if (max_model_len > 0 && config.kv_cache_bytes <= 0)
    rc.max_blocks = int64_t{config.max_num_seqs} * kv_layout.blocks_for_request(max_model_len, config.block_size) + 1;
  auto runner = ModelRunner::create(model, rc);
  if (!runner) return runner.error();

  SchedulerConfig sc;
  sc.max_num_batched_tokens = config.max_num_batched_tokens;
  sc.max_num_seqs = config.max_num_seqs;
  sc.long_prefill_token_threshold = config.long_prefill_token_threshold;
  sc.max_model_len = max_model_len;
  sc.kv = {.n_blocks = (*runner)->n_blocks(),
           .block_size = config.block_size,
           .enable_prefix_caching = config.enable_prefix_caching,
           .group_windows = kv_layout.group_windows,
           .n_state_slots = rc.n_state_slots};
  if (Status s = sc.validate(); !s) return s.error();
  EngineConfig effective = config;
  effective.max_model_len = max_model_len;
  if (recurrent) effective.enable_prefix_caching = false;  // what the KV manager does (see above)

  std::unique_ptr<DraftModelProposer> drafter;
  if (config.speculative.enabled() && config.speculative.method == SpeculativeConfig::Method::kDraftModel) {
    LoadOptions options;
    options.thread_pool = model.thread_pool();  // one after the other on the same cores
    options.ggml_flavour = model.ggml_flavour();
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
  // Keys and values: each layers_per_block slabs of [block][slot] (slots of the spec's slot_bytes).
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
  ac.pool.slabs = cache.layout().layers_per_block;
  ac.pool.n_blocks = cache.n_blocks();
  ac.pool.segment_bytes = cache.segment_bytes();
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
  end_step();
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
    return make_error("this model cannot embed or rank: it has no pooling (an embedding or reranker GGUF of an "
                      "encoder such as bert has one)");
  if (!p.pooled && mc.is_encoder())
    return make_error("this model is an embedding/reranking model: it cannot generate text");
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
    Live live{add->stream, Sampler(add->request.sampling), IncrementalDecoder(tokenizer_, add->render_special),
              add->render_special, std::move(add->stop), add->logprobs, {}, {}, {}, Live::Gate::kOpen, {}, {},
              false, true};
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
    live.prompt_logprobs = add->prompt_logprobs;
    const int64_t n_prompt = add->request.num_prompt_tokens();
    if (add->beam_search) {
      live.beams = std::make_unique<BeamGroup>(BeamSearch(*add->beam_search, n_prompt, add->request.max_tokens));
      live.beams->ids.push_back(add->request.id);
      if (!live.stop.empty()) live.beams->texts.push_back({IncrementalDecoder(tokenizer_, live.render_special), {}});
      beam_owner_[add->request.id] = id;
    }
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
  }
  g.ids.clear();
  return true;
}

void Engine::emit(const std::shared_ptr<RequestStream>& stream, RequestOutput out) {
  emitted_.emplace_back(stream, std::move(out));
}

std::vector<RequestOutput> Engine::end_step() {
  publish_stats();
  std::vector<RequestOutput> outputs;
  outputs.reserve(emitted_.size());
  for (auto& [stream, out] : emitted_) {
    if (out.finished && finished_listener_) finished_listener_(out);
    stream->push(out);
    outputs.push_back(std::move(out));
  }
  emitted_.clear();
  return outputs;
}

void Engine::finish(const std::string& id, RequestStatus status, RequestOutput out) {
  auto it = live_.find(id);
  if (it == live_.end()) return;
  Live& live = it->second;
  if (live.beams)
    for (const std::string& beam : live.beams->ids) beam_owner_.erase(beam);  // released by the caller
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

std::string Engine::release_text(Live& live, bool final, std::string* stop_at) {
  if (final) live.held += live.decoder.flush();
  std::string& held = live.held;
  // The earliest stop string wins (the longest, if several start there).
  size_t best = std::string::npos;
  for (const std::string& s : live.stop) {
    const size_t p = held.find(s);
    if (p != std::string::npos && (p < best || (p == best && s.size() > stop_at->size()))) {
      best = p;
      *stop_at = s;
    }
  }
  if (best != std::string::npos) {
    std::string out = held.substr(0, best);
    held.clear();
    return out;
  }
  // Hold back the longest tail that is the start of some stop string: the
  // next tokens could complete it. Everything before it can never be part of
  // a match, since any match would have to start inside the held tail.
  size_t keep = 0;
  if (!final) {
    for (const std::string& s : live.stop) {
      for (size_t k = std::min(s.size() - 1, held.size()); k > keep; --k)
        if (held.compare(held.size() - k, k, s, 0, k) == 0) {
          keep = k;
          break;
        }
    }
  }
  std::string out = held.substr(0, held.size() - keep);
  held.erase(0, held.size() - keep);
  return out;
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

Status Engine::apply_maybe_thinking_mask(Live& live, float* logits, int64_t n_vocab) {
  const std::vector<int32_t>& cont = start_continuations(live.reasoning->start)[live.gate_text.size()];
  gate_mask_.assign(static_cast<size_t>((n_vocab + 31) / 32), 0u);
  if (live.gate_grammar_ok) {
    // What was written so far (a piece of the marker, or nothing) is also a
    // valid start of the answer: the answer may go on from here.
    auto mask = live.matcher->compute_mask();
    if (!mask) return mask.error();
    gate_grammar_mask_.assign(mask->begin(), mask->end());  // for advance_grammar, right after sampling
    const size_t words = std::min(mask->size(), gate_mask_.size());
    for (size_t w = 0; w < words; ++w) gate_mask_[w] = (*mask)[w];
  }
  for (int32_t id : cont)
    if (id < n_vocab) gate_mask_[static_cast<size_t>(id) / 32] |= 1u << (id % 32);
  apply_token_mask(gate_mask_, static_cast<int32_t>(n_vocab), logits, n_vocab);
  return {};
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
        if (token_allowed(gate_grammar_mask_, token)) {
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
  std::vector<Command> cmds;
  {
    std::lock_guard<std::mutex> lock(cmd_mu_);
    cmds.swap(commands_);
  }
  for (Command& c : cmds) apply(c);
  end_leases();
  // Loads of aborted requests still hold their blocks: schedule() collects them too.
  if (!scheduler_.has_unfinished_requests() && !scheduler_.has_loads_in_flight()) return end_step();

  const SchedulerOutput out = scheduler_.schedule();
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
  if (out.empty()) return end_step();

  const auto t0 = std::chrono::steady_clock::now();
  std::vector<float>& logits = runner_->execute(out);
  forward_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double t_token = now_seconds();

  // Sample, one request at a time, each from its own random stream. A
  // request that verifies drafts samples its rows in order while the token
  // sampled equals the draft at its position (speculative.h).
  const int64_t n_vocab = runner_->n_vocab();
  sampled_.resize(out.scheduled.size());
  std::vector<std::vector<SampledLogprobs>> step_logprobs(out.scheduled.size());
  grammar_errors_.assign(out.scheduled.size(), std::string());
  std::vector<int64_t> beam_rows(out.scheduled.size(), -1);  // a beam's row, chosen from by its group
  std::vector<std::string> pooled_done;  // pooled requests whose one pass this step was
  int64_t row = 0;
  for (size_t i = 0; i < out.scheduled.size(); ++i) {
    const ScheduledRequest& s = out.scheduled[i];
    std::vector<int32_t>& tokens = sampled_[i];
    tokens.clear();
    if (const int64_t prompt_rows = ModelRunner::prompt_logit_rows(s); prompt_rows > 0) {
      score_prompt(live_.at(s.request_id), s, scheduler_.find(s.request_id)->prompt_token_ids,
                   logits.data() + row * n_vocab, prompt_rows);
      row += prompt_rows;
    }
    if (!s.sample) continue;
    if (beam_owner_.count(s.request_id)) {
      beam_rows[i] = row;
      row += s.num_draft_tokens + 1;
      continue;
    }
    Live& live = live_.at(s.request_id);
    const Request& r = *scheduler_.find(s.request_id);
    if (r.pooled) {  // its row is its output: nothing is sampled (finished after update, below)
      live.pooled.assign(logits.data() + row * n_vocab, logits.data() + (row + 1) * n_vocab);
      pooled_done.push_back(s.request_id);
      ++row;
      continue;
    }
    assert(!(live.matcher && s.num_draft_tokens > 0));  // requests with a grammar do not speculate
    const int32_t* drafts = s.token_ids.data() + (s.num_new_tokens - s.num_draft_tokens);
    for (int64_t j = 0; j <= s.num_draft_tokens; ++j) {
      float* lg = logits.data() + row++ * n_vocab;
      // Row j follows draft j - 1: used only while every draft so far was accepted.
      if (j > 0 && (static_cast<int64_t>(tokens.size()) != j || tokens.back() != drafts[j - 1])) continue;
      // Structured output: tokens the grammar does not allow get -inf before
      // anything else sees the row, so every sampling parameter (penalties,
      // temperature, top-k/p, min-p, seed) works on the allowed tokens only.
      // While the output thinks (Live::Gate), the grammar waits for its end.
      if (live.matcher && live.gate == Live::Gate::kOpen) {
        auto mask = live.matcher->compute_mask();
        if (mask) {
          apply_token_mask(*mask, live.matcher->n_vocab(), lg, n_vocab);
        } else {
          grammar_errors_[i] = mask.error().message;  // the request ends after update()
        }
      } else if (live.matcher && live.gate == Live::Gate::kMaybe) {
        if (Status st = apply_maybe_thinking_mask(live, lg, n_vocab); !st) grammar_errors_[i] = st.error().message;
      }
      // Logprobs describe the model's distribution before the sampler's
      // penalties and temperature (which change the row in place, so the values
      // are kept first) but after the grammar's mask: for a structured output
      // they are the constrained distribution, renormalised over the allowed
      // tokens, and disallowed tokens never appear among the alternatives.
      if (live.logprobs >= 0) logprob_row_.assign(lg, lg + n_vocab);
      // Penalties see the accepted drafts as output, as the plain steps would have.
      const std::vector<int32_t>* output = &r.output_token_ids;
      if (!tokens.empty()) {
        spec_output_.assign(r.output_token_ids.begin(), r.output_token_ids.end());
        spec_output_.insert(spec_output_.end(), tokens.begin(), tokens.end());
        output = &spec_output_;
      }
      const int32_t token = live.sampler.sample(lg, n_vocab, r.prompt_token_ids, *output);
      tokens.push_back(token);
      if (live.matcher && grammar_errors_[i].empty()) {
        if (Status st = advance_grammar(live, token); !st) grammar_errors_[i] = st.error().message;
      }
      if (live.logprobs >= 0) {
        SampledLogprobs& lp = step_logprobs[i].emplace_back();
        lp.token = token;
        lp.logprob = token_logprob(logprob_row_.data(), n_vocab, token);
        lp.rank = token_rank(logprob_row_.data(), n_vocab, token);
        lp.top = top_logprobs(logprob_row_.data(), n_vocab, live.logprobs);
        if (live.matcher)  // fewer tokens may be allowed than alternatives asked for
          std::erase_if(lp.top, [](const TokenLogprob& t) { return std::isinf(t.logprob); });
      }
    }
    if (s.num_draft_tokens > 0) {
      const int64_t accepted = static_cast<int64_t>(tokens.size()) - 1;
      if (live.draft_length) live.draft_length->verified(accepted, s.num_draft_tokens);
      if (live.ngram) live.ngram->verified(accepted, tokens.back());
      live.metrics.speculative.record(s.num_draft_tokens, accepted);
      spec_stats_.record(s.num_draft_tokens, accepted);
    }
  }

  const std::vector<BeamAdvance> advanced = select_beams(out, logits, beam_rows);

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
    return end_step();
  }

  size_t k = 0;  // updates come in the order of out.scheduled
  for (RequestUpdate& u : *updates) {
    while (out.scheduled[k].request_id != u.request_id) ++k;
    if (beam_owner_.count(u.request_id)) continue;  // a beam: its group's search follows below
    Live& live = live_.at(u.request_id);
    RequestOutput o;
    o.request_id = u.request_id;
    o.prompt_logprobs = std::move(live.pending_prompt_logprobs);
    live.pending_prompt_logprobs.clear();
    for (size_t t = 0; t < u.new_token_ids.size(); ++t) {
      o.token_times.push_back(t_token);
      live.metrics.token_times.push_back(t_token);
      if (live.metrics.first_token_time == 0.0) live.metrics.first_token_time = t_token;
      live.metrics.last_token_time = t_token;
      ++live.metrics.num_output_tokens;
      ++generation_tokens_;
      // The token that stopped the request (the scheduler's kFinishedStopped:
      // EOS, an end-of-generation or stop token) is not text; rendered, "</s>"
      // would end the answer (vLLM leaves it out of the text as well).
      const bool stop_token = u.status == RequestStatus::kFinishedStopped && t + 1 == u.new_token_ids.size();
      if (live.render_special && stop_token) continue;
      live.held += live.decoder.push(u.new_token_ids[t]);
      // Several tokens (accepted drafts): a stop string completed by one of
      // them ends the request at that token, as a plain step would have.
      if (t + 1 < u.new_token_ids.size() && holds_stop_string(live)) {
        u.new_token_ids.resize(t + 1);
        u.status = RequestStatus::kRunning;  // the stop string decides below
      }
    }
    if (live.logprobs >= 0) {
      step_logprobs[k].resize(u.new_token_ids.size());
      for (SampledLogprobs& lp : step_logprobs[k]) o.logprobs.push_back(std::move(lp));
    }
    o.token_ids = std::move(u.new_token_ids);

    if (!grammar_errors_[k].empty()) {
      // The grammar engine failed (e.g. a step ran out of its resource limits):
      // end the request with the reason rather than continue unconstrained.
      if (!is_finished(u.status)) (void)scheduler_.finish_request(u.request_id, RequestStatus::kFinishedAborted);
      std::string unused;
      o.text = release_text(live, true, &unused);
      o.error = std::move(grammar_errors_[k]);
      finish(u.request_id, RequestStatus::kFinishedAborted, std::move(o));
      continue;
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
    o.text = release_text(live, finished, &stop_at);
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
  // Pooled requests end with their step.
  for (const std::string& id : pooled_done) {
    if (!scheduler_.find(id)) continue;
    (void)scheduler_.finish_request(id, RequestStatus::kFinishedStopped);
    Live& live = live_.at(id);
    live.metrics.first_token_time = live.metrics.last_token_time = t_token;
    RequestOutput o;
    o.embedding = std::move(live.pooled);
    finish(id, RequestStatus::kFinishedStopped, std::move(o));
  }
  apply_beams(advanced, t_token);
  propose_drafts(*updates);
  return end_step();
}

void Engine::score_prompt(Live& live, const ScheduledRequest& s, const std::vector<int32_t>& prompt,
                          const float* logits, int64_t rows) {
  const int64_t n_vocab = runner_->n_vocab();
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t target = s.num_computed_tokens + r + 1;  // the prompt token this row scores
    if (target != live.prompt_tokens_scored) continue;     // scored before a preemption
    const float* lg = logits + r * n_vocab;
    SampledLogprobs& lp = live.pending_prompt_logprobs.emplace_back();
    lp.token = prompt[target];
    lp.logprob = token_logprob(lg, n_vocab, lp.token);
    lp.rank = token_rank(lg, n_vocab, lp.token);
    lp.top = top_logprobs(lg, n_vocab, live.prompt_logprobs);
    ++live.prompt_tokens_scored;
  }
}

bool Engine::holds_stop_string(const Live& live) {
  for (const std::string& stop : live.stop)
    if (live.held.find(stop) != std::string::npos) return true;
  return false;
}

void Engine::propose_drafts(const std::vector<RequestUpdate>& updates) {
  const SpeculativeConfig& spec = config_.speculative;
  if (!spec.enabled()) return;
  if (spec.disable_by_batch_size > 0 && scheduler_.num_running() >= spec.disable_by_batch_size) return;
  std::vector<DraftInput> inputs;
  for (const RequestUpdate& u : updates) {
    const Request* r = scheduler_.find(u.request_id);
    if (!r || r->status != RequestStatus::kRunning) continue;
    auto it = live_.find(u.request_id);
    // A grammar's mask follows each token, a beam search picks each beam's
    // token itself: no drafts for either.
    if (it == live_.end() || it->second.matcher || it->second.beams) continue;
    Live& live = it->second;
    if (!live.draft_length) live.draft_length.emplace(spec.num_speculative_tokens, spec.first_drafts());
    const int32_t n = live.draft_length->next();
    if (n == 0) continue;  // paused
    inputs.push_back({&r->id, r->all_token_ids, n, r->cache_key});
  }
  if (inputs.empty()) return;
  if (drafter_) {
    // Every request's drafts in the same batched passes of the draft model.
    std::vector<std::vector<int32_t>> drafts = drafter_->propose(inputs);
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (!drafts[i].empty()) {
        scheduler_.set_draft_tokens(*inputs[i].request_id, std::move(drafts[i]));
      } else {
        // The draft was unsure of its first token: its pass bought nothing,
        // so back off as after a verification that accepted none (the
        // n-gram proposer's empty proposal costs nothing and does not).
        live_.at(*inputs[i].request_id).draft_length->verified(0, inputs[i].max_drafts);
      }
    }
    return;
  }
  for (const DraftInput& in : inputs) {
    Live& live = live_.at(*in.request_id);
    if (!live.ngram) live.ngram.emplace(spec.prompt_lookup_min, spec.prompt_lookup_max);
    const int64_t num_prompt_tokens = static_cast<int64_t>(scheduler_.find(*in.request_id)->prompt_token_ids.size());
    std::vector<int32_t> drafts = live.ngram->propose(in.tokens, num_prompt_tokens, in.max_drafts);
    if (!drafts.empty()) scheduler_.set_draft_tokens(*in.request_id, std::move(drafts));
  }
}

Status Engine::check_invariants() const {
  if (Status s = scheduler_.check_invariants(); !s) return s;
  if (offload_)
    if (Status s = offload_->check_invariants(); !s) return make_error("KV offload: " + s.error().message);
  if (!drafter_) return {};
  if (Status s = drafter_->check_invariants(); !s) return make_error("the draft model's KV cache: " + s.error().message);
  for (const std::string& id : drafter_->sequence_ids())
    if (!scheduler_.find(id))
      return make_error("the draft model keeps KV for request '" + id + "', which has ended");
  return {};
}

namespace {

// Where the earliest of `stops` begins in `text` at or after `from` (the
// longest if several begin there), or npos; *which is set to it.
size_t find_stop_string(const std::string& text, const std::vector<std::string>& stops, size_t from,
                        std::string* which) {
  size_t best = std::string::npos;
  for (const std::string& stop : stops) {
    const size_t p = text.find(stop, from);
    if (p != std::string::npos && (p < best || (p == best && stop.size() > which->size()))) {
      best = p;
      *which = stop;
    }
  }
  return best;
}

}  // namespace

std::vector<Engine::BeamAdvance> Engine::select_beams(const SchedulerOutput& out, const std::vector<float>& logits,
                                                      const std::vector<int64_t>& rows) {
  std::vector<BeamAdvance> advanced;
  std::unordered_map<std::string, size_t> scheduled_at;  // beams with a row this step
  std::vector<std::string> groups;                       // their requests, in the order of the step
  for (size_t i = 0; i < out.scheduled.size(); ++i) {
    if (rows[i] < 0) continue;
    scheduled_at[out.scheduled[i].request_id] = i;
    const std::string& request_id = beam_owner_.at(out.scheduled[i].request_id);
    if (std::find(groups.begin(), groups.end(), request_id) == groups.end()) groups.push_back(request_id);
  }
  const int64_t n_vocab = runner_->n_vocab();
  for (const std::string& request_id : groups) {
    Live& live = live_.at(request_id);
    BeamGroup& g = *live.beams;
    // A group advances only on a step that gave every live beam a row, so
    // its beams always have the same length (the others' rows are not used).
    if (!std::all_of(g.ids.begin(), g.ids.end(), [&](const std::string& b) { return scheduled_at.count(b) > 0; }))
      continue;
    std::vector<std::vector<TokenLogprob>> candidates;
    for (const std::string& b : g.ids)
      candidates.push_back(top_logprobs(logits.data() + rows[scheduled_at.at(b)] * n_vocab, n_vocab,
                                        g.search.candidates_per_beam()));
    const Request& first = *scheduler_.find(g.ids[0]);  // the beams share prompt and stop conditions
    std::string unused;
    const auto ends = [&](int32_t beam, int32_t token) {
      if (first.is_stop_token(token)) return BeamEnd::kStopToken;
      if (!g.texts.empty()) {
        // A new match ends in the new token's text (the beam's text had none).
        BeamGroup::Text t = g.texts[beam];
        const std::string piece = t.decoder.push(token);
        if (!piece.empty()) {
          size_t longest = 0;
          for (const std::string& stop : live.stop) longest = std::max(longest, stop.size());
          const std::string text = t.text + piece;
          const size_t from = t.text.size() >= longest ? t.text.size() - (longest - 1) : 0;
          if (find_stop_string(text, live.stop, from, &unused) != std::string::npos) return BeamEnd::kStopString;
        }
      }
      return BeamEnd::kNone;
    };
    BeamAdvance a{request_id, g.search.step(candidates, ends)};
    // Each beam's first child is its own next token; update() appends it.
    std::vector<bool> continued(g.ids.size(), false);
    for (const BeamChild& c : a.children)
      if (!continued[c.parent]) {
        continued[c.parent] = true;
        sampled_[scheduled_at.at(g.ids[c.parent])] = {c.token};
      }
    generation_tokens_ += static_cast<int64_t>(g.ids.size());
    advanced.push_back(std::move(a));
  }
  return advanced;
}

void Engine::apply_beams(const std::vector<BeamAdvance>& advanced, double t_token) {
  for (const BeamAdvance& a : advanced) {
    auto it = live_.find(a.request_id);
    if (it == live_.end()) continue;
    Live& live = it->second;
    BeamGroup& g = *live.beams;
    std::vector<bool> continued(g.ids.size(), false);
    for (const BeamChild& c : a.children) continued[c.parent] = true;
    // Dropped first: a group never holds more than beam_width beams.
    for (size_t p = 0; p < g.ids.size(); ++p)
      if (!continued[p]) {
        scheduler_.drop_beam(g.ids[p]);
        beam_owner_.erase(g.ids[p]);
      }
    std::fill(continued.begin(), continued.end(), false);
    std::vector<std::string> ids;
    std::vector<BeamGroup::Text> texts;
    std::string error;
    for (const BeamChild& c : a.children) {
      if (!continued[c.parent]) {
        continued[c.parent] = true;
        ids.push_back(g.ids[c.parent]);
      } else {
        ids.push_back(a.request_id + kBeamSuffix + str(g.next_beam++));
        if (Status st = scheduler_.fork(g.ids[c.parent], ids.back(), c.token); !st) {
          error = st.error().message;  // a bug: end the search rather than go on without a beam
          ids.pop_back();
          break;
        }
        beam_owner_[ids.back()] = a.request_id;
      }
      if (!g.texts.empty()) {
        texts.push_back(g.texts[c.parent]);
        texts.back().text += texts.back().decoder.push(c.token);
      }
    }
    // The children live on; parents without children were dropped above.
    g.ids = std::move(ids);
    g.texts = std::move(texts);
    live.metrics.token_times.push_back(t_token);
    if (live.metrics.first_token_time == 0.0) live.metrics.first_token_time = t_token;
    live.metrics.last_token_time = t_token;
    if (!error.empty()) {
      release(a.request_id);
      RequestOutput o;
      o.error = "internal error: " + error;
      finish(a.request_id, RequestStatus::kFinishedAborted, std::move(o));
    } else if (g.search.done()) {
      finish_beam_search(a.request_id);
    }
  }
}

void Engine::finish_beam_search(const std::string& request_id) {
  Live& live = live_.at(request_id);
  RequestOutput out;
  for (const Beam& b : live.beams->search.finished()) {
    BeamOutput beam;
    beam.token_ids = b.token_ids;
    beam.cumulative_logprob = b.cumulative_logprob;
    beam.status = b.end == BeamEnd::kLength ? RequestStatus::kFinishedLength : RequestStatus::kFinishedStopped;
    // The text a request with these tokens would have emitted (run_step).
    IncrementalDecoder decoder(tokenizer_, live.render_special);
    for (size_t t = 0; t < b.token_ids.size(); ++t) {
      if (live.render_special && b.end == BeamEnd::kStopToken && t + 1 == b.token_ids.size()) continue;
      beam.text += decoder.push(b.token_ids[t]);
    }
    beam.text += decoder.flush();
    if (const size_t at = find_stop_string(beam.text, live.stop, 0, &beam.stop_string); at != std::string::npos) {
      beam.text.resize(at);
      beam.status = RequestStatus::kFinishedStopped;
    }
    out.beams.push_back(std::move(beam));
  }
  RequestStatus status = RequestStatus::kFinishedLength;
  if (!out.beams.empty()) {
    out.token_ids = out.beams[0].token_ids;
    out.text = out.beams[0].text;
    out.stop_string = out.beams[0].stop_string;
    status = out.beams[0].status;
  }
  live.metrics.num_output_tokens = static_cast<int64_t>(out.token_ids.size());
  release(request_id);  // every beam has been dropped already; this forgets the group
  finish(request_id, status, std::move(out));
}

bool Engine::has_pending_work() {
  std::lock_guard<std::mutex> lock(cmd_mu_);
  return !commands_.empty() || scheduler_.has_unfinished_requests();
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
        return stop_requested_ || !commands_.empty() || load_finished_ ||
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
  s.kv_bytes_per_token = KVCache::bytes_per_token(model_.config(), s.kv_cache_dtype);
  s.kv_capacity_tokens = kv_tokens_for_blocks(runner_->kv_cache().layout(), s.kv_total_blocks);
  s.kv_state_slots = runner_->kv_cache().n_state_slots();
  s.kv_state_bytes_per_sequence = runner_->kv_cache().layout().state_slot_bytes();
  s.kv_state_bytes = static_cast<int64_t>(runner_->kv_cache().state_bytes());
  s.requests_added = requests_added_;
  s.prompt_tokens = prompt_tokens_;
  s.computed_prompt_tokens = computed_prompt_tokens_;
  s.generation_tokens = generation_tokens_;
  s.computed_tokens = computed_tokens_;
  s.forward_seconds = forward_seconds_;
  if (drafter_) s.draft_forward_seconds = drafter_->forward_seconds();
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
