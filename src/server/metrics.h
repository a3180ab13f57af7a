// Serving metrics in the Prometheus text exposition format (version 0.0.4),
// named like vLLM's with the `inferd:` prefix so existing dashboards work.
//
// Histograms and counters are fed once per finished request (from the engine's
// finished listener); gauges and engine-wide counters are read from the
// engine's stats snapshot at scrape time.
#pragma once
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace inferd::server {

// A cumulative histogram with fixed upper bounds (the +Inf bucket is implied).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double value);
  // Appends `name_bucket{...,le="..."}`, `name_sum` and `name_count` lines.
  void render(std::string& out, const std::string& name, const std::string& labels) const;
  uint64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> buckets_;  // per bound, not cumulative; the last is +Inf
  double sum_ = 0.0;
  uint64_t count_ = 0;
};

class ServingMetrics {
 public:
  explicit ServingMetrics(std::string model_name);

  // Thread-safe. Records a finished request's latencies and finish reason.
  void observe_finished(const RequestOutput& final_output);
  // Thread-safe. Prompts a kv_consumer computed itself although the request
  // named a producer holding their blocks (no transport yet: all of them),
  // and prompts a kv_producer prefilled for a remote decode.
  void count_kv_recomputed_prompts(int64_t n) { kv_recomputed_prompts_ += n; }
  void count_kv_produced_prompts(int64_t n) { kv_produced_prompts_ += n; }
  // Thread-safe. The whole exposition, engine gauges included.
  // `grammars`: the structured-output compiler's counters, if it exists.
  std::string render(const EngineStats& stats, int64_t num_waiting_extra,
                     const GrammarCompilerStats* grammars = nullptr) const;

 private:
  const std::string labels_;  // model_name="..."
  mutable std::mutex mu_;
  Histogram ttft_, itl_, tpot_, e2e_, queue_, prefill_, decode_;
  Histogram prompt_tokens_, generation_tokens_;
  std::map<std::string, uint64_t> success_by_reason_;
  std::atomic<int64_t> kv_recomputed_prompts_{0}, kv_produced_prompts_{0};
};

// Prometheus label values escape backslash, double quote and newline.
std::string escape_label_value(const std::string& v);

}  // namespace inferd::server
