// The router's counters at /metrics, Prometheus text, named `inferd_router:`:
// requests and upstream errors per instance and role, requests in flight
// there, and prefill fallbacks by reason (the request went to decode without
// transfer parameters, so the decode instance computed its prompt).
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "router/instance_choice.h"

namespace inferd::router {

enum class FallbackReason {
  kUnreachable,  // no connection to the prefill instance
  kFailed,       // it answered 5xx, or the exchange broke off
  kTimeout,      // no answer within --prefill-timeout
  kNoParams,     // it answered without kv_transfer_params (not a kv_producer)
};
const char* fallback_reason_name(FallbackReason r);

class RouterMetrics {
 public:
  void count_request(Role role, size_t instance);
  void count_upstream_error(Role role, size_t instance);
  void count_fallback(FallbackReason reason);
  // The whole exposition; in-flight gauges come from the chooser.
  std::string render(const InstanceChooser& chooser) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<Role, size_t>, int64_t> requests_, errors_;
  std::map<FallbackReason, int64_t> fallbacks_;
};

}  // namespace inferd::router
