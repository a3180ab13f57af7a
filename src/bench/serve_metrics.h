// Aggregate figures of a serving benchmark from its per-request results, with
// the definitions of vLLM's `vllm bench serve` so the two tools' numbers can
// be set side by side: TPOT is (latency - TTFT) / (output tokens - 1) per
// request with more than one token; ITL pools every gap between chunks of
// every request; throughputs divide by the benchmark's wall time.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bench/request_result.h"
#include "bench/stats.h"
#include "core/result.h"

namespace inferd::bench {

struct ServeMetrics {
  int64_t completed = 0;
  int64_t failed = 0;
  int64_t total_input = 0;   // of completed requests
  int64_t total_output = 0;  // of completed requests
  int64_t total_cached = 0;  // prompt tokens served from the server's prefix cache, where it says
  double duration = 0.0;
  double request_throughput = 0.0;
  double output_throughput = 0.0;
  double total_token_throughput = 0.0;
  double max_output_tokens_per_s = 0.0;  // most output chunks in any whole second
  int64_t max_concurrent_requests = 0;   // most requests in flight at one instant
  // In seconds; printed and saved in milliseconds.
  Summary ttft, tpot, itl, e2el;
  std::vector<int64_t> output_lens;  // per request, 0 for a failed one
};

ServeMetrics compute_serve_metrics(const std::vector<RequestResult>& results, double duration,
                                   const std::vector<double>& percentiles);

// What the run was, for the result block and the JSON.
struct ServeRunInfo {
  std::string backend;  // "openai" (completions) or "openai-chat"
  std::string label;
  std::string base_url;
  std::string endpoint;
  std::string model_id;
  std::string tokenizer_id;
  std::string dataset_name;
  int64_t num_prompts = 0;
  double request_rate = 0.0;  // infinity: all at once
  double burstiness = 1.0;
  std::optional<int64_t> max_concurrency;
  std::vector<std::string> percentile_metrics;  // of "ttft", "tpot", "itl", "e2el"
  std::vector<double> percentiles;
  nlohmann::json extra;  // the flags, recorded as given
};

// vLLM's result block: 50 columns, a label in 40 and the value after it.
std::string format_result_block(const ServeMetrics& m, const ServeRunInfo& info);

// vLLM's result JSON fields (duration, completed, failed, total_input_tokens,
// ..., mean_/median_/std_/pNN_ metric_ms) plus the per-request arrays
// (input_lens, output_lens, ttfts, itls, latencies, start_times, errors).
// Generated texts only when asked: they are large.
nlohmann::json result_json(const ServeMetrics& m, const ServeRunInfo& info,
                           const std::vector<RequestResult>& results, bool with_texts);

// "ttft,tpot" -> {"ttft", "tpot"}; fails on a name other than ttft, tpot, itl, e2el.
Result<std::vector<std::string>> parse_metric_names(const std::string& csv);
// "90,99,99.9" -> {90, 99, 99.9}; fails on anything that is not a number in [0, 100].
Result<std::vector<double>> parse_percentiles(const std::string& csv);

}  // namespace inferd::bench
