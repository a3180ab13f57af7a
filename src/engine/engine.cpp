#include "engine/engine.h"

#include <algorithm>
#include <cassert>
#include <chrono>
#include <cmath>

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
  const int64_t max_model_len =
      config.max_model_len > 0 ? config.max_model_len : model.config().context_length;

  ModelRunnerConfig rc;
  rc.block_size = config.block_size;
  rc.kv_cache_bytes = config.kv_cache_bytes;
  rc.kv_cache_memory_fraction = config.kv_cache_memory_fraction;
  rc.warm_up = config.warm_up;
  // More blocks than every running request at full length needs would only
  // ever hold cached prefixes; a budget given as a fraction of memory stops there.
  const KVLayout kv_layout = KVLayout::plan(model.config());
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
           .group_windows = kv_layout.group_windows};
  if (Status s = sc.validate(); !s) return s.error();
  EngineConfig effective = config;
  effective.max_model_len = max_model_len;
  return std::unique_ptr<Engine>(new Engine(model, effective, sc, std::move(*runner)));
}

Engine::Engine(Model& model, const EngineConfig& config, const SchedulerConfig& sched,
               std::unique_ptr<ModelRunner> runner)
    : model_(model),
      tokenizer_(model.tokenizer()),
      config_(config),
      runner_(std::move(runner)),
      scheduler_(sched) {
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
    scheduler_.abort(id);
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
  std::unique_ptr<GrammarMatcher> matcher;
  if (p.grammar) {
    if (p.grammar->n_vocab() > n_vocab)
      return make_error("the grammar was compiled for a vocabulary of " + str(p.grammar->n_vocab()) +
                        " tokens; the model has " + str(n_vocab));
    auto m = p.grammar->new_matcher();  // on the caller's thread, not the loop's
    if (!m) return m.error();
    matcher = std::move(*m);
  }

  Request r;
  r.prompt_token_ids = std::move(p.prompt_token_ids);
  r.sampling = p.sampling;
  r.max_tokens = p.max_tokens;
  if (tokenizer_.eos_id() >= 0) r.eos_token_id = tokenizer_.eos_id();
  r.stop_token_ids = std::move(p.stop_token_ids);
  // Every end-of-generation token (EOS, EOT, <|im_end|>, ...) stops, not just EOS.
  if (!p.ignore_eos) r.stop_token_ids.insert(r.stop_token_ids.end(), eog_tokens_.begin(), eog_tokens_.end());
  r.ignore_eos = p.ignore_eos;
  r.cache_salt = std::move(p.cache_salt);
  r.arrival_time = arrival;
  r.id = "pending";  // validated before an id is spent on it
  // The scheduler's config never changes after construction: safe to read here.
  if (Status s = Scheduler::validate_request(r, scheduler_.config()); !s) return s.error();

  Handle h;
  {
    std::lock_guard<std::mutex> lock(cmd_mu_);
    r.id = p.request_id.empty() ? str(static_cast<int64_t>(next_id_++)) : std::move(p.request_id);
    h.request_id = r.id;
    h.stream = std::make_shared<RequestStream>(r.id);
    commands_.emplace_back(AddCommand{std::move(r), h.stream, std::move(p.stop), std::max(-1, p.logprobs),
                                      std::move(matcher)});
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
    const std::string id = add->request.id;
    if (live_.count(id)) {  // a caller-chosen id already in use: refuse this one only
      RequestOutput out;
      out.request_id = id;
      out.finished = true;
      out.status = RequestStatus::kFinishedAborted;
      out.error = "request id '" + id + "' is already in use";
      emit(add->stream, std::move(out));
      return;
    }
    Live live{add->stream, Sampler(add->request.sampling), IncrementalDecoder(tokenizer_),
              std::move(add->stop), add->logprobs, {}, {}, {}};
    live.matcher = std::move(add->matcher);
    live.metrics.arrival_time = add->request.arrival_time;
    live.metrics.num_prompt_tokens = add->request.num_prompt_tokens();
    const int64_t n_prompt = add->request.num_prompt_tokens();
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
    if (scheduler_.abort(id)) finish(id, RequestStatus::kFinishedAborted, RequestOutput{});
  }
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
  out.request_id = id;
  out.finished = true;
  out.status = status;
  live.metrics.finished_time = now_seconds();
  out.metrics = std::move(live.metrics);
  emit(live.stream, std::move(out));
  live_.erase(it);
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
  if (!scheduler_.has_unfinished_requests()) return end_step();

  const SchedulerOutput out = scheduler_.schedule();
  const double t_scheduled = now_seconds();
  for (const std::string& id : out.preempted_request_ids) ++live_.at(id).metrics.num_preemptions;
  for (const ScheduledRequest& s : out.scheduled) {
    RequestMetrics& m = live_.at(s.request_id).metrics;
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

  // Sample, one request at a time, each from its own random stream.
  const int64_t n_vocab = runner_->n_vocab();
  sampled_.assign(out.scheduled.size(), -1);
  std::vector<SampledLogprobs> step_logprobs(out.scheduled.size());
  grammar_errors_.assign(out.scheduled.size(), std::string());
  int64_t row = 0;
  for (size_t i = 0; i < out.scheduled.size(); ++i) {
    const ScheduledRequest& s = out.scheduled[i];
    if (!s.sample) continue;
    float* lg = logits.data() + row++ * n_vocab;
    Live& live = live_.at(s.request_id);
    const Request& r = *scheduler_.find(s.request_id);
    // Structured output: tokens the grammar does not allow get -inf before
    // anything else sees the row, so every sampling parameter (penalties,
    // temperature, top-k/p, min-p, seed) works on the allowed tokens only.
    if (live.matcher) {
      auto mask = live.matcher->compute_mask();
      if (mask) {
        apply_token_mask(*mask, live.matcher->n_vocab(), lg, n_vocab);
      } else {
        grammar_errors_[i] = mask.error().message;  // the request ends after update()
      }
    }
    // Logprobs describe the model's distribution before the sampler's
    // penalties and temperature (which change the row in place, so the values
    // are kept first) but after the grammar's mask: for a structured output
    // they are the constrained distribution, renormalised over the allowed
    // tokens, and disallowed tokens never appear among the alternatives.
    if (live.logprobs >= 0) logprob_row_.assign(lg, lg + n_vocab);
    sampled_[i] = live.sampler.sample(lg, n_vocab, r.prompt_token_ids, r.output_token_ids);
    if (live.matcher && grammar_errors_[i].empty()) {
      if (Status st = live.matcher->commit(sampled_[i]); !st) grammar_errors_[i] = st.error().message;
    }
    if (live.logprobs >= 0) {
      SampledLogprobs& lp = step_logprobs[i];
      lp.token = sampled_[i];
      lp.logprob = token_logprob(logprob_row_.data(), n_vocab, sampled_[i]);
      lp.top = top_logprobs(logprob_row_.data(), n_vocab, live.logprobs);
      if (live.matcher)  // fewer tokens may be allowed than alternatives asked for
        std::erase_if(lp.top, [](const TokenLogprob& t) { return std::isinf(t.logprob); });
    }
  }

  auto updates = scheduler_.update(out, sampled_);
  if (!updates) {
    // The step does not match the scheduler's state (a bug): end its requests
    // rather than let them continue from a corrupt state.
    for (const ScheduledRequest& s : out.scheduled) {
      if (!scheduler_.abort(s.request_id)) continue;
      RequestOutput o;
      o.error = "internal error: " + updates.error().message;
      finish(s.request_id, RequestStatus::kFinishedAborted, std::move(o));
    }
    return end_step();
  }

  size_t k = 0;  // updates come in the order of out.scheduled
  for (RequestUpdate& u : *updates) {
    while (out.scheduled[k].request_id != u.request_id) ++k;
    Live& live = live_.at(u.request_id);
    RequestOutput o;
    o.request_id = u.request_id;
    for (int32_t token : u.new_token_ids) {
      o.token_times.push_back(t_token);
      live.metrics.token_times.push_back(t_token);
      if (live.metrics.first_token_time == 0.0) live.metrics.first_token_time = t_token;
      live.metrics.last_token_time = t_token;
      ++live.metrics.num_output_tokens;
      ++generation_tokens_;
      live.held += live.decoder.push(token);
    }
    o.token_ids = std::move(u.new_token_ids);
    if (live.logprobs >= 0) o.logprobs.push_back(std::move(step_logprobs[k]));

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
  return end_step();
}

bool Engine::has_pending_work() {
  std::lock_guard<std::mutex> lock(cmd_mu_);
  return !commands_.empty() || scheduler_.has_unfinished_requests();
}

void Engine::loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(cmd_mu_);
      cmd_cv_.wait(lock, [&] {
        return stop_requested_ || !commands_.empty() || scheduler_.has_unfinished_requests();
      });
      if (stop_requested_) return;
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
  s.requests_added = requests_added_;
  s.prompt_tokens = prompt_tokens_;
  s.computed_prompt_tokens = computed_prompt_tokens_;
  s.generation_tokens = generation_tokens_;
  s.computed_tokens = computed_tokens_;
  s.forward_seconds = forward_seconds_;
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_ = std::move(s);
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return stats_;
}

}  // namespace inferd
