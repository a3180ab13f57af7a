// The token-budget scheduler (GUIDE rule 1). Each step it hands out
// num_new_tokens per request under one budget (max_num_batched_tokens) and
// max_num_seqs: running requests first, in admission order, each getting
// min(tokens left to compute, budget left); then waiting requests in FIFO
// order. A decode is one token, a prefill chunk many, and both share a step;
// chunked prefill and prefix-cache hits (taken at admission) fall out of the
// same rule.
//
// When a running request cannot get KV blocks, the most recently admitted
// running request is preempted (its blocks freed, its progress reset; it
// keeps its output and goes to the front of the waiting queue to recompute
// prompt + output) and allocation is retried; if the request needing space is
// itself the newest, it is preempted and the step stops there.
//
// Beam search: a request's beams are requests of one beam group
// (Request::beam_group). The group counts as beam_width running requests
// against max_num_seqs, is admitted only whole (every waiting beam gets
// blocks, or none keeps any), and is preempted whole: its beams stay side by
// side at the back of the running queue, so when the newest running request
// must make room, its whole group goes. A beam forks (fork()) into a new
// request that shares its blocks; the block both write next is copied on
// write (SchedulerOutput::block_copies). update() may give a sampled request
// no token: its row was not used (its group did not advance this step) and
// its last token is fed again.
//
// One step is: out = schedule(); the runner computes out and samples a token
// for each request with `sample` set; update(out, tokens). update() is the
// only place tokens are appended and stop conditions checked. Blocks become
// findable by the prefix cache in update(), after their tokens are computed,
// so a step that fails can be abandoned by aborting its requests without
// leaving unwritten blocks in the cache.
//
// Batches in flight (SchedulerConfig::batches_in_flight > 1): schedule() may
// be called again before the previous batch's update(); a request in a batch
// in flight is skipped (its next chunk or token waits for its tokens) and is
// never a victim of preemption (the pipeline is still writing its blocks),
// so each batch's requests are disjoint. An abort frees an in-flight
// request's blocks at once: every stage runs batches in order, so a later
// batch that reuses them writes them after the aborted one did.
//
// Not thread-safe: the engine loop owns the scheduler and applies abort and
// add messages between steps.
#pragma once
#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/result.h"
#include "engine/request.h"
#include "engine/scheduler_output.h"
#include "kv/kv_cache_manager.h"

namespace inferd {

struct SchedulerConfig {
  int64_t max_num_batched_tokens = 2048;  // token budget of one step
  int32_t max_num_seqs = 128;             // running requests at most
  // > 0: no request computes more than this many tokens in one step, so a long
  // prompt cannot take a whole step from the prompts admitted behind it.
  int64_t long_prefill_token_threshold = 0;
  int64_t max_model_len = 0;  // > 0: prompt + max_tokens may not exceed it
  // Batches that may be in a pipeline at once (pipeline parallelism: one per
  // stage). Above 1, a scheduled request is in flight until update() takes
  // its batch's tokens; schedule() then builds the next batch from the other
  // requests, and gives each batch at most 1/batches_in_flight of them so
  // that the batches stay even. 1: every schedule() is followed by its update().
  int32_t batches_in_flight = 1;
  // > 0: context positions whose attention costs as much as one token's
  // projections (TokenCost::context_positions_per_token). Prompt chunks deep
  // in a long prompt are then shortened so that the prompt chunks of one step
  // cost no more than one chunk of max_request_step_tokens() at the start of
  // a prompt: a step's time, and so the inter-token latency of the requests
  // decoding beside a long prompt, stays level instead of growing with the
  // prompt's length. 0: chunks are sized by tokens alone.
  double context_positions_per_token = 0.0;
  kv::KVCacheConfig kv;

  Status validate() const;  // error naming the first bad field
  // The most tokens one request computes in a step.
  int64_t max_request_step_tokens() const {
    return long_prefill_token_threshold > 0 ? std::min(long_prefill_token_threshold, max_num_batched_tokens)
                                            : max_num_batched_tokens;
  }
  // The work of computing n tokens after `context` positions, in units of one
  // token's projections: n + attention over context + n(n+1)/2 positions,
  // divided by context_positions_per_token (which must be > 0).
  double chunk_work(int64_t n, int64_t context) const;
  // The most tokens after `context` positions whose chunk_work is at most `work`.
  int64_t chunk_tokens_within(double work, int64_t context) const;
};

// What update() did to one request that sampled this step.
struct RequestUpdate {
  std::string request_id;
  std::vector<int32_t> new_token_ids;  // appended this step
  RequestStatus status = RequestStatus::kRunning;  // a finished status if it stopped
};

struct SchedulerStats {
  int64_t steps = 0;
  int64_t scheduled_tokens = 0;  // over all steps; / steps = mean tokens per step
  int64_t last_step_tokens = 0;
  int64_t max_step_tokens = 0;
  int64_t num_running = 0;
  int64_t num_waiting = 0;
  // The same, counting the beams of one beam search as one request (they sit
  // side by side in their queue).
  int64_t num_running_requests = 0;
  int64_t num_waiting_requests = 0;
  int32_t kv_used_blocks = 0;
  int32_t kv_free_blocks = 0;  // empty or evictable
  int64_t kv_held_tokens = 0;  // tokens whose keys/values running requests hold
  double kv_usage = 0.0;
  kv::PrefixCacheStats prefix_cache;  // in tokens
  int64_t preemptions = 0;
  int64_t finished = 0;  // finished for any reason, aborts included
  int64_t aborted = 0;
  // Deferred connector loads (a KV transfer): requests waiting for them now,
  // and loads finished well or not since the start.
  int64_t num_loading = 0;
  int64_t loads_finished = 0, loads_failed = 0;
  // Admissions that waited for another request's load of their prefix
  // (another choice of the same prompt) instead of computing it.
  int64_t waited_for_loads = 0;
  int64_t kv_leases = 0;  // prompts' blocks held for a remote decode
};

// Prompt positions a request with prompt logprobs feeds per step at most:
// each returns a row of logits (256 rows of a 152k vocabulary: 156 MB).
constexpr int64_t kMaxPromptLogitRowsPerStep = 256;

class Scheduler {
 public:
  explicit Scheduler(const SchedulerConfig& config);  // config.validate() must pass

  // Queues a request (the caller fills Request's inputs; its state fields are
  // reset). Refused, with a message naming the problem, for a duplicate or
  // empty id, an empty prompt, max_tokens < 1, bad sampling parameters, or a
  // request that could not fit in the KV cache even alone.
  Status add_request(Request request);
  // The checks of add_request that need no queue state (all but the duplicate
  // id), so a caller on another thread can refuse a request at once.
  static Status validate_request(const Request& request, const SchedulerConfig& config);

  // Decides the next step. Allocates the step's KV slots; changes no tokens.
  SchedulerOutput schedule();

  // Applies a computed step. sampled_token_ids[i] holds the tokens sampled
  // for out.scheduled[i] (ignored where that request's `sample` is false): one,
  // or for a request that verified k drafts, the j <= k drafts accepted (equal
  // to the first j drafts) and then the token sampled after them, or none
  // (beam search: the row was not used; the request's last token, and any
  // drafts, will be computed again, and it gets no RequestUpdate). Advances
  // num_computed_tokens past the tokens whose keys/values are now valid (the
  // rejected drafts' slots are simply computed again later), makes newly full
  // blocks findable, appends the tokens one by one, checks max_tokens / EOS /
  // stop tokens after each (a stop ends the request there: later tokens are
  // dropped), and frees finished requests. Requests aborted since schedule()
  // are skipped. Refuses, changing nothing, an output that does not match the
  // current state (wrong size, drafts that were not scheduled, applied twice).
  Result<std::vector<RequestUpdate>> update(const SchedulerOutput& out,
                                            std::span<const std::vector<int32_t>> sampled_token_ids);
  // The same with one token per request (no drafts scheduled).
  Result<std::vector<RequestUpdate>> update(const SchedulerOutput& out,
                                            std::span<const int32_t> sampled_token_ids);

  // Drafts to verify after a running request's tokens when it is next
  // scheduled as a decode (replacing any not yet scheduled). Cut to what the
  // request can still use: max_tokens and max_model_len count the drafts and
  // the token sampled after them. False for an id that is not running, and
  // for a model with recurrent state whose cache keeps no checkpoints.
  bool set_draft_tokens(const std::string& request_id, std::vector<int32_t> draft_token_ids);

  // Beam search: a new running request `child_id` in the parent's beam
  // group that is the parent but for its last output token, which is
  // `last_token` (the parent has just sampled its own, as after update()). It
  // shares the parent's KV blocks (KVCacheManager::fork) and is placed after
  // the group's last beam in the running queue. Refused, changing nothing,
  // for a parent that is not a running beam in that state, a child id in use,
  // or a last token that would have ended the request.
  Status fork(const std::string& parent_id, const std::string& child_id, int32_t last_token);

  // Ends a request in any state, freeing its blocks now. False if unknown.
  bool abort(const std::string& request_id);
  // Beam search: ends a beam the search dropped, freeing its blocks now (its
  // shared ones stay with its siblings), without counting a finished request.
  // False if unknown.
  bool drop_beam(const std::string& request_id);
  // Ends a request for a reason found outside the scheduler (a stop string):
  // `reason` must be a finished status.
  Status finish_request(const std::string& request_id, RequestStatus reason);

  // Offloading (kv_connector.h): from now on, cached blocks the pool evicts
  // are offered to `connector`, and admissions look past the pool's own
  // prefix blocks into it. The connector must outlive the scheduler.
  //
  // A load the connector defers parks its request (kLoadingRemoteKV) with the
  // blocks it allocated; other requests keep stepping. Each schedule() first
  // collects finished loads: a request whose blocks arrived has them cached
  // under their keys, gives its references back and waits at the front of the
  // queue, where its admission finds them as a prefix hit; a failed load
  // frees its blocks and the request is admitted again from the pool's own
  // blocks, computing the rest. An aborted request's blocks stay held until
  // its load is reported, so nothing the connector writes lands in a block
  // given to someone else.
  void set_connector(kv::KVConnector* connector);

  // Prefill for a remote decode (Request::kv_lease_id): the blocks a finished
  // request's lease holds, per KV group (empty for an unknown lease, or one
  // whose prompt had no full block), and the end of the lease, which frees
  // them. False if unknown.
  std::vector<std::vector<int32_t>> lease_blocks(uint64_t lease_id) const;
  bool end_lease(uint64_t lease_id);

  const Request* find(const std::string& request_id) const;
  bool has_unfinished_requests() const { return !requests_.empty(); }
  // Requests waiting for a connector's deferred load (they need no step until it finishes).
  int64_t num_loading() const { return static_cast<int64_t>(loading_.size()); }
  // Loads still under way, aborted requests' included (their blocks are held until they finish).
  bool has_loads_in_flight() const { return !loading_.empty() || !draining_.empty(); }
  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  // Requests that wait for another request's deferred load (they need no step until it finishes).
  int64_t num_waiting_for_loads() const;
  SchedulerStats stats() const;
  const SchedulerConfig& config() const { return config_; }
  // The engine lowers it to 1 while a beam search runs (its beams sample in
  // one batch), with no batch in flight.
  void set_batches_in_flight(int32_t n) { config_.batches_in_flight = n; }
  const kv::KVCacheManager& kv_cache() const { return kv_; }

  // The KV manager's invariants, plus: every request is in exactly one queue
  // with a matching status; only running requests hold blocks, enough for
  // their computed tokens; waiting ones have computed nothing; a beam group
  // is wholly running (side by side) or wholly waiting, has at most
  // beam_width beams, and the running requests' seats fit max_num_seqs.
  Status check_invariants() const;
  // A step's limits: budget, max_num_seqs, per-request chunk cap, and every
  // scheduled request's block table covering its new tokens.
  Status check_output(const SchedulerOutput& out) const;

 private:
  int64_t tokens_to_schedule(const Request& r, int64_t num_computed, int64_t budget) const;
  void preempt(Request& r);
  // Preempts the newest running request, or its whole beam group, taking any
  // of them already scheduled this step back out of `out`. True when
  // `needing` (the request that wants room) was among them.
  bool preempt_newest(const Request& needing, SchedulerOutput& out);
  // Admits the request at the front of the waiting queue, with the rest of
  // its beam group if it has one (all or none). False, changing nothing, when
  // they do not fit (seats, budget, blocks).
  bool admit_front(SchedulerOutput& out, int64_t& seats);
  // Running requests' seats of max_num_seqs: one each, beam_width per beam group.
  int64_t running_seats() const;
  void add_scheduled(SchedulerOutput& out, const Request& r, int64_t n, int64_t n_drafts,
                     std::vector<int32_t> new_blocks, bool is_new, bool resumed,
                     int64_t num_cached, int32_t state_source = -1);
  // Frees and forgets a request; the caller has removed it from its queue.
  // `counted`: a finished request in the stats (not a dropped beam).
  void retire(Request& r, RequestStatus reason, bool counted = true);

  // Gives the connector the cached blocks evicted since the last call, before
  // anything writes them again.
  void save_evictions();
  // Takes the request's prefix hit and KV slots for n new tokens after it
  // (n = tokens_to_schedule with budget `budget`), loading the blocks the
  // connector supplies; when a load fails, the request takes the pool's own
  // hit instead. Returns the new blocks, or nullopt (nothing held) when they
  // do not fit; *hit and *n are what was taken.
  // A load the connector defers sets *deferred (the request then holds its
  // blocks but is not scheduled; the loads are kept in loading_loads_). When
  // blocks the connector would supply are being loaded for another request
  // (another choice of the same prompt), nothing is taken and *wait_for names
  // that request: this one waits for those blocks rather than computing them.
  std::optional<std::vector<int32_t>> allocate_admission(const Request& r, int64_t budget, kv::PrefixHit* hit,
                                                         int64_t* n, bool may_defer, bool* deferred,
                                                         std::string* wait_for);
  // The loading request whose deferred load writes one of these keys, if any.
  const std::string* loading_owner_of(std::span<const kv::BlockTransfer> loads) const;
  // Puts the requests that wait for `owner`'s load back at the front of the queue.
  void release_waiting_for(const std::string& owner);
  // Applies the connector's finished deferred loads (see set_connector).
  void collect_finished_loads();
  // The KV manager's name for a lease's blocks.
  static std::string lease_name(uint64_t lease_id) { return "\x01lease:" + std::to_string(lease_id); }

  SchedulerConfig config_;
  kv::KVCacheManager kv_;
  kv::KVConnector* connector_ = nullptr;
  std::unordered_map<std::string, std::unique_ptr<Request>> requests_;  // unfinished ones
  std::deque<Request*> waiting_;  // FIFO; preempted requests re-enter at the front
  std::vector<Request*> running_;  // in admission order: the back is preempted first
  std::vector<Request*> loading_;  // waiting for a connector's deferred load, holding its blocks
  std::unordered_map<std::string, std::vector<kv::BlockTransfer>> loading_loads_;  // of loading_ and draining_
  std::unordered_set<std::string> draining_;  // aborted while loading: blocks held until the load ends
  // Requests waiting, holding nothing, for the load of the loading_ (or
  // draining_) request they are keyed by: its blocks are their prefix.
  std::unordered_map<std::string, std::vector<Request*>> waiting_for_load_;
  std::unordered_set<uint64_t> leases_;      // held leases (Request::kv_lease_id)
  std::vector<std::string> finished_since_schedule_;
  SchedulerStats stats_;
  // This step's prompt-chunk work left (context_positions_per_token > 0),
  // and whether a chunk has been scheduled in it (the first always gets a
  // token, so prompts progress however deep they are).
  double chunk_work_left_ = 0.0;
  bool step_has_chunk_ = false;
};

}  // namespace inferd
