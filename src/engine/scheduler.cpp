#include "engine/scheduler.h"

#include <algorithm>
#include <cassert>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <unordered_set>

namespace inferd {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool contains(const std::vector<int32_t>& v, int32_t x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

}  // namespace

Status SchedulerConfig::validate() const {
  if (max_num_batched_tokens < 1) return make_error("max_num_batched_tokens must be at least 1");
  if (max_num_seqs < 1) return make_error("max_num_seqs must be at least 1");
  if (long_prefill_token_threshold < 0) return make_error("long_prefill_token_threshold must be >= 0");
  if (max_model_len < 0) return make_error("max_model_len must be >= 0");
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
  return {};
}

Status Scheduler::add_request(Request r) {
  if (Status s = validate_request(r, config_); !s) return s;
  if (requests_.count(r.id)) return make_error("a request with this id is already queued or running");

  auto req = std::make_unique<Request>(std::move(r));
  req->output_token_ids.clear();
  req->all_token_ids = req->prompt_token_ids;
  req->num_computed_tokens = 0;
  req->status = RequestStatus::kWaiting;
  req->num_cached_prompt_tokens = 0;
  req->num_preemptions = 0;
  req->cache_key = kv::hash_bytes(req->cache_salt);
  if (req->arrival_time == 0.0) req->arrival_time = now_seconds();
  waiting_.push_back(req.get());
  requests_.emplace(req->id, std::move(req));
  return {};
}

int64_t Scheduler::tokens_to_schedule(const Request& r, int64_t num_computed, int64_t budget) const {
  int64_t n = r.num_tokens() - num_computed;
  if (config_.long_prefill_token_threshold > 0) n = std::min(n, config_.long_prefill_token_threshold);
  return std::min(n, budget);
}

void Scheduler::add_scheduled(SchedulerOutput& out, const Request& r, int64_t n, int64_t n_drafts,
                              std::vector<int32_t> new_blocks, bool is_new, bool resumed,
                              int64_t num_cached) {
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
  s.is_new = is_new;
  s.resumed = resumed;
  s.sample = r.num_computed_tokens + (n - n_drafts) == r.num_tokens();
  s.num_cached_tokens = num_cached;
  out.total_num_scheduled_tokens += n;
  out.scheduled.push_back(std::move(s));
}

void Scheduler::preempt(Request& r) {
  kv_.free(r.id);
  r.draft_token_ids.clear();
  r.num_computed_tokens = 0;
  r.status = RequestStatus::kPreempted;
  ++r.num_preemptions;
  ++stats_.preemptions;
  waiting_.push_front(&r);
}

SchedulerOutput Scheduler::schedule() {
  SchedulerOutput out;
  out.step = stats_.steps;
  out.finished_request_ids = std::move(finished_since_schedule_);
  finished_since_schedule_.clear();
  int64_t budget = config_.max_num_batched_tokens;

  // Running requests, oldest first. Victims come from the back, which holds
  // requests not yet scheduled this step (or the current one itself).
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Request& r = *running_[i];
    int64_t n = tokens_to_schedule(r, r.num_computed_tokens, budget);
    // A decode verifies its drafts in the same step, as far as the budget
    // and the per-request cap allow.
    int64_t n_drafts = 0;
    if (n == 1 && r.num_tokens() - r.num_computed_tokens == 1) {
      n_drafts = std::min({static_cast<int64_t>(r.draft_token_ids.size()), budget - 1,
                           config_.max_request_step_tokens() - 1});
      n += n_drafts;
    }
    std::optional<std::vector<int32_t>> blocks;
    while (!(blocks = kv_.allocate_slots(r.id, r.num_computed_tokens, n))) {
      Request& victim = *running_.back();
      running_.pop_back();
      preempt(victim);
      out.preempted_request_ids.push_back(victim.id);
      if (&victim == &r) break;
    }
    if (!blocks) break;  // the request needing space was the newest: stop here
    add_scheduled(out, r, n, n_drafts, std::move(*blocks), false, false, 0);
    r.draft_token_ids.clear();  // verified now, or not at all
    budget -= n;
    ++i;
  }

  // Waiting requests in FIFO order, unless this step had to preempt (there is
  // no room to admit anyone then). The first that does not fit stops admission.
  while (out.preempted_request_ids.empty() && !waiting_.empty() && budget > 0 &&
         static_cast<int64_t>(running_.size()) < config_.max_num_seqs) {
    Request& r = *waiting_.front();
    const kv::PrefixHit hit = kv_.get_computed_blocks(r.all_token_ids, r.cache_key);
    const int64_t n = tokens_to_schedule(r, hit.num_tokens, budget);
    std::optional<std::vector<int32_t>> blocks = kv_.allocate_slots(r.id, 0, n, hit);
    if (!blocks) break;
    waiting_.pop_front();
    const bool resumed = r.status == RequestStatus::kPreempted;
    if (!resumed) r.num_cached_prompt_tokens = hit.num_tokens;
    r.num_computed_tokens = hit.num_tokens;
    r.status = RequestStatus::kRunning;
    running_.push_back(&r);
    add_scheduled(out, r, n, 0, std::move(*blocks), true, resumed, hit.num_tokens);
    budget -= n;
  }

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
    if (n < 1 || n > s.num_draft_tokens + 1)
      return make_error("update: " + str(n) + " tokens for request '" + s.request_id + "', which verified " +
                        str(s.num_draft_tokens) + " drafts");
    const auto drafts = s.token_ids.end() - s.num_draft_tokens;
    if (!std::equal(tokens.begin(), tokens.end() - 1, drafts))
      return make_error("update: the tokens accepted for request '" + s.request_id + "' are not its drafts");
  }

  std::vector<RequestUpdate> updates;
  std::vector<Request*> finished;
  for (size_t i = 0; i < out.scheduled.size(); ++i) {
    const ScheduledRequest& s = out.scheduled[i];
    auto it = requests_.find(s.request_id);
    if (it == requests_.end()) continue;
    Request& r = *it->second;
    const std::vector<int32_t>& tokens = sampled_token_ids[i];
    // Valid keys/values: the tokens before the drafts and the accepted drafts.
    const int64_t accepted = s.sample ? static_cast<int64_t>(tokens.size()) - 1 : 0;
    r.num_computed_tokens += s.num_new_tokens - s.num_draft_tokens + accepted;
    if (!s.sample) {  // mid-prefill: nothing sampled
      kv_.cache_full_blocks(r.id, r.all_token_ids, r.num_computed_tokens, r.cache_key);
      continue;
    }
    RequestUpdate u{r.id, {}, RequestStatus::kRunning};
    for (int32_t token : tokens) {
      r.append_output_token(token);
      u.new_token_ids.push_back(token);
      if ((!r.ignore_eos && r.eos_token_id && token == *r.eos_token_id) || contains(r.stop_token_ids, token))
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
  if (!finished.empty()) {
    std::erase_if(running_, [](const Request* r) { return r->finished(); });
    for (Request* r : finished) retire(*r, r->status);
  }
  return updates;
}

bool Scheduler::set_draft_tokens(const std::string& request_id, std::vector<int32_t> draft_token_ids) {
  auto it = requests_.find(request_id);
  if (it == requests_.end() || it->second->status != RequestStatus::kRunning) return false;
  Request& r = *it->second;
  // The drafts and the token sampled after them all become output.
  int64_t room = r.max_tokens - r.num_output_tokens() - 1;
  if (config_.max_model_len > 0) room = std::min(room, config_.max_model_len - r.num_tokens() - 1);
  if (static_cast<int64_t>(draft_token_ids.size()) > room) draft_token_ids.resize(static_cast<size_t>(std::max<int64_t>(0, room)));
  r.draft_token_ids = std::move(draft_token_ids);
  return true;
}

void Scheduler::retire(Request& r, RequestStatus reason) {
  kv_.free(r.id);
  r.status = reason;
  ++stats_.finished;
  if (reason == RequestStatus::kFinishedAborted) ++stats_.aborted;
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
  retire(*r, reason);
  return {};
}

bool Scheduler::abort(const std::string& request_id) {
  return finish_request(request_id, RequestStatus::kFinishedAborted).ok();
}

const Request* Scheduler::find(const std::string& request_id) const {
  auto it = requests_.find(request_id);
  return it == requests_.end() ? nullptr : it->second.get();
}

SchedulerStats Scheduler::stats() const {
  SchedulerStats s = stats_;
  s.num_running = num_running();
  s.num_waiting = num_waiting();
  s.kv_used_blocks = kv_.num_used_blocks();
  s.kv_free_blocks = kv_.num_free_blocks();
  s.kv_usage = kv_.usage();
  for (const Request* r : running_) s.kv_held_tokens += r->num_computed_tokens;
  s.prefix_cache = kv_.prefix_cache_stats();
  return s;
}

Status Scheduler::check_invariants() const {
  if (Status s = kv_.check_invariants(); !s) return s;
  auto fail = [](const std::string& what) { return Status(make_error("Scheduler: " + what)); };
  if (static_cast<int64_t>(running_.size()) > config_.max_num_seqs)
    return fail("more running requests than max_num_seqs");
  if (running_.size() + waiting_.size() != requests_.size())
    return fail("the queues do not hold every unfinished request exactly once");
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
    if (r->num_computed_tokens != 0 || kv_.holds_blocks(r->id))
      return fail("waiting request '" + r->id + "' holds KV state");
  }
  for (const auto& [id, r] : requests_)
    if (!seen.count(r.get())) return fail("request '" + id + "' is in no queue");
  if (kv_.num_requests() > static_cast<int64_t>(running_.size()))
    return fail("blocks are held by requests that are not running");
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
    total += s.num_new_tokens;
  }
  if (total != out.total_num_scheduled_tokens) return fail("total_num_scheduled_tokens is wrong");
  return {};
}

}  // namespace inferd
