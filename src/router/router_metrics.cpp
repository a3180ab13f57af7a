#include "router/router_metrics.h"

#include "server/metrics.h"

namespace inferd::router {

namespace {
const char* role_name(Role r) { return r == Role::kPrefill ? "prefill" : "decode"; }

void header(std::string& out, const std::string& name, const char* type, const char* help) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}
}  // namespace

const char* fallback_reason_name(FallbackReason r) {
  switch (r) {
    case FallbackReason::kUnreachable: return "unreachable";
    case FallbackReason::kFailed: return "failed";
    case FallbackReason::kTimeout: return "timeout";
    case FallbackReason::kNoParams: return "no_params";
  }
  return "unknown";
}

void RouterMetrics::count_request(Role role, size_t instance) {
  std::lock_guard<std::mutex> lock(mu_);
  ++requests_[{role, instance}];
}

void RouterMetrics::count_upstream_error(Role role, size_t instance) {
  std::lock_guard<std::mutex> lock(mu_);
  ++errors_[{role, instance}];
}

void RouterMetrics::count_fallback(FallbackReason reason) {
  std::lock_guard<std::mutex> lock(mu_);
  ++fallbacks_[reason];
}

std::string RouterMetrics::render(const InstanceChooser& chooser) const {
  std::string out;
  // One sample per instance of both roles, zeros included, so a dashboard sees every instance.
  auto per_instance = [&](const std::string& name, const char* type, const char* help, auto value) {
    header(out, name, type, help);
    for (Role role : {Role::kPrefill, Role::kDecode})
      for (size_t i = 0; i < chooser.count(role); ++i)
        out += name + "{role=\"" + role_name(role) + "\",instance=\"" +
               server::escape_label_value(chooser.url(role, i)) + "\"} " + std::to_string(value(role, i)) + "\n";
  };
  std::lock_guard<std::mutex> lock(mu_);
  auto lookup = [](const std::map<std::pair<Role, size_t>, int64_t>& m, Role role, size_t i) {
    auto it = m.find({role, i});
    return it == m.end() ? int64_t{0} : it->second;
  };
  per_instance("inferd_router:requests_total", "counter", "Requests the router sent to the instance.",
               [&](Role role, size_t i) { return lookup(requests_, role, i); });
  per_instance("inferd_router:upstream_errors_total", "counter",
               "Requests to the instance that failed: no connection, a 5xx, or a response broken off.",
               [&](Role role, size_t i) { return lookup(errors_, role, i); });
  per_instance("inferd_router:requests_in_flight", "gauge", "Requests the router has under way at the instance.",
               [&](Role role, size_t i) { return chooser.in_flight(role, i); });
  const std::string name = "inferd_router:prefill_fallbacks_total";
  header(out, name, "counter",
         "Requests sent to decode without transfer parameters because prefill failed (the decode instance computed "
         "the prompt), by reason.");
  for (FallbackReason r : {FallbackReason::kUnreachable, FallbackReason::kFailed, FallbackReason::kTimeout,
                           FallbackReason::kNoParams}) {
    auto it = fallbacks_.find(r);
    out += name + "{reason=\"" + fallback_reason_name(r) + "\"} " +
           std::to_string(it == fallbacks_.end() ? 0 : it->second) + "\n";
  }
  return out;
}

}  // namespace inferd::router
