#include "bench/serve_metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <initializer_list>
#include <sstream>
#include <string_view>

namespace inferd::bench {

namespace {

// Most output tokens in any whole second since the first request started.
// A chunk's tokens are counted at its arrival; when the server reported more
// tokens than chunks, each chunk carries its share.
double peak_output_tokens_per_second(const std::vector<RequestResult>& results) {
  double t0 = std::numeric_limits<double>::infinity();
  for (const RequestResult& r : results)
    if (r.success) t0 = std::min(t0, r.start_time);
  if (!std::isfinite(t0)) return 0.0;
  std::vector<double> per_second;
  for (const RequestResult& r : results) {
    if (!r.success || r.content_chunks == 0) continue;
    const double per_chunk = static_cast<double>(r.output_len) / static_cast<double>(r.content_chunks);
    double t = r.start_time + r.ttft;
    auto add = [&](double time) {
      const size_t second = static_cast<size_t>(std::max(0.0, time - t0));
      if (per_second.size() <= second) per_second.resize(second + 1, 0.0);
      per_second[second] += per_chunk;
    };
    add(t);
    for (double gap : r.itl) add(t += gap);
  }
  return per_second.empty() ? 0.0 : *std::max_element(per_second.begin(), per_second.end());
}

// Most successful requests in flight at one instant ([start, end) intervals).
int64_t peak_concurrency(const std::vector<RequestResult>& results) {
  std::vector<std::pair<double, int>> events;
  for (const RequestResult& r : results) {
    if (!r.success) continue;
    events.emplace_back(r.start_time, +1);
    events.emplace_back(r.start_time + r.latency, -1);
  }
  std::sort(events.begin(), events.end());  // at equal times, an end (-1) sorts before a start
  int64_t now = 0, peak = 0;
  for (const auto& e : events) peak = std::max(peak, now += e.second);
  return peak;
}

std::string percentile_word(double p) {
  char buf[32];
  if (p == std::floor(p)) std::snprintf(buf, sizeof buf, "%d", static_cast<int>(p));
  else std::snprintf(buf, sizeof buf, "%g", p);
  return buf;
}

// "{s:{fill}^{50}}": text centred in 50 columns (an odd spare column goes right).
std::string centred(const std::string& text, char fill) {
  constexpr size_t kWidth = 50;
  if (text.size() >= kWidth) return text;
  const size_t spare = kWidth - text.size();
  return std::string(spare / 2, fill) + text + std::string(spare - spare / 2, fill);
}

void line(std::ostringstream& out, const std::string& label, const std::string& value) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%-40s %-10s", label.c_str(), value.c_str());
  out << buf << "\n";
}

// Pieces joined by appending (GCC 12 warns falsely on "literal" + std::string).
std::string join(std::initializer_list<std::string_view> parts) {
  std::string s;
  for (std::string_view p : parts) s.append(p);
  return s;
}

std::string fixed2(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

struct MetricDesc {
  const char* key;     // "ttft"
  const char* name;    // "TTFT"
  const char* header;  // "Time to First Token"
  const Summary ServeMetrics::*summary;
};

constexpr MetricDesc kMetrics[] = {
    {"ttft", "TTFT", "Time to First Token", &ServeMetrics::ttft},
    {"tpot", "TPOT", "Time per Output Token (excl. 1st token)", &ServeMetrics::tpot},
    {"itl", "ITL", "Inter-token Latency", &ServeMetrics::itl},
    {"e2el", "E2EL", "End-to-end Latency", &ServeMetrics::e2el},
};

bool selected(const ServeRunInfo& info, const char* key) {
  return std::find(info.percentile_metrics.begin(), info.percentile_metrics.end(), key) !=
         info.percentile_metrics.end();
}

std::vector<std::string> split_csv(const std::string& csv) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(csv);
  while (std::getline(in, part, ',')) {
    const size_t b = part.find_first_not_of(" \t"), e = part.find_last_not_of(" \t");
    if (b != std::string::npos) parts.push_back(part.substr(b, e - b + 1));
  }
  return parts;
}

}  // namespace

ServeMetrics compute_serve_metrics(const std::vector<RequestResult>& results, double duration,
                                   const std::vector<double>& percentiles) {
  ServeMetrics m;
  m.duration = duration;
  std::vector<double> ttfts, tpots, itls, e2els;
  for (const RequestResult& r : results) {
    if (!r.success) {
      ++m.failed;
      m.output_lens.push_back(0);
      continue;
    }
    ++m.completed;
    m.total_input += r.prompt_len;
    m.total_output += r.output_len;
    m.total_cached += r.cached_len;
    m.output_lens.push_back(r.output_len);
    ttfts.push_back(r.ttft);
    e2els.push_back(r.latency);
    if (r.output_len > 1) tpots.push_back((r.latency - r.ttft) / static_cast<double>(r.output_len - 1));
    itls.insert(itls.end(), r.itl.begin(), r.itl.end());
  }
  if (duration > 0) {
    m.request_throughput = static_cast<double>(m.completed) / duration;
    m.output_throughput = static_cast<double>(m.total_output) / duration;
    m.total_token_throughput = static_cast<double>(m.total_input + m.total_output) / duration;
  }
  m.max_output_tokens_per_s = peak_output_tokens_per_second(results);
  m.max_concurrent_requests = peak_concurrency(results);
  m.ttft = summarize(std::move(ttfts), percentiles);
  m.tpot = summarize(std::move(tpots), percentiles);
  m.itl = summarize(std::move(itls), percentiles);
  m.e2el = summarize(std::move(e2els), percentiles);
  return m;
}

std::string format_result_block(const ServeMetrics& m, const ServeRunInfo& info) {
  std::ostringstream out;
  out << centred(" Serving Benchmark Result ", '=') << "\n";
  line(out, "Successful requests:", std::to_string(m.completed));
  line(out, "Failed requests:", std::to_string(m.failed));
  if (info.max_concurrency) line(out, "Maximum request concurrency:", std::to_string(*info.max_concurrency));
  if (std::isfinite(info.request_rate)) line(out, "Request rate configured (RPS):", fixed2(info.request_rate));
  line(out, "Benchmark duration (s):", fixed2(m.duration));
  line(out, "Total input tokens:", std::to_string(m.total_input));
  line(out, "Total generated tokens:", std::to_string(m.total_output));
  line(out, "Request throughput (req/s):", fixed2(m.request_throughput));
  line(out, "Output token throughput (tok/s):", fixed2(m.output_throughput));
  line(out, "Peak output token throughput (tok/s):", fixed2(m.max_output_tokens_per_s));
  line(out, "Peak concurrent requests:", fixed2(static_cast<double>(m.max_concurrent_requests)));
  line(out, "Total token throughput (tok/s):", fixed2(m.total_token_throughput));
  for (const MetricDesc& d : kMetrics) {
    if (!selected(info, d.key)) continue;
    const Summary& s = m.*d.summary;
    out << centred(d.header, '-') << "\n";
    line(out, join({"Mean ", d.name, " (ms):"}), fixed2(1e3 * s.mean));
    line(out, join({"Median ", d.name, " (ms):"}), fixed2(1e3 * s.median));
    for (const auto& [p, v] : s.percentiles)
      line(out, join({"P", percentile_word(p), " ", d.name, " (ms):"}), fixed2(1e3 * v));
  }
  out << std::string(50, '=') << "\n";
  return out.str();
}

nlohmann::json result_json(const ServeMetrics& m, const ServeRunInfo& info,
                           const std::vector<RequestResult>& results, bool with_texts) {
  nlohmann::json j;
  j["backend"] = info.backend;
  j["label"] = info.label;
  j["base_url"] = info.base_url;
  j["endpoint"] = info.endpoint;
  j["model_id"] = info.model_id;
  j["tokenizer_id"] = info.tokenizer_id;
  j["dataset_name"] = info.dataset_name;
  j["num_prompts"] = info.num_prompts;
  // JSON has no infinity; vLLM writes the string "inf" too.
  if (std::isfinite(info.request_rate)) j["request_rate"] = info.request_rate;
  else j["request_rate"] = "inf";
  j["burstiness"] = info.burstiness;
  j["max_concurrency"] = info.max_concurrency ? nlohmann::json(*info.max_concurrency) : nlohmann::json();
  j["duration"] = m.duration;
  j["completed"] = m.completed;
  j["failed"] = m.failed;
  j["total_input_tokens"] = m.total_input;
  j["total_output_tokens"] = m.total_output;
  j["total_cached_input_tokens"] = m.total_cached;  // not in vLLM's result: prefix-cache hits
  j["request_throughput"] = m.request_throughput;
  j["output_throughput"] = m.output_throughput;
  j["total_token_throughput"] = m.total_token_throughput;
  j["max_output_tokens_per_s"] = m.max_output_tokens_per_s;
  j["max_concurrent_requests"] = m.max_concurrent_requests;
  for (const MetricDesc& d : kMetrics) {
    if (!selected(info, d.key)) continue;
    const Summary& s = m.*d.summary;
    j[join({"mean_", d.key, "_ms"})] = 1e3 * s.mean;
    j[join({"median_", d.key, "_ms"})] = 1e3 * s.median;
    j[join({"std_", d.key, "_ms"})] = 1e3 * s.stddev;
    for (const auto& [p, v] : s.percentiles) j[join({"p", percentile_word(p), "_", d.key, "_ms"})] = 1e3 * v;
  }
  nlohmann::json input_lens = nlohmann::json::array(), cached_lens = nlohmann::json::array(), ttfts = nlohmann::json::array(),
                 itls = nlohmann::json::array(), latencies = nlohmann::json::array(),
                 start_times = nlohmann::json::array(), queue_times = nlohmann::json::array(),
                 errors = nlohmann::json::array(), texts = nlohmann::json::array();
  for (const RequestResult& r : results) {
    input_lens.push_back(r.prompt_len);
    cached_lens.push_back(r.cached_len);
    ttfts.push_back(r.ttft);
    itls.push_back(r.itl);
    latencies.push_back(r.latency);
    start_times.push_back(r.start_time);
    queue_times.push_back(r.queue_time);
    errors.push_back(r.error);
    if (with_texts) texts.push_back(r.generated_text);
  }
  j["input_lens"] = std::move(input_lens);
  j["cached_input_lens"] = std::move(cached_lens);
  j["output_lens"] = m.output_lens;
  j["ttfts"] = std::move(ttfts);
  j["itls"] = std::move(itls);
  j["latencies"] = std::move(latencies);
  j["start_times"] = std::move(start_times);
  j["queue_times"] = std::move(queue_times);
  j["errors"] = std::move(errors);
  if (with_texts) j["generated_texts"] = std::move(texts);
  j["percentile_metrics"] = info.percentile_metrics;
  j["metric_percentiles"] = info.percentiles;
  if (!info.extra.is_null()) j["config"] = info.extra;
  return j;
}

Result<std::vector<std::string>> parse_metric_names(const std::string& csv) {
  std::vector<std::string> out;
  for (const std::string& name : split_csv(csv)) {
    if (name != "ttft" && name != "tpot" && name != "itl" && name != "e2el")
      return make_error("unknown metric '" + name + "' (expected ttft, tpot, itl, e2el)");
    out.push_back(name);
  }
  return out;
}

Result<std::vector<double>> parse_percentiles(const std::string& csv) {
  std::vector<double> out;
  for (const std::string& part : split_csv(csv)) {
    size_t used = 0;
    double p = 0;
    try {
      p = std::stod(part, &used);
    } catch (...) {
      used = 0;
    }
    if (used != part.size() || !(p >= 0.0 && p <= 100.0))
      return make_error("percentile '" + part + "' is not a number in [0, 100]");
    out.push_back(p);
  }
  return out;
}

}  // namespace inferd::bench
