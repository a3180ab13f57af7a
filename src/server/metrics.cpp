#include "server/metrics.h"

#include <algorithm>
#include <cstdio>

#include "kv/kv_cache_dtype.h"

namespace inferd::server {

namespace {

std::string number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

std::string number(int64_t v) { return std::to_string(v); }

void header(std::string& out, const std::string& name, const char* type, const char* help) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

template <class T>
void sample(std::string& out, const std::string& name, const std::string& labels, T value) {
  out += name + "{" + labels + "} " + number(value) + "\n";
}

// Latency buckets in seconds: fine below a second (CPU decode steps are a few
// to tens of milliseconds), coarse up to minutes (queueing under overload).
std::vector<double> latency_bounds() {
  return {0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
          1.0,   2.5,    5.0,   7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0};
}
std::vector<double> token_count_bounds() {
  return {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000};
}

}  // namespace

std::string escape_label_value(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), buckets_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  ++buckets_[i];
  sum_ += value;
  ++count_;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& labels) const {
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative += buckets_[i];
    const std::string le = i < bounds_.size() ? number(bounds_[i]) : "+Inf";
    out += name + "_bucket{" + labels + ",le=\"" + le + "\"} " + std::to_string(cumulative) + "\n";
  }
  out += name + "_sum{" + labels + "} " + number(sum_) + "\n";
  out += name + "_count{" + labels + "} " + std::to_string(count_) + "\n";
}

ServingMetrics::ServingMetrics(std::string model_name)
    : labels_("model_name=\"" + escape_label_value(model_name) + "\""),
      ttft_(latency_bounds()),
      itl_(latency_bounds()),
      tpot_(latency_bounds()),
      e2e_(latency_bounds()),
      queue_(latency_bounds()),
      prefill_(latency_bounds()),
      decode_(latency_bounds()),
      prompt_tokens_(token_count_bounds()),
      generation_tokens_(token_count_bounds()) {
  for (const char* r : {"stop", "length", "abort"}) success_by_reason_[r] = 0;
}

void ServingMetrics::observe_finished(const RequestOutput& out) {
  const RequestMetrics& m = out.metrics;
  std::lock_guard<std::mutex> lock(mu_);
  ++success_by_reason_[out.finish_reason()];
  prompt_tokens_.observe(static_cast<double>(m.num_prompt_tokens));
  generation_tokens_.observe(static_cast<double>(m.num_output_tokens));
  if (m.first_scheduled_time > 0) queue_.observe(m.queue_time());
  if (m.first_token_time > 0) {
    ttft_.observe(m.time_to_first_token());
    if (m.first_scheduled_time > 0) prefill_.observe(m.first_token_time - m.first_scheduled_time);
    decode_.observe(m.finished_time - m.first_token_time);
  }
  for (double d : m.inter_token_latencies()) itl_.observe(d);
  if (m.token_times.size() >= 2)
    tpot_.observe((m.token_times.back() - m.token_times.front()) / static_cast<double>(m.token_times.size() - 1));
  e2e_.observe(m.e2e_latency());
}

std::string ServingMetrics::render(const EngineStats& stats, int64_t num_waiting_extra,
                                  const GrammarCompilerStats* grammars) const {
  std::string out;
  out.reserve(16384);
  const SchedulerStats& s = stats.scheduler;
  auto gauge = [&](const char* name, const char* help, double v) {
    const std::string n = std::string("inferd:") + name;
    header(out, n, "gauge", help);
    sample(out, n, labels_, v);
  };
  auto counter = [&](const char* name, const char* help, int64_t v) {
    const std::string n = std::string("inferd:") + name;
    header(out, n, "counter", help);
    sample(out, n, labels_, v);
  };
  gauge("num_requests_running", "Requests in the running batch.", static_cast<double>(s.num_running));
  gauge("num_requests_waiting", "Requests waiting to be scheduled (those waiting for pulled KV blocks included).",
        static_cast<double>(s.num_waiting + s.num_loading + num_waiting_extra));
  gauge("kv_cache_usage_perc", "Fraction of KV-cache blocks in use (1 means 100 percent).",
        stats.kv_total_blocks > 0 ? static_cast<double>(s.kv_used_blocks) / stats.kv_total_blocks : 0.0);
  {
    // Labelled with the dtype, so dashboards can compare instances whose
    // caches hold the same memory in another format.
    const std::string n = "inferd:kv_cache_capacity_tokens";
    header(out, n, "gauge", "Tokens of full context the KV cache holds, in its dtype (label kv_cache_dtype).");
    sample(out, n, labels_ + ",kv_cache_dtype=\"" + kv::kv_cache_dtype_name(stats.kv_cache_dtype) + "\"",
           stats.kv_capacity_tokens);
  }
  if (stats.kv_state_slots > 0) {
    // A model with recurrent layers: its states are out of the blocks above.
    gauge("recurrent_state_slots", "Sequences the recurrent-state slots let run at once (one slot each).",
          static_cast<double>(stats.kv_state_slots));
    gauge("recurrent_state_bytes",
          "Bytes of the recurrent-state slots (f32: running, checkpoints, snapshots, the spare slot).",
          static_cast<double>(stats.kv_state_bytes));
    gauge("recurrent_state_snapshot_slots", "Slots for the prefix cache's snapshots of the recurrent state.",
          static_cast<double>(stats.kv_state_snapshots));
    gauge("recurrent_state_snapshots_cached", "Snapshots of the recurrent state the prefix cache holds now.",
          static_cast<double>(stats.kv_state_snapshots_cached));
  }
  if (stats.collectives.calls > 0) {  // tensor parallelism: rank 0's exchanges with the other ranks
    counter("tensor_parallel_collectives_total",
            "MPI collectives of the forward passes (four all-gathers a layer and the logits' gather a step).",
            stats.collectives.calls);
    gauge("tensor_parallel_collective_seconds_total",
          "Seconds in those collectives, the wait for the slowest rank included.", stats.collectives.seconds);
  }
  counter("prompt_tokens_total", "Prompt tokens of the requests received.", stats.prompt_tokens);
  counter("generation_tokens_total", "Tokens generated.", stats.generation_tokens);
  counter("prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.",
          s.prefix_cache.queried_tokens);
  counter("prefix_cache_hits_total", "Prompt tokens found in the prefix cache.", s.prefix_cache.hit_tokens);
  counter("external_prefix_cache_hits_total", "Prompt tokens loaded from the KV offload tiers.",
          s.prefix_cache.external_hit_tokens);
  {
    // One series per offload tier that is on, labelled tier="host" or "disk".
    const kvstore::OffloadStats& off = stats.offload;
    std::vector<std::pair<const char*, const kvstore::TierStats*>> tiers;
    if (off.host_enabled) tiers.emplace_back("host", &off.host);
    if (off.disk_enabled) tiers.emplace_back("disk", &off.disk);
    auto per_tier = [&](const char* name, const char* type, const char* help, int64_t kvstore::TierStats::*field) {
      if (tiers.empty()) return;
      const std::string n = std::string("inferd:kv_offload_") + name;
      header(out, n, type, help);
      for (const auto& [tier, t] : tiers)
        out += n + "{" + labels_ + ",tier=\"" + tier + "\"} " + std::to_string(t->*field) + "\n";
    };
    per_tier("blocks", "gauge", "KV blocks held by the offload tier.", &kvstore::TierStats::blocks);
    per_tier("bytes", "gauge", "Bytes held by the offload tier.", &kvstore::TierStats::bytes);
    per_tier("capacity_bytes", "gauge", "Bound of the offload tier.", &kvstore::TierStats::capacity_bytes);
    per_tier("hits_total", "counter", "Prefix blocks looked up and found in the tier.", &kvstore::TierStats::hits);
    per_tier("misses_total", "counter", "Prefix blocks looked up and not found in the tier.",
             &kvstore::TierStats::misses);
    per_tier("loads_total", "counter", "Blocks loaded from the tier into the KV cache.", &kvstore::TierStats::loads);
    per_tier("saves_total", "counter", "Evicted blocks written to the tier.", &kvstore::TierStats::saves);
    per_tier("evictions_total", "counter", "Blocks the tier dropped to stay within its size.",
             &kvstore::TierStats::evictions);
    per_tier("dropped_blocks_total", "counter",
             "Blocks found bad (size, checksum, fingerprint, I/O) and deleted, never used.",
             &kvstore::TierStats::dropped);
  }
  const kvtransfer::TransferStats& xfer = stats.kv_transfer;
  counter("kv_transfer_recomputed_prompts_total",
          "Prompts whose KV blocks a kv_consumer was told to pull from a producer and computed itself instead "
          "(the transfer failed, timed out or was refused, or no blocks were named).",
          kv_recomputed_prompts_.load() + xfer.failed);
  counter("kv_transfer_received_prompts_total", "Prompts whose KV blocks a kv_consumer pulled from a producer.",
          xfer.received);
  counter("kv_transfer_waited_for_pulls_total",
          "Requests (other choices of a prompt, n > 1) that waited for a pull of their prefix already under way "
          "instead of computing it.",
          s.waited_for_loads);
  counter("kv_transfer_unused_prompts_total",
          "Prompts a kv_consumer was told to pull whose blocks it needed none of (its own prefix cache held them).",
          xfer.unused);
  counter("kv_transfer_received_blocks_total", "KV blocks a kv_consumer pulled from producers.",
          xfer.agent.blocks_received);
  counter("kv_transfer_received_bytes_total", "Bytes of KV blocks a kv_consumer pulled from producers.",
          xfer.agent.bytes_received);
  {
    const std::string n = "inferd:kv_transfer_seconds_total";
    header(out, n, "counter", "Time a kv_consumer's successful pulls took, summed (start to lease release).");
    sample(out, n, labels_, xfer.agent.pull_seconds);
  }
  counter("kv_transfer_timeouts_total", "A kv_consumer's pulls that timed out.", xfer.agent.pulls_timed_out);
  counter("kv_transfer_shared_memory_handshakes_total",
          "A kv_consumer's handshakes with producers on its host whose blocks it reads over shared memory (CMA).",
          xfer.agent.shared_memory_handshakes);
  counter("kv_transfer_mapped_handshakes_total",
          "Of those, the ones that mapped the producer's KV pool (its memfds) and copy blocks with memcpy.",
          xfer.agent.mapped_handshakes);
  counter("kv_transfer_unused_leases_released_total",
          "Leases a kv_consumer gave back without pulling (its pool held the prefix), before they expire.",
          xfer.agent.leases_released_unused);
  counter("kv_transfer_refused_handshakes_total",
          "Handshakes refused for a mismatched model or KV layout (a consumer's count plus a producer's).",
          xfer.agent.refusals + xfer.agent.peers_refused);
  counter("kv_transfer_produced_prompts_total", "Prompts a kv_producer prefilled for a remote decode instance.",
          kv_produced_prompts_.load());
  gauge("kv_transfer_leases", "Leases a kv_producer holds on prompts' KV blocks for remote decodes.",
        stats.kv_leases.held);
  gauge("kv_transfer_lease_blocks", "KV blocks a kv_producer's leases hold.", stats.kv_lease_blocks);
  counter("kv_transfer_leases_released_total", "Leases a consumer released after pulling.", stats.kv_leases.released);
  counter("kv_transfer_leases_expired_total", "Leases that expired unreleased (their blocks freed).",
          stats.kv_leases.expired);
  counter("num_preemptions_total", "Requests preempted for lack of KV-cache space.", s.preemptions);
  counter("engine_steps_total", "Engine steps (forward passes).", s.steps);
  const SpeculativeStats& spec = stats.speculative;
  counter("spec_decode_num_drafts_total", "Speculative verifications (one per request and step with drafts).",
          spec.drafts);
  counter("spec_decode_num_draft_tokens_total", "Draft tokens verified.", spec.draft_tokens);
  counter("spec_decode_num_accepted_tokens_total", "Draft tokens accepted.", spec.accepted_tokens);
  {
    const std::string n = "inferd:spec_decode_num_accepted_tokens_per_pos_total";
    header(out, n, "counter", "Draft tokens accepted, by position in the draft.");
    for (size_t pos = 0; pos < spec.accepted_per_position.size(); ++pos)
      out += n + "{" + labels_ + ",position=\"" + std::to_string(pos) + "\"} " +
             std::to_string(spec.accepted_per_position[pos]) + "\n";
  }
  if (grammars) {
    counter("structured_output_compiles_total",
            "Structured-output constraints compiled (one per distinct schema or grammar while cached).",
            grammars->compiles);
    counter("structured_output_compile_cache_hits_total",
            "Structured-output constraints served by an earlier compilation.", grammars->cache_hits);
    counter("structured_output_compile_failures_total", "Structured-output constraints refused as invalid.",
            grammars->failures);
  }

  std::lock_guard<std::mutex> lock(mu_);
  {
    const std::string n = "inferd:request_success_total";
    header(out, n, "counter", "Finished requests, by finish reason.");
    for (const auto& [reason, count] : success_by_reason_)
      out += n + "{" + labels_ + ",finished_reason=\"" + escape_label_value(reason) + "\"} " +
             std::to_string(count) + "\n";
  }
  auto histogram = [&](const char* name, const char* help, const Histogram& h) {
    const std::string n = std::string("inferd:") + name;
    header(out, n, "histogram", help);
    h.render(out, n, labels_);
  };
  histogram("time_to_first_token_seconds", "Time from arrival to the first token.", ttft_);
  histogram("inter_token_latency_seconds", "Time between consecutive tokens of a request.", itl_);
  histogram("request_time_per_output_token_seconds", "Mean time per output token after the first, per request.",
            tpot_);
  histogram("e2e_request_latency_seconds", "Time from arrival to finish.", e2e_);
  histogram("request_queue_time_seconds", "Time from arrival to first scheduling.", queue_);
  histogram("request_prefill_time_seconds", "Time from first scheduling to the first token.", prefill_);
  histogram("request_decode_time_seconds", "Time from the first token to finish.", decode_);
  histogram("request_prompt_tokens", "Prompt tokens per finished request.", prompt_tokens_);
  histogram("request_generation_tokens", "Generated tokens per finished request.", generation_tokens_);
  return out;
}

}  // namespace inferd::server
