// A load generator for OpenAI-compatible servers (the engine behind
// `inferd bench serve`): requests arrive as a Poisson process (or all at
// once), at most max_concurrency in flight; every response is streamed and
// timed at each server-sent event on the steady clock.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "bench/base_url.h"
#include "bench/dataset.h"
#include "bench/openai_api.h"
#include "bench/request_result.h"
#include "core/result.h"

namespace inferd::bench {

struct ServeBenchmarkConfig {
  BaseUrl base;
  std::string endpoint = "/v1/completions";
  RequestOptions request;  // model, ignore_eos, temperature, ...
  double request_rate = 0.0;  // requests/s; infinity (or <= 0): all arrive at once
  double burstiness = 1.0;    // gamma shape of the gaps; 1 = Poisson
  std::optional<int64_t> max_concurrency;
  int64_t num_warmups = 0;        // requests of the first prompt before timing starts
  double ready_check_timeout_s = 0.0;  // > 0: retry a first request until it succeeds
  double request_timeout_s = 600.0;    // longest silence from the server
  uint64_t seed = 0;                   // arrival times
  bool progress = false;               // a progress line on stderr
  std::function<void(const std::string&)> log = [](const std::string&) {};
};

struct ServeBenchmarkRun {
  std::vector<RequestResult> results;  // in dataset order
  double duration = 0.0;               // first arrival to last response, seconds
};

// Fails only if the run could not take place (bad config, no server ready in
// time); failed requests are recorded in the results.
Result<ServeBenchmarkRun> run_serve_benchmark(const ServeBenchmarkConfig& config,
                                              const std::vector<SampleRequest>& requests);

// The first model id the server lists at /v1/models.
Result<std::string> first_served_model(const BaseUrl& base, double timeout_s);

// Arrival offsets in seconds from the start: gaps drawn from a gamma
// distribution of shape `burstiness` and mean 1 / rate (exponential, i.e. a
// Poisson process, for burstiness 1); all zero for an infinite rate.
std::vector<double> arrival_offsets(size_t n, double request_rate, double burstiness, uint64_t seed);

}  // namespace inferd::bench
