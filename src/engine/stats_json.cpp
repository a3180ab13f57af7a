#include "engine/stats_json.h"

#include "kv/kv_cache_dtype.h"

namespace inferd {

nlohmann::json engine_stats_json(const EngineStats& s) {
  const SchedulerStats& sc = s.scheduler;
  // Grouped: steps, requests, KV cache, prefix cache, tokens, speculation, time.
  return {{"steps", sc.steps}, {"scheduled_tokens", sc.scheduled_tokens},
          {"mean_tokens_per_step", s.mean_tokens_per_step()}, {"max_step_tokens", sc.max_step_tokens},
          {"num_running", sc.num_running_requests}, {"num_waiting", sc.num_waiting_requests},
          {"preemptions", sc.preemptions}, {"finished", sc.finished}, {"aborted", sc.aborted},
          {"requests_added", s.requests_added},
          {"kv_cache_blocks", s.kv_total_blocks}, {"kv_used_blocks", sc.kv_used_blocks},
          {"kv_cache_dtype", kv::kv_cache_dtype_name(s.kv_cache_dtype)},
          {"kv_cache_dtype_skip_layers", s.kv_cache_skip_sliding_window ? "sliding_window" : ""},
          {"kv_capacity_tokens", s.kv_capacity_tokens}, {"kv_bytes_per_token", s.kv_bytes_per_token},
          {"kv_state_slots", s.kv_state_slots}, {"kv_state_bytes_per_sequence", s.kv_state_bytes_per_sequence},
          {"kv_state_bytes", s.kv_state_bytes}, {"kv_state_snapshots", s.kv_state_snapshots},
          {"kv_state_snapshots_cached", s.kv_state_snapshots_cached}, {"kv_state_checkpoints", s.kv_state_checkpoints},
          {"kv_free_blocks", sc.kv_free_blocks}, {"kv_usage", sc.kv_usage},
          {"prefix_cache_queried_tokens", sc.prefix_cache.queried_tokens},
          {"prefix_cache_hit_tokens", sc.prefix_cache.hit_tokens},
          {"prompt_tokens", s.prompt_tokens}, {"computed_prompt_tokens", s.computed_prompt_tokens},
          {"generation_tokens", s.generation_tokens}, {"computed_tokens", s.computed_tokens},
          {"spec_draft_tokens", s.speculative.draft_tokens}, {"spec_accepted_tokens", s.speculative.accepted_tokens},
          {"spec_mean_acceptance_length", s.speculative.mean_acceptance_length()},
          {"forward_seconds", s.forward_seconds}, {"draft_forward_seconds", s.draft_forward_seconds},
          {"collective_calls", s.collectives.calls}, {"collective_seconds", s.collectives.seconds},
          {"collective_mean_us", s.collectives.mean_us()}};
}

}  // namespace inferd
