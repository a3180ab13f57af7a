#include "engine/scheduler.h"

#include <algorithm>
#include <cassert>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <unordered_set>

namespace inferd {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

Status SchedulerConfig::validate() const {
  if (max_num_batched_tokens < 1) return make_error("max_num_batched_tokens must be at least 1");
  if (max_num_seqs < 1) return make_error("max_num_seqs must be at least 1");
  if (long_prefill_token_threshold < 0) return make_error("long_prefill_token_threshold must be >= 0");
  if (max_model_len < 0) return make_error("max_model_len must be >= 0");
  if (batches_in_flight < 1) return make_error("batches_in_flight must be at least 1");
  if (!(context_positions_per_token >= 0.0)) return make_error("context_positions_per_token must be >= 0");
  if (kv.n_blocks < 2) return make_error("the KV cache needs at least 2 blocks (one is reserved)");
  if (kv.block_size < 1) return make_error("the KV block size must be at least 1");
  return {};
}

Scheduler::Scheduler(const SchedulerConfig& config) : config_(config), kv_([&] {
  if (Status s = config.validate(); !s) {
    std::fprintf(stderr, "Scheduler: invalid config: %s\n", s.error().message.c_str());
    std::abort();
  }
  return config.kv;
}()) {}

Status Scheduler::validate_request(const Request& r, const SchedulerConfig& config) {
  if (r.id.empty()) return make_error("the request id is empty");
  if (r.prompt_token_ids.empty()) return make_error("the prompt is empty");
  if (r.max_tokens < 1) return make_error("max_tokens must be at least 1");
  if (Status s = r.sampling.validate(); !s) return s;
  const int64_t n_prompt = r.num_prompt_tokens();
  if (config.max_model_len > 0 && n_prompt + r.max_tokens > config.max_model_len)
    return make_error("the prompt (" + str(n_prompt) + " tokens) plus max_tokens (" +
                      str(r.max_tokens) + ") exceeds the model length of " +
                      str(config.max_model_len) + " tokens");
  // The last sampled token is never fed back, so a request needs slots for at
  // most prompt + max_tokens - 1 tokens; with that many it can always run
  // alone, which is what makes preemption terminate.
  const int64_t block_size = config.kv.block_size;
  const int64_t blocks_needed =
      kv::max_blocks_held(config.kv, n_prompt + r.max_tokens - 1, config.max_request_step_tokens());
  const int64_t usable = int64_t{config.kv.n_blocks} - 1;  // one block is reserved
  if (blocks_needed > usable)
    return make_error("the prompt (" + str(n_prompt) + " tokens) plus max_tokens (" +
                      str(r.max_tokens) + ") needs " + str(blocks_needed) + " KV blocks of " +
                      str(block_size) + " tokens, but the cache has only " + str(usable));
  if (r.pooled && n_prompt > config.max_num_batched_tokens)
    return make_error("the input (" + str(n_prompt) + " tokens) exceeds max_num_batched_tokens (" +
                      str(config.max_num_batched_tokens) + "): it runs in one step");
  if (r.beam_width < 1) return make_error("the beam width must be at least 1");
  if (r.beam_width > 1 && r.beam_group.empty()) return make_error("a beam width is given without a beam group");
  if (!r.beam_group.empty() && config.kv.n_state_slots > 0)
    return make_error("beam search is not supported for models with recurrent layers (Gated DeltaNet) yet: "
                      "beams would each need a copy of the recurrent state");
  if (!r.beam_group.empty()) {
    // A group advances only on a step that runs all its beams: they must fit
    // one step, and (counting no shared block) the cache, so that the group
    // alone always runs, as a request alone does.
    if (r.beam_width > config.max_num_seqs)
      return make_error("the beam width (" + str(r.beam_width) + ") exceeds max_num_seqs (" +
                        str(config.max_num_seqs) + "): every beam runs at once");
    if (r.beam_width > config.max_num_batched_tokens)
      return make_error("the beam width (" + str(r.beam_width) + ") exceeds max_num_batched_tokens (" +
                        str(config.max_num_batched_tokens) + "): every beam runs at once");
    if (blocks_needed * r.beam_width > usable)
      return make_error("the prompt (" + str(n_prompt) + " tokens) plus max_tokens (" + str(r.max_tokens) +
                        ") needs " + str(blocks_needed) + " KV blocks of " + str(block_size) + " tokens for each of " +
                        str(r.beam_width) + " beams, " + str(blocks_needed * r.beam_width) +
                        " in all, but the cache has only " + str(usable));
  }
  return {};
}

Status Scheduler::add_request(Request r) {
  if (Status s = validate_request(r, config_); !s) return s;
  if (requests_.count(r.id) || draining_.count(r.id))
    return make_error("a request with this id is already queued or running");

  auto req = std::make_unique<Request>(std::move(r));
  req->output_token_ids.clear();
  req->all_token_ids = req->prompt_token_ids;
  req->num_computed_tokens = 0;
  req->status = RequestStatus::kWaiting;
  req->num_cached_prompt_tokens = 0;
  req->num_preemptions = 0;
  req->kv_load_failed = false;
  req->cache_key = kv::hash_bytes(req->cache_salt);
  if (req->arrival_time == 0.0) req->arrival_time = now_seconds();
  waiting_.push_back(req.get());
  requests_.emplace(req->id, std::move(req));
  return {};
}

double SchedulerConfig::chunk_work(int64_t n, int64_t context) const {
  const double t = static_cast<double>(n);
  return t + (t * static_cast<double>(context) + t * (t + 1.0) / 2.0) / context_positions_per_token;
}

int64_t SchedulerConfig::chunk_tokens_within(double work, int64_t context) const {
  if (work < chunk_work(1, context)) return 0;
  // chunk_work(n) = a n^2 + b n: the positive root, then a step either way
  // for the rounding of the square root.
  const double a = 0.5 / context_positions_per_token;
  const double b = 1.0 + (static_cast<double>(context) + 0.5) / context_positions_per_token;
  auto n = static_cast<int64_t>((std::sqrt(b * b + 4.0 * a * work) - b) / (2.0 * a));
  n = std::max<int64_t>(n, 1);
  while (n > 1 && chunk_work(n, context) > work) --n;
  while (chunk_work(n + 1, context) <= work) ++n;
  return n;
}

int64_t Scheduler::tokens_to_schedule(const Request& r, int64_t num_computed, int64_t budget) const {
  int64_t n = r.num_tokens() - num_computed;
  if (r.pooled) return n <= budget ? n : 0;  // the whole input in one step, or wait for a step with room
  if (config_.long_prefill_token_threshold > 0) n = std::min(n, config_.long_prefill_token_threshold);
  // A prompt scored position by position returns a vocabulary-sized row per
  // token: a few at a time keep that memory bounded however long the prompt.
  if (r.needs_prompt_logits && num_computed < r.num_prompt_tokens()) n = std::min(n, kMaxPromptLogitRowsPerStep);
  // A chunk (more than a decode's one token) takes its share of the step's
  // chunk work; the step's first chunk gets at least one token.
  if (n > 1 && config_.context_positions_per_token > 0.0) {
    n = std::min(n, config_.chunk_tokens_within(chunk_work_left_, num_computed));
    if (n < 1 && !step_has_chunk_) n = 1;
  }
  return std::min(n, budget);
}

void Scheduler::add_scheduled(SchedulerOutput& out, const Request& r, int64_t n, int64_t n_drafts,
                              std::vector<int32_t> new_blocks, bool is_new, bool resumed,
                              int64_t num_cached, int32_t state_source) {
  ScheduledRequest s;
  s.request_id = r.id;
  s.num_computed_tokens = r.num_computed_tokens;
  s.num_new_tokens = n;
  s.num_draft_tokens = n_drafts;
  s.num_prompt_tokens = r.num_prompt_tokens();
  s.token_ids.assign(r.all_token_ids.begin() + r.num_computed_tokens,
                     r.all_token_ids.begin() + r.num_computed_tokens + (n - n_drafts));
  s.token_ids.insert(s.token_ids.end(), r.draft_token_ids.begin(), r.draft_token_ids.begin() + n_drafts);
  s.block_tables.resize(kv_.num_groups());
  for (int32_t g = 0; g < kv_.num_groups(); ++g) {
    const std::span<const int32_t> table = kv_.block_table(r.id, g);
    s.block_tables[g].assign(table.begin(), table.end());
  }
  s.new_block_ids = std::move(new_blocks);
  if (kv_.has_state_slots()) {
    s.state_slot = kv_.state_slot(r.id).value_or(-1);
    s.state_source = state_source;
    const int64_t drafts_from = r.num_computed_tokens + n - n_drafts;
    if (!r.pooled)
      s.state_saves = kv_.reserve_state_snapshots(r.id, r.num_computed_tokens, drafts_from, r.num_prompt_tokens());
    // The states before the first drafts, for taking rejected ones back out
    // of it (snapshots are of prompt positions, drafts follow outputs: never
    // the same place).
    for (int32_t i = 0; i < std::min<int64_t>(n_drafts, kv_.num_state_checkpoints()); ++i)
      s.state_saves.push_back({drafts_from + i, *kv_.state_checkpoint_slot(r.id, i)});
  }
  s.is_new = is_new;
  s.resumed = resumed;
  s.sample = r.num_computed_tokens + (n - n_drafts) == r.num_tokens();
  s.prompt_logits = r.needs_prompt_logits && r.num_computed_tokens < r.num_prompt_tokens() - 1;
  s.num_cached_tokens = num_cached;
  // A chunk's work (see tokens_to_schedule): more than one token, or fewer
  // than the request has left (a decode's token is neither). A request
  // preempted later in the step does not give it back: the step computes less.
  const int64_t chunk = n - n_drafts;
  if ((chunk > 1 || r.num_computed_tokens + chunk < r.num_tokens()) && config_.context_positions_per_token > 0.0) {
    chunk_work_left_ -= config_.chunk_work(chunk, r.num_computed_tokens);
    step_has_chunk_ = true;
  }
  out.total_num_scheduled_tokens += n;
  out.scheduled.push_back(std::move(s));
}

void Scheduler::preempt(Request& r) {
  kv_.free(r.id);
  r.draft_token_ids.clear();
  r.restore_state_checkpoint = -1;  // recomputed from the start
  r.num_computed_tokens = 0;
  r.status = RequestStatus::kPreempted;
  ++r.num_preemptions;
  ++stats_.preemptions;
  waiting_.push_front(&r);
}

int64_t Scheduler::running_seats() const {
  int64_t seats = 0;
  const std::string* group = nullptr;  // a group's beams are side by side
  for (const Request* r : running_) {
    if (r->beam_group.empty()) {
      ++seats;
    } else if (!group || *group != r->beam_group) {
      seats += r->beam_width;
    }
    group = r->beam_group.empty() ? nullptr : &r->beam_group;
  }
  return seats;
}

bool Scheduler::preempt_newest(const Request& needing, SchedulerOutput& out) {
  // The newest request not in a batch in flight (whose blocks are being
  // written): `needing` is not, so there is one.
  size_t end = running_.size();
  while (running_[end - 1]->in_flight) --end;
  std::vector<Request*> victims{running_[end - 1]};
  running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(--end));
  const std::string& group = victims[0]->beam_group;
  while (!group.empty() && end > 0 && running_[end - 1]->beam_group == group && !running_[end - 1]->in_flight) {
    victims.push_back(running_[end - 1]);
    running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(--end));
  }
  bool needing_went = false;
  for (Request* v : victims) {  // newest first: push_front keeps the group's order
    // A beam of the group already scheduled this step gives its tokens back
    // (its group is contiguous and newest, so it was the last scheduled).
    for (auto it = out.scheduled.begin(); it != out.scheduled.end(); ++it)
      if (it->request_id == v->id) {
        out.total_num_scheduled_tokens -= it->num_new_tokens;
        out.scheduled.erase(it);
        break;
      }
    preempt(*v);
    out.preempted_request_ids.push_back(v->id);
    needing_went = needing_went || v == &needing;
  }
  return needing_went;
}

void Scheduler::set_connector(kv::KVConnector* connector) {
  connector_ = connector;
  kv_.record_transitions(connector != nullptr);
}

void Scheduler::save_evictions() {
  if (!connector_) return;
  const std::vector<kv::BlockTransfer> evicted = kv_.take_evictions();
  if (!evicted.empty()) connector_->save_evicted(evicted);
}

std::optional<std::vector<int32_t>> Scheduler::allocate_admission(const Request& r, int64_t budget,
                                                                  kv::PrefixHit* hit, int64_t* n, bool may_defer,
                                                                  bool* deferred, std::string* wait_for) {
  const kv::PrefixCacheStats stats_before = kv_.prefix_cache_stats();
  // With the connector; then, if one of its blocks fails its checks (it drops
  // it), again with the pool's own hit from the start: a sliding-window group
  // may need blocks the longer hit had let go. A request whose deferred load
  // failed goes straight to the second.
  kv::KVConnector* first = r.kv_load_failed ? nullptr : connector_;
  for (kv::KVConnector* connector : {first, static_cast<kv::KVConnector*>(nullptr)}) {
    // Prompt logprobs need every prompt position computed (cached ones have no
    // logits), after a preemption too: such a request looks nothing up. The
    // blocks it computes are cached for others as usual.
    // A pooled request's output needs every position of its one pass.
    const bool compute_all = r.needs_prompt_logits || r.pooled;
    *hit = kv_.get_computed_blocks(compute_all ? std::span<const int32_t>{} : std::span(r.all_token_ids),
                                   r.cache_key, connector);
    *n = tokens_to_schedule(r, hit->num_tokens, budget);
    if (*n <= 0) return std::nullopt;
    std::vector<kv::BlockTransfer> loads;
    std::optional<std::vector<int32_t>> blocks = kv_.allocate_slots(r.id, 0, *n, *hit, nullptr, &loads);
    if (!blocks) return std::nullopt;
    save_evictions();  // before a load overwrites a block just evicted
    if (!hit->consulted_connector) return blocks;
    if (may_defer && !loads.empty())
      if (const std::string* owner = loading_owner_of(loads)) {
        kv_.free(r.id);
        kv_.restore_prefix_cache_stats(stats_before);
        *wait_for = *owner;
        return std::nullopt;
      }
    const std::optional<std::vector<bool>> loaded =
        connector->start_load(r.id, loads, hit->stopped_at_miss, may_defer && !loads.empty());
    if (!loaded) {
      // Counted when the request is admitted again, as a hit on the loaded blocks.
      kv_.restore_prefix_cache_stats(stats_before);
      loading_loads_[r.id] = std::move(loads);
      *deferred = true;
      return blocks;
    }
    if (std::all_of(loaded->begin(), loaded->end(), [](bool ok) { return ok; })) {
      kv_.cache_loaded(loads);
      return blocks;
    }
    kv_.free(r.id);
    kv_.restore_prefix_cache_stats(stats_before);
  }
  return std::nullopt;  // not reached: without a connector nothing is loaded
}

const std::string* Scheduler::loading_owner_of(std::span<const kv::BlockTransfer> loads) const {
  if (loading_.empty()) return nullptr;
  std::unordered_set<kv::BlockHash> keys;
  for (const kv::BlockTransfer& l : loads) keys.insert(l.key);
  for (const Request* owner : loading_)
    for (const kv::BlockTransfer& t : loading_loads_.at(owner->id))
      if (keys.count(t.key)) return &owner->id;
  return nullptr;
}

void Scheduler::release_waiting_for(const std::string& owner) {
  auto it = waiting_for_load_.find(owner);
  if (it == waiting_for_load_.end()) return;
  for (auto r = it->second.rbegin(); r != it->second.rend(); ++r) waiting_.push_front(*r);
  waiting_for_load_.erase(it);
}

int64_t Scheduler::num_waiting_for_loads() const {
  int64_t n = 0;
  for (const auto& [owner, rs] : waiting_for_load_) n += static_cast<int64_t>(rs.size());
  return n;
}

void Scheduler::collect_finished_loads() {
  if (!connector_) return;
  for (const kv::FinishedLoad& f : connector_->take_finished_loads()) {
    auto loads = loading_loads_.find(f.request_id);
    if (loads == loading_loads_.end()) continue;  // not a load this scheduler started
    ++stats_.loads_finished;
    stats_.loads_failed += !f.ok;
    if (draining_.erase(f.request_id)) {  // aborted meanwhile: now nothing writes its blocks
      kv_.free(f.request_id);
      loading_loads_.erase(loads);
      release_waiting_for(f.request_id);  // they compute (or load) their prompt themselves
      continue;
    }
    Request& r = *requests_.at(f.request_id);
    std::erase(loading_, &r);
    // Cached under their keys and given back: the admission that follows
    // finds them as the pool's own prefix, under the usual rules.
    if (f.ok)
      kv_.cache_loaded(loads->second);
    else
      r.kv_load_failed = true;
    loading_loads_.erase(loads);
    kv_.free(r.id);
    r.status = r.num_preemptions > 0 ? RequestStatus::kPreempted : RequestStatus::kWaiting;
    // Those that waited for these blocks come right after it: admitted after
    // it, they find the blocks in the pool's prefix cache.
    release_waiting_for(r.id);
    waiting_.push_front(&r);
  }
}

std::vector<std::vector<int32_t>> Scheduler::lease_blocks(uint64_t lease_id) const {
  std::vector<std::vector<int32_t>> tables;
  if (!leases_.count(lease_id) || !kv_.holds_blocks(lease_name(lease_id))) return tables;
  for (int32_t g = 0; g < kv_.num_groups(); ++g) {
    const std::span<const int32_t> t = kv_.block_table(lease_name(lease_id), g);
    tables.emplace_back(t.begin(), t.end());
  }
  return tables;
}

bool Scheduler::end_lease(uint64_t lease_id) {
  if (!leases_.erase(lease_id)) return false;
  kv_.free(lease_name(lease_id));
  return true;
}

bool Scheduler::admit_front(SchedulerOutput& out, int64_t& seats) {
  // The front request and, for a beam group, its waiting beams behind it
  // (preempted together, so side by side).
  std::vector<Request*> group{waiting_.front()};
  const std::string& name = group[0]->beam_group;
  while (!name.empty() && group.size() < waiting_.size() && waiting_[group.size()]->beam_group == name)
    group.push_back(waiting_[group.size()]);
  const int64_t need_seats = name.empty() ? 1 : group[0]->beam_width;
  if (seats + need_seats > config_.max_num_seqs) return false;

  // Each takes its prefix hit and blocks in turn (a later lookup must see
  // what the earlier allocations evicted); if one does not fit, those that
  // did give theirs back, so a group never holds blocks while waiting for
  // the rest of itself.
  const kv::PrefixCacheStats stats_before = kv_.prefix_cache_stats();
  std::vector<std::vector<int32_t>> blocks;
  std::vector<kv::PrefixHit> hits;
  std::vector<int64_t> n_new;
  int64_t budget = config_.max_num_batched_tokens - out.total_num_scheduled_tokens;
  // Only a request alone may wait for a deferred load (a beam search's first
  // beam, alone in its group, too): a group of beams is admitted whole, in one step.
  const bool may_defer = group.size() == 1;
  for (size_t k = 0; k < group.size(); ++k) {
    Request* r = group[k];
    kv::PrefixHit hit;
    int64_t n = 0;
    bool deferred = false;
    std::string wait_for;
    // Each beam behind this one needs a token of the budget too.
    std::optional<std::vector<int32_t>> b = allocate_admission(
        *r, budget - static_cast<int64_t>(group.size() - k - 1), &hit, &n, may_defer, &deferred, &wait_for);
    if (deferred) {  // it waits for its blocks, holding them, and takes no seat or budget now
      waiting_.pop_front();
      r->status = RequestStatus::kLoadingRemoteKV;
      loading_.push_back(r);
      return true;
    }
    if (!wait_for.empty()) {  // another request is loading its prefix: it waits for that, holding nothing
      waiting_.pop_front();
      waiting_for_load_[wait_for].push_back(r);
      ++stats_.waited_for_loads;
      return true;
    }
    if (!b) {
      for (size_t k = 0; k < blocks.size(); ++k) kv_.free(group[k]->id);
      kv_.restore_prefix_cache_stats(stats_before);
      return false;
    }
    blocks.push_back(std::move(*b));
    hits.push_back(std::move(hit));
    n_new.push_back(n);
    budget -= n;
  }
  for (size_t k = 0; k < group.size(); ++k) {
    Request& r = *group[k];
    waiting_.pop_front();
    const bool resumed = r.status == RequestStatus::kPreempted;
    if (!resumed) r.num_cached_prompt_tokens = hits[k].num_tokens;
    r.num_computed_tokens = hits[k].num_tokens;
    r.status = RequestStatus::kRunning;
    running_.push_back(&r);
    add_scheduled(out, r, n_new[k], 0, std::move(blocks[k]), true, resumed, hits[k].num_tokens,
                  hits[k].state_snapshot);
  }
  seats += need_seats;
  return true;
}

SchedulerOutput Scheduler::schedule() {
  SchedulerOutput out;
  out.step = stats_.steps;
  out.finished_request_ids = std::move(finished_since_schedule_);
  finished_since_schedule_.clear();
  auto budget = [&] { return config_.max_num_batched_tokens - out.total_num_scheduled_tokens; };
  if (config_.context_positions_per_token > 0.0)
    chunk_work_left_ = config_.chunk_work(config_.max_request_step_tokens(), 0);
  step_has_chunk_ = false;
  // Copies on write, with the request each is for (one preempted later in
  // the step drops its own).
  std::vector<std::pair<std::string, kv::BlockCopy>> copies;
  // With batches in flight, each batch takes its share of the requests.
  const size_t max_requests = config_.batches_in_flight > 1
                                  ? (running_.size() + waiting_.size() + config_.batches_in_flight - 1) /
                                        static_cast<size_t>(config_.batches_in_flight)
                                  : SIZE_MAX;

  // Running requests, oldest first. Victims come from the back, which holds
  // requests not yet scheduled this step (or the current one itself, and for
  // a beam group, its beams scheduled just before it).
  for (size_t i = 0; i < running_.size() && budget() > 0 && out.scheduled.size() < max_requests;) {
    Request& r = *running_[i];
    if (r.in_flight) {  // its tokens are not back yet
      ++i;
      continue;
    }
    int64_t n = tokens_to_schedule(r, r.num_computed_tokens, budget());
    if (n <= 0) {  // a chunk with no chunk work left this step
      ++i;
      continue;
    }
    // A decode verifies its drafts in the same step, as far as the budget
    // and the per-request cap allow. (Beside recurrent layers, a decode after
    // rejected drafts first recomputes the accepted ones: all of its tokens
    // are scheduled, then the new drafts.)
    int64_t n_drafts = 0;
    if (n == r.num_tokens() - r.num_computed_tokens && !r.draft_token_ids.empty()) {
      n_drafts = std::min({static_cast<int64_t>(r.draft_token_ids.size()), budget() - n,
                           config_.max_request_step_tokens() - n});
      n += n_drafts;
    }
    std::vector<kv::BlockCopy> own_copies;
    std::optional<std::vector<int32_t>> blocks;
    bool preempted_itself = false;
    while (!(blocks = kv_.allocate_slots(r.id, r.num_computed_tokens, n, {}, &own_copies)))
      if ((preempted_itself = preempt_newest(r, out))) break;
    if (preempted_itself) break;  // the request needing space was the newest: stop here
    save_evictions();
    for (const kv::BlockCopy& c : own_copies) copies.emplace_back(r.id, c);
    const int32_t state_source =
        r.restore_state_checkpoint >= 0 ? kv_.state_checkpoint_slot(r.id, r.restore_state_checkpoint).value_or(-1) : -1;
    add_scheduled(out, r, n, n_drafts, std::move(*blocks), false, false, 0, state_source);
    r.draft_token_ids.clear();  // verified now, or not at all
    r.restore_state_checkpoint = -1;
    ++i;
  }

  // Loads that finished put their requests back at the front of the queue
  // (after the running requests took their blocks, so that what was just
  // loaded is not evicted before it is admitted).
  collect_finished_loads();

  // Waiting requests in FIFO order, unless this step had to preempt (there is
  // no room to admit anyone then). The first that does not fit stops admission.
  int64_t seats = running_seats();
  while (out.preempted_request_ids.empty() && !waiting_.empty() && budget() > 0 &&
         out.scheduled.size() < max_requests && admit_front(out, seats)) {
  }
  if (config_.batches_in_flight > 1)
    for (const ScheduledRequest& s : out.scheduled) requests_.at(s.request_id)->in_flight = true;

  for (const auto& [id, c] : copies)
    if (std::any_of(out.scheduled.begin(), out.scheduled.end(),
                    [&](const ScheduledRequest& s) { return s.request_id == id; }))
      out.block_copies.push_back(c);
  ++stats_.steps;
  stats_.scheduled_tokens += out.total_num_scheduled_tokens;
  stats_.last_step_tokens = out.total_num_scheduled_tokens;
  stats_.max_step_tokens = std::max(stats_.max_step_tokens, out.total_num_scheduled_tokens);
  assert(check_output(out).ok());
  assert(check_invariants().ok());
  return out;
}

Result<std::vector<RequestUpdate>> Scheduler::update(const SchedulerOutput& out,
                                                     std::span<const int32_t> sampled_token_ids) {
  std::vector<std::vector<int32_t>> one_each;
  one_each.reserve(sampled_token_ids.size());
  for (int32_t token : sampled_token_ids) one_each.push_back({token});
  return update(out, one_each);
}

Result<std::vector<RequestUpdate>> Scheduler::update(const SchedulerOutput& out,
                                                     std::span<const std::vector<int32_t>> sampled_token_ids) {
  if (sampled_token_ids.size() != out.scheduled.size())
    return make_error("update: " + str(static_cast<int64_t>(sampled_token_ids.size())) +
                      " sampled tokens for " + str(static_cast<int64_t>(out.scheduled.size())) +
                      " scheduled requests");
  // Check first, so a mismatched output changes nothing.
  for (size_t i = 0; i < out.scheduled.size(); ++i) {
    const ScheduledRequest& s = out.scheduled[i];
    auto it = requests_.find(s.request_id);
    if (it == requests_.end()) continue;  // finished or aborted since schedule()
    const Request& r = *it->second;
    if (r.status != RequestStatus::kRunning || r.num_computed_tokens != s.num_computed_tokens)
      return make_error("update: the output for request '" + s.request_id +
                        "' does not match its state (applied twice, or from an older step?)");
    if (!s.sample) continue;
    const std::vector<int32_t>& tokens = sampled_token_ids[i];
    const int64_t n = static_cast<int64_t>(tokens.size());
    if (n > s.num_draft_tokens + 1)
      return make_error("update: " + str(n) + " tokens for request '" + s.request_id + "', which verified " +
                        str(s.num_draft_tokens) + " drafts");
    const auto drafts = s.token_ids.end() - s.num_draft_tokens;
    if (n > 0 && !std::equal(tokens.begin(), tokens.end() - 1, drafts))
      return make_error("update: the tokens accepted for request '" + s.request_id + "' are not its drafts");
  }

  std::vector<RequestUpdate> updates;
  std::vector<Request*> finished;
  for (size_t i = 0; i < out.scheduled.size(); ++i) {
    const ScheduledRequest& s = out.scheduled[i];
    auto it = requests_.find(s.request_id);
    if (it == requests_.end()) continue;
    Request& r = *it->second;
    r.in_flight = false;
    const std::vector<int32_t>& tokens = sampled_token_ids[i];
    // Valid keys/values: the tokens before the drafts and the accepted drafts
    // (with no token, all but the last: it is fed again).
    const int64_t accepted = s.sample ? static_cast<int64_t>(tokens.size()) - 1 : 0;
    r.num_computed_tokens += s.num_new_tokens - s.num_draft_tokens + accepted;
    // A recurrent state cannot drop the rejected drafts: it goes back to the
    // latest checkpoint kept at or before the last accepted draft (the state
    // before draft i is checkpoint i), and the accepted drafts past it are
    // computed again.
    if (kv_.has_state_slots() && accepted < s.num_draft_tokens && !tokens.empty()) {
      const int64_t kept = std::min<int64_t>(accepted, kv_.num_state_checkpoints() - 1);
      r.num_computed_tokens -= accepted - kept;
      r.restore_state_checkpoint = static_cast<int32_t>(kept);
    }
    if (!s.sample || tokens.empty()) {  // mid-prefill, or a row not used: nothing appended
      // (an encoder's pooled request writes no keys or values: nothing to cache)
      if (!r.pooled) kv_.cache_full_blocks(r.id, r.all_token_ids, r.num_computed_tokens, r.cache_key);
      continue;
    }
    RequestUpdate u{r.id, {}, RequestStatus::kRunning};
    for (int32_t token : tokens) {
      r.append_output_token(token);
      u.new_token_ids.push_back(token);
      if (r.is_stop_token(token))
        u.status = RequestStatus::kFinishedStopped;
      else if (r.num_output_tokens() >= r.max_tokens ||
               (config_.max_model_len > 0 && r.num_tokens() >= config_.max_model_len))
        u.status = RequestStatus::kFinishedLength;
      if (is_finished(u.status)) break;
    }
    // Hashed only now: every computed token is a verified one.
    kv_.cache_full_blocks(r.id, r.all_token_ids, std::min(r.num_computed_tokens, r.num_tokens()), r.cache_key);
    if (is_finished(u.status)) {
      r.status = u.status;
      finished.push_back(&r);
    }
    updates.push_back(std::move(u));
  }
  if (connector_) {
    const std::vector<kv::BlockTransfer> computed = kv_.take_newly_cached();
    if (!computed.empty()) connector_->save_computed(computed);
  }
  if (!finished.empty()) {
    std::erase_if(running_, [](const Request* r) { return r->finished(); });
    for (Request* r : finished) retire(*r, r->status);
  }
  return updates;
}

bool Scheduler::set_draft_tokens(const std::string& request_id, std::vector<int32_t> draft_token_ids) {
  auto it = requests_.find(request_id);
  if (it == requests_.end() || it->second->status != RequestStatus::kRunning) return false;
  // Rejected drafts are taken back out of a recurrent state from a checkpoint.
  if (kv_.has_state_slots() && !kv_.has_state_checkpoints()) return false;
  Request& r = *it->second;
  // The drafts and the token sampled after them all become output.
  int64_t room = r.max_tokens - r.num_output_tokens() - 1;
  if (config_.max_model_len > 0) room = std::min(room, config_.max_model_len - r.num_tokens() - 1);
  if (static_cast<int64_t>(draft_token_ids.size()) > room) draft_token_ids.resize(static_cast<size_t>(std::max<int64_t>(0, room)));
  r.draft_token_ids = std::move(draft_token_ids);
  return true;
}

void Scheduler::retire(Request& r, RequestStatus reason, bool counted) {
  // A request that prefilled for a remote decode leaves its prompt's full
  // blocks held under its lease (an aborted one has no decode to serve).
  if (r.kv_lease_id != 0 && (reason == RequestStatus::kFinishedStopped || reason == RequestStatus::kFinishedLength)) {
    const int64_t full = std::min(r.num_prompt_tokens(), r.num_computed_tokens) / kv_.block_size() * kv_.block_size();
    if (full > 0 && kv_.holds_blocks(r.id) && !leases_.count(r.kv_lease_id))
      kv_.fork(r.id, lease_name(r.kv_lease_id), full);
    leases_.insert(r.kv_lease_id);
  }
  if (!draining_.count(r.id)) kv_.free(r.id);  // a draining request's blocks wait for its load
  r.status = reason;
  if (counted) {
    ++stats_.finished;
    if (reason == RequestStatus::kFinishedAborted) ++stats_.aborted;
  }
  finished_since_schedule_.push_back(r.id);
  requests_.erase(requests_.find(r.id));  // destroys r
}

Status Scheduler::finish_request(const std::string& request_id, RequestStatus reason) {
  if (!is_finished(reason)) return make_error("finish_request: the reason must be a finished status");
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return make_error("finish_request: no unfinished request has this id");
  Request* r = it->second.get();
  std::erase(running_, r);
  std::erase(waiting_, r);
  if (std::erase(loading_, r)) draining_.insert(r->id);
  for (auto w = waiting_for_load_.begin(); w != waiting_for_load_.end();) {
    std::erase(w->second, r);
    w = w->second.empty() ? waiting_for_load_.erase(w) : std::next(w);
  }
  retire(*r, reason);
  return {};
}

bool Scheduler::abort(const std::string& request_id) {
  return finish_request(request_id, RequestStatus::kFinishedAborted).ok();
}

bool Scheduler::drop_beam(const std::string& request_id) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return false;
  Request* r = it->second.get();
  std::erase(running_, r);
  std::erase(waiting_, r);
  retire(*r, RequestStatus::kFinishedAborted, /*counted=*/false);
  return true;
}

Status Scheduler::fork(const std::string& parent_id, const std::string& child_id, int32_t last_token) {
  auto it = requests_.find(parent_id);
  if (it == requests_.end() || it->second->status != RequestStatus::kRunning)
    return make_error("fork: request '" + parent_id + "' is not running");
  const Request& parent = *it->second;
  if (parent.beam_group.empty()) return make_error("fork: request '" + parent_id + "' is not a beam");
  if (parent.output_token_ids.empty() || parent.num_computed_tokens != parent.num_tokens() - 1)
    return make_error("fork: request '" + parent_id + "' has not just sampled a token");
  if (child_id.empty() || requests_.count(child_id)) return make_error("fork: the id '" + child_id + "' is taken");
  if (parent.is_stop_token(last_token)) return make_error("fork: the last token would end the request");

  auto child = std::make_unique<Request>(parent);
  child->id = child_id;
  child->output_token_ids.back() = last_token;
  child->all_token_ids.back() = last_token;
  child->draft_token_ids.clear();
  kv_.fork(parent_id, child_id, parent.num_computed_tokens);
  // After the group's last beam: a group stays side by side in the queue.
  auto pos = std::find(running_.begin(), running_.end(), &parent);
  while (pos != running_.end() && (*pos)->beam_group == parent.beam_group) ++pos;
  running_.insert(pos, child.get());
  requests_.emplace(child_id, std::move(child));
  return {};
}

const Request* Scheduler::find(const std::string& request_id) const {
  auto it = requests_.find(request_id);
  return it == requests_.end() ? nullptr : it->second.get();
}

SchedulerStats Scheduler::stats() const {
  SchedulerStats s = stats_;
  s.num_running = num_running();
  s.num_waiting = num_waiting() + num_waiting_for_loads();
  const auto requests = [](const auto& queue) {
    int64_t n = 0;
    const std::string* group = nullptr;
    for (const Request* r : queue) {
      if (r->beam_group.empty() || !group || *group != r->beam_group) ++n;
      group = r->beam_group.empty() ? nullptr : &r->beam_group;
    }
    return n;
  };
  s.num_running_requests = requests(running_);
  s.num_waiting_requests = requests(waiting_) + num_waiting_for_loads();
  s.kv_used_blocks = kv_.num_used_blocks();
  s.kv_free_blocks = kv_.num_free_blocks();
  s.kv_usage = kv_.usage();
  for (const Request* r : running_) s.kv_held_tokens += r->num_computed_tokens;
  s.prefix_cache = kv_.prefix_cache_stats();
  s.num_loading = num_loading();
  s.kv_leases = static_cast<int64_t>(leases_.size());
  return s;
}

Status Scheduler::check_invariants() const {
  if (Status s = kv_.check_invariants(); !s) return s;
  auto fail = [](const std::string& what) { return Status(make_error("Scheduler: " + what)); };
  if (static_cast<int64_t>(running_.size()) > config_.max_num_seqs)
    return fail("more running requests than max_num_seqs");
  if (static_cast<int64_t>(running_.size() + waiting_.size() + loading_.size()) + num_waiting_for_loads() !=
      static_cast<int64_t>(requests_.size()))
    return fail("the queues do not hold every unfinished request exactly once");
  for (const std::string& id : draining_)
    if (requests_.count(id) || !kv_.holds_blocks(id) || !loading_loads_.count(id))
      return fail("aborted request '" + id + "' is draining a load it does not hold");
  if (loading_loads_.size() != loading_.size() + draining_.size())
    return fail("loads are kept for requests that do not wait for them");
  std::unordered_set<const Request*> seen;
  for (const Request* r : running_) {
    if (!seen.insert(r).second) return fail("request '" + r->id + "' is queued twice");
    if (r->status != RequestStatus::kRunning) return fail("request '" + r->id + "' is in the running queue but not running");
    if (r->num_computed_tokens >= r->num_tokens())
      return fail("running request '" + r->id + "' has nothing left to compute");
    for (int32_t g = 0; g < kv_.num_groups(); ++g) {
      const int64_t slots = static_cast<int64_t>(kv_.block_table(r->id, g).size()) * kv_.block_size();
      if (slots < r->num_computed_tokens)
        return fail("running request '" + r->id + "' has fewer slots than computed tokens");
    }
  }
  for (const Request* r : waiting_) {
    if (!seen.insert(r).second) return fail("request '" + r->id + "' is queued twice");
    if (r->status != RequestStatus::kWaiting && r->status != RequestStatus::kPreempted)
      return fail("request '" + r->id + "' is in the waiting queue but not waiting");
    if (r->in_flight) return fail("waiting request '" + r->id + "' is in a batch in flight");
    if (r->num_computed_tokens != 0 || kv_.holds_blocks(r->id))
      return fail("waiting request '" + r->id + "' holds KV state");
  }
  for (const Request* r : loading_) {
    if (!seen.insert(r).second) return fail("request '" + r->id + "' is queued twice");
    if (r->status != RequestStatus::kLoadingRemoteKV || !kv_.holds_blocks(r->id) || !loading_loads_.count(r->id))
      return fail("loading request '" + r->id + "' is not waiting for its blocks");
  }
  for (const auto& [owner, rs] : waiting_for_load_) {
    if (!loading_loads_.count(owner)) return fail("requests wait for '" + owner + "', which loads nothing");
    for (const Request* r : rs) {
      if (!seen.insert(r).second) return fail("request '" + r->id + "' is queued twice");
      if ((r->status != RequestStatus::kWaiting && r->status != RequestStatus::kPreempted) ||
          r->num_computed_tokens != 0 || kv_.holds_blocks(r->id))
        return fail("request '" + r->id + "' waits for a load but is not a waiting request");
    }
  }
  for (const auto& [id, r] : requests_)
    if (!seen.count(r.get())) return fail("request '" + id + "' is in no queue");
  // Beam groups: wholly running, side by side, or wholly waiting, and never wider than their width.
  struct GroupSeen {
    int64_t running = 0, waiting = 0, width = 0;
  };
  std::unordered_map<std::string, GroupSeen> groups;
  for (size_t i = 0; i < running_.size(); ++i) {
    const Request& r = *running_[i];
    if (r.beam_group.empty()) continue;
    GroupSeen& g = groups[r.beam_group];
    if (g.running > 0 && running_[i - 1]->beam_group != r.beam_group)
      return fail("the beams of group '" + r.beam_group + "' are not side by side in the running queue");
    ++g.running;
    g.width = r.beam_width;
  }
  for (const Request* r : waiting_)
    if (!r->beam_group.empty()) {
      GroupSeen& g = groups[r->beam_group];
      ++g.waiting;
      g.width = r->beam_width;
    }
  for (const auto& [name, g] : groups) {
    if (g.running > 0 && g.waiting > 0) return fail("beam group '" + name + "' is partly running, partly waiting");
    if (g.running + g.waiting > g.width) return fail("beam group '" + name + "' has more beams than its width");
  }
  if (running_seats() > config_.max_num_seqs) return fail("the running requests take more seats than max_num_seqs");
  int64_t holders = static_cast<int64_t>(running_.size() + loading_.size() + draining_.size());
  for (uint64_t lease : leases_) holders += kv_.holds_blocks(lease_name(lease));
  if (kv_.num_requests() > holders) return fail("blocks are held by requests that are not running");
  return {};
}

Status Scheduler::check_output(const SchedulerOutput& out) const {
  auto fail = [&](const std::string& what) {
    return Status(make_error("step " + str(out.step) + ": " + what));
  };
  if (out.total_num_scheduled_tokens > config_.max_num_batched_tokens)
    return fail("token budget exceeded");
  if (static_cast<int64_t>(out.scheduled.size()) > config_.max_num_seqs)
    return fail("more requests than max_num_seqs");
  int64_t total = 0;
  std::unordered_set<std::string> ids;
  for (const ScheduledRequest& s : out.scheduled) {
    const std::string name = "request '" + s.request_id + "'";
    if (!ids.insert(s.request_id).second) return fail(name + " is scheduled twice");
    if (s.num_new_tokens < 1) return fail(name + " is scheduled with no tokens");
    if (config_.long_prefill_token_threshold > 0 && s.num_new_tokens > config_.long_prefill_token_threshold)
      return fail(name + " exceeds long_prefill_token_threshold");
    if (static_cast<int64_t>(s.token_ids.size()) != s.num_new_tokens)
      return fail(name + " has the wrong number of token ids");
    if (static_cast<int32_t>(s.block_tables.size()) != kv_.num_groups())
      return fail(name + " has a block table per group missing");
    for (const std::vector<int32_t>& table : s.block_tables)
      if (static_cast<int64_t>(table.size()) * kv_.block_size() < s.num_computed_tokens + s.num_new_tokens)
        return fail(name + "'s block table does not cover its tokens");
    if (kv_.has_state_slots() && s.state_slot != kv_.state_slot(s.request_id).value_or(-2))
      return fail(name + " is scheduled without the state slot it holds");
    if (const int64_t chunk = s.num_new_tokens - s.num_draft_tokens;
        chunk > 1 && config_.context_positions_per_token > 0.0 &&
        config_.chunk_work(chunk, s.num_computed_tokens) >
            config_.chunk_work(config_.max_request_step_tokens(), 0) * (1.0 + 1e-9))
      return fail(name + "'s chunk costs more than a chunk of max_request_step_tokens at position 0");
    total += s.num_new_tokens;
  }
  if (total != out.total_num_scheduled_tokens) return fail("total_num_scheduled_tokens is wrong");
  return {};
}

}  // namespace inferd
