// One generation request as the scheduler tracks it. The caller fills in the
// inputs; the scheduler owns the state below them and is the only one that
// changes it (update() appends tokens and checks stop conditions).
#pragma once
#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "sampling/sampler.h"

namespace inferd {

enum class RequestStatus {
  kWaiting,
  kRunning,
  kPreempted,        // waiting again after its blocks were taken; will recompute
  kLoadingRemoteKV,  // holds blocks a connector is filling (a KV transfer); then waits again
  kFinishedStopped,  // EOS, a stop token, or a stop string (finished by the engine)
  kFinishedLength,   // max_tokens reached (or the model's context)
  kFinishedAborted,  // the client went away, or the engine gave up on it
};

inline bool is_finished(RequestStatus s) { return s >= RequestStatus::kFinishedStopped; }

// The OpenAI `finish_reason` of a finished request ("" while unfinished).
inline const char* finish_reason(RequestStatus s) {
  switch (s) {
    case RequestStatus::kFinishedStopped: return "stop";
    case RequestStatus::kFinishedLength: return "length";
    case RequestStatus::kFinishedAborted: return "abort";
    default: return "";
  }
}

struct Request {
  // ---- inputs, set by the caller of Scheduler::add_request ----
  std::string id;
  std::vector<int32_t> prompt_token_ids;
  SamplingParams sampling;  // used by the engine's sampler, not by the scheduler
  int64_t max_tokens = 16;  // output tokens at most
  std::optional<int32_t> eos_token_id;
  std::vector<int32_t> stop_token_ids;  // finish on any of these, even with ignore_eos
  bool ignore_eos = false;
  std::string cache_salt;     // requests share cached prefixes only with equal salts
  double arrival_time = 0.0;  // seconds (steady clock); 0: set by add_request
  // Beam search: the beams of one request are requests of their own that
  // share beam_group (empty: a request alone). A group's beams are admitted
  // and preempted together, stay side by side in the running queue, and take
  // beam_width seats of max_num_seqs whatever their number (the engine keeps
  // at most beam_width alive); Scheduler::fork makes a beam's siblings.
  std::string beam_group;
  int32_t beam_width = 1;
  // Prefill for a remote decode: when the request finishes (not aborted), the
  // full blocks of its prompt stay held under this lease (non-zero) until
  // Scheduler::end_lease (server/kv_transfer.h).
  uint64_t kv_lease_id = 0;
  // Prompt logprobs: every prompt position gets a row of logits, computed in
  // the pass that fills its KV, so the request takes nothing from the prefix
  // cache (a cached position has no logits) and its prompt is fed at most
  // kMaxPromptLogitRowsPerStep positions a step (Scheduler).
  bool needs_prompt_logits = false;
  // An embedding or rerank request: the model's pooled output of the whole
  // prompt (Model::n_logits floats), computed in one step (never chunked: an
  // encoder attends to its whole input at once) and with no token sampled;
  // it looks nothing up in the prefix cache, caches nothing, and finishes
  // after that step.
  bool pooled = false;

  // ---- state, kept by the scheduler ----
  std::vector<int32_t> output_token_ids;
  std::vector<int32_t> all_token_ids;  // prompt then output: what is fed and hashed
  // Tokens whose keys/values are in the cache. The next step feeds
  // all_token_ids[num_computed_tokens ..]; while running, at least the last
  // token (just sampled, or the last of the prompt) is still to compute.
  int64_t num_computed_tokens = 0;
  RequestStatus status = RequestStatus::kWaiting;
  int64_t num_cached_prompt_tokens = 0;  // prefix-cache hit at first admission
  int32_t num_preemptions = 0;
  uint64_t cache_key = 0;  // hash of cache_salt, the extra key of block hashes
  // Draft tokens proposed to follow all_token_ids, verified by the next step
  // that schedules the request as a decode (Scheduler::set_draft_tokens).
  std::vector<int32_t> draft_token_ids;
  // Recurrent layers: drafts were rejected, so the state in its slot is past
  // num_computed_tokens; its next step starts from the checkpoint with this
  // index (KVCacheManager::state_checkpoint_slot), the state at
  // num_computed_tokens. -1: its own slot's state is the right one.
  int32_t restore_state_checkpoint = -1;
  // A connector's deferred load for it failed: it is admitted again from the
  // pool's own blocks only, computing the rest.
  bool kv_load_failed = false;
  // Its last scheduled batch is still in a pipeline (SchedulerConfig::
  // batches_in_flight > 1): it is not scheduled or preempted again until
  // update() takes that batch's tokens.
  bool in_flight = false;

  int64_t num_prompt_tokens() const { return static_cast<int64_t>(prompt_token_ids.size()); }
  int64_t num_output_tokens() const { return static_cast<int64_t>(output_token_ids.size()); }
  int64_t num_tokens() const { return static_cast<int64_t>(all_token_ids.size()); }
  bool finished() const { return is_finished(status); }

  // A token that ends the request when it is sampled: EOS (unless
  // ignore_eos) or one of the stop tokens.
  bool is_stop_token(int32_t token) const {
    return (!ignore_eos && eos_token_id && token == *eos_token_id) ||
           std::find(stop_token_ids.begin(), stop_token_ids.end(), token) != stop_token_ids.end();
  }

  void append_output_token(int32_t token) {
    output_token_ids.push_back(token);
    all_token_ids.push_back(token);
  }
};

}  // namespace inferd
