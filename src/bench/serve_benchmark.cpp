#include "bench/serve_benchmark.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <deque>
#include <exception>
#include <random>

#include "bench/http_client.h"
#include "bench/sse.h"

namespace inferd::bench {

namespace asio = boost::asio;

namespace {

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

Clock::duration to_duration(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

// A FIFO counting semaphore for coroutines that share one thread. A waiter
// parks on a timer that never expires; release() hands its permit over by
// cancelling that timer.
class AsyncSemaphore {
 public:
  AsyncSemaphore(asio::any_io_executor executor, int64_t permits)
      : executor_(std::move(executor)), permits_(permits) {}

  asio::awaitable<void> acquire() {
    if (permits_ > 0 && waiters_.empty()) {
      --permits_;
      co_return;
    }
    auto timer = std::make_shared<asio::steady_timer>(executor_, asio::steady_timer::time_point::max());
    waiters_.push_back(timer);
    boost::system::error_code ec;
    co_await timer->async_wait(asio::redirect_error(asio::use_awaitable, ec));
  }

  void release() {
    if (waiters_.empty()) {
      ++permits_;
      return;
    }
    waiters_.front()->cancel();
    waiters_.pop_front();
  }

 private:
  asio::any_io_executor executor_;
  int64_t permits_;
  std::deque<std::shared_ptr<asio::steady_timer>> waiters_;
};

// Waits until a count of started tasks has all finished.
class WaitGroup {
 public:
  explicit WaitGroup(asio::any_io_executor executor) : timer_(executor, asio::steady_timer::time_point::max()) {}
  void add() { ++pending_; }
  void done() {
    if (--pending_ == 0) timer_.cancel();
  }
  asio::awaitable<void> wait() {
    while (pending_ > 0) {
      boost::system::error_code ec;
      timer_.expires_at(asio::steady_timer::time_point::max());
      co_await timer_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    }
  }

 private:
  asio::steady_timer timer_;
  int64_t pending_ = 0;
};

asio::awaitable<void> sleep_until(Clock::time_point t) {
  asio::steady_timer timer(co_await asio::this_coro::executor, t);
  boost::system::error_code ec;
  co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
}

// One streamed request. `t0` is the benchmark's start; times in the result are relative to it.
asio::awaitable<RequestResult> send_request(HttpClient& client, const std::string& endpoint, ApiKind kind,
                                            const std::string& body, int64_t dataset_prompt_len,
                                            Clock::time_point t0) {
  RequestResult r;
  r.prompt_len = dataset_prompt_len;
  SseParser sse;
  std::string stream_error;
  std::optional<TokenUsage> usage;
  std::string finish_reason;
  const Clock::time_point start = Clock::now();
  Clock::time_point last_chunk = start, end = start;

  auto on_event = [&](const SseEvent& event, Clock::time_point received) {
    if (!stream_error.empty()) return;
    auto chunk = parse_stream_chunk(kind, event.data);
    if (!chunk) {
      stream_error = chunk.error().message;
      return;
    }
    if (chunk->done) return;
    if (!chunk->error.empty()) {
      stream_error = "server error: " + chunk->error;
      return;
    }
    if (chunk->usage) usage = chunk->usage;
    if (!chunk->finish_reason.empty()) finish_reason = chunk->finish_reason;
    if (chunk->text.empty()) return;
    if (r.content_chunks == 0) r.ttft = seconds(received - start);
    else r.itl.push_back(seconds(received - last_chunk));
    last_chunk = received;
    ++r.content_chunks;
    r.generated_text += chunk->text;
  };

  Status status = co_await client.post_json(
      endpoint, body, [&](std::string_view piece, Clock::time_point received) {
        end = received;
        if (!stream_error.empty()) return;
        Status fed = sse.feed(piece, [&](const SseEvent& e) { on_event(e, received); });
        if (!fed) stream_error = fed.error().message;
      });
  sse.finish([&](const SseEvent& e) { on_event(e, end); });

  r.start_time = seconds(start - t0);
  r.latency = seconds(end - start);
  if (usage) {
    r.usage_reported = true;
    if (usage->prompt_tokens > 0) r.prompt_len = usage->prompt_tokens;
    r.cached_len = usage->cached_tokens;
  }
  r.output_len = usage && usage->completion_tokens > 0 ? usage->completion_tokens : r.content_chunks;
  if (!status) r.error = status.error().message;
  else if (!stream_error.empty()) r.error = stream_error;
  // As vLLM: without text there is no first token to time (a model that
  // stops at once needs ignore_eos or another prompt to be benchmarked).
  else if (r.content_chunks == 0)
    r.error = "the stream carried no output text" +
              (finish_reason.empty() ? std::string() : " (finish_reason '" + finish_reason + "')");
  r.success = r.error.empty();
  if (!r.success) {
    r.output_len = 0;
    r.ttft = 0.0;
    r.itl.clear();
  }
  co_return r;
}

struct Runner {
  const ServeBenchmarkConfig& config;
  const std::vector<SampleRequest>& requests;
  ApiKind kind;
  std::vector<std::string> bodies;
  asio::any_io_executor executor;
  HttpClient client;
  AsyncSemaphore slots;
  ServeBenchmarkRun run;
  Status status;
  int64_t finished = 0;

  Runner(const ServeBenchmarkConfig& c, const std::vector<SampleRequest>& r, asio::any_io_executor ex)
      : config(c),
        requests(r),
        kind(api_kind_of_endpoint(c.endpoint)),
        executor(ex),
        client(ex, c.base, std::chrono::milliseconds(static_cast<int64_t>(c.request_timeout_s * 1e3))),
        slots(ex, c.max_concurrency ? *c.max_concurrency : int64_t{1} << 40) {}

  void report_progress() {
    if (!config.progress) return;
    std::fprintf(stderr, "\r%lld/%zu requests done", static_cast<long long>(finished), requests.size());
    if (static_cast<size_t>(finished) == requests.size()) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  }

  // One request as the benchmark sees it: it arrives, waits for a slot, runs.
  asio::awaitable<void> arrive(size_t i, Clock::time_point t0, WaitGroup& group, bool record) {
    const Clock::time_point arrival = Clock::now();
    co_await slots.acquire();
    RequestResult r;
    try {
      r = co_await send_request(client, config.endpoint, kind, bodies[i], requests[i].prompt_len, t0);
    } catch (const std::exception& e) {
      r.error = std::string("client error: ") + e.what();
    }
    slots.release();
    r.queue_time = std::max(0.0, r.start_time - seconds(arrival - t0));
    if (record) {
      run.results[i] = std::move(r);
      ++finished;
      report_progress();
    }
    group.done();
  }

  asio::awaitable<void> main() {
    if (config.ready_check_timeout_s > 0) {
      config.log("Starting initial single prompt test run...");
      const Clock::time_point deadline = Clock::now() + to_duration(config.ready_check_timeout_s);
      for (;;) {
        RequestResult r = co_await send_request(client, config.endpoint, kind, bodies[0],
                                                requests[0].prompt_len, Clock::now());
        if (r.success) break;
        if (Clock::now() >= deadline) {
          status = make_error("initial test run failed: " + r.error);
          co_return;
        }
        co_await sleep_until(Clock::now() + std::chrono::seconds(1));
      }
      config.log("Initial test run completed.");
    }
    if (config.num_warmups > 0) {
      config.log("Warming up with " + std::to_string(config.num_warmups) + " requests...");
      WaitGroup warm(executor);
      for (int64_t w = 0; w < config.num_warmups; ++w) {
        warm.add();
        asio::co_spawn(executor, arrive(0, Clock::now(), warm, /*record=*/false), asio::detached);
      }
      co_await warm.wait();
      config.log("Warmup run completed.");
    }
    config.log("Starting main benchmark run...");
    const bool all_at_once = !(config.request_rate > 0) || std::isinf(config.request_rate);
    char rate[64];
    std::snprintf(rate, sizeof rate, "%g", config.request_rate);
    config.log(std::string("Traffic request rate: ") + (all_at_once ? "inf" : rate));
    char burst[96];
    const int digits = config.burstiness == std::floor(config.burstiness) ? 1 : 3;  // "1.0" as vLLM prints it
    std::snprintf(burst, sizeof burst, "Burstiness factor: %.*f (%s)", digits, config.burstiness,
                  config.burstiness == 1.0 ? "Poisson process" : "Gamma distribution");
    config.log(burst);
    config.log("Maximum request concurrency: " +
               (config.max_concurrency ? std::to_string(*config.max_concurrency) : std::string("None")));

    const std::vector<double> offsets =
        arrival_offsets(requests.size(), all_at_once ? INFINITY : config.request_rate, config.burstiness,
                        config.seed);
    run.results.assign(requests.size(), RequestResult{});
    WaitGroup group(executor);
    const Clock::time_point t0 = Clock::now();
    for (size_t i = 0; i < requests.size(); ++i) {
      const Clock::time_point at = t0 + to_duration(offsets[i]);
      if (at > Clock::now()) co_await sleep_until(at);
      group.add();
      asio::co_spawn(executor, arrive(i, t0, group, /*record=*/true), asio::detached);
    }
    co_await group.wait();
    run.duration = seconds(Clock::now() - t0);
  }
};

// co_spawn needs default-constructible results; Result<T> is not, so it is stored instead.
asio::awaitable<void> fetch_into(HttpClient& client, std::string endpoint,
                                 std::optional<Result<std::string>>& out) {
  try {
    out = co_await client.get(std::move(endpoint));
  } catch (const std::exception& e) {
    out = Result<std::string>(make_error(e.what()));
  }
}

}  // namespace

std::vector<double> arrival_offsets(size_t n, double request_rate, double burstiness, uint64_t seed) {
  std::vector<double> offsets(n, 0.0);
  if (!(request_rate > 0) || std::isinf(request_rate) || n == 0) return offsets;
  std::mt19937_64 rng(seed);
  std::gamma_distribution<double> gap(burstiness, 1.0 / (request_rate * burstiness));
  double t = 0.0;
  // The first request goes at once; the gaps separate the ones after it.
  for (size_t i = 1; i < n; ++i) offsets[i] = t += gap(rng);
  return offsets;
}

Result<ServeBenchmarkRun> run_serve_benchmark(const ServeBenchmarkConfig& config,
                                              const std::vector<SampleRequest>& requests) {
  if (requests.empty()) return make_error("no requests to send");
  if (config.max_concurrency && *config.max_concurrency < 1) return make_error("max concurrency must be at least 1");
  if (!(config.burstiness > 0)) return make_error("burstiness must be positive");
  asio::io_context io;
  Runner runner(config, requests, io.get_executor());
  // Bodies are serialized before timing starts, so arrivals are not delayed by it.
  runner.bodies.reserve(requests.size());
  for (const SampleRequest& r : requests) {
    auto body = make_request_body(runner.kind, r, config.request);
    if (!body) return body.error();
    runner.bodies.push_back(body->dump());
  }
  std::exception_ptr failure;
  asio::co_spawn(io, runner.main(), [&](std::exception_ptr e) { failure = e; });
  io.run();
  if (failure) {
    try {
      std::rethrow_exception(failure);
    } catch (const std::exception& e) {
      return make_error(std::string("benchmark client failed: ") + e.what());
    }
  }
  if (!runner.status) return runner.status.error();
  return std::move(runner.run);
}

Result<std::string> first_served_model(const BaseUrl& base, double timeout_s) {
  asio::io_context io;
  HttpClient client(io.get_executor(), base, std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1e3)));
  std::optional<Result<std::string>> body;
  asio::co_spawn(io, fetch_into(client, "/v1/models", body), asio::detached);
  io.run();
  if (!body) return make_error("cannot list the server's models");
  if (!*body) return make_error("cannot list the server's models: " + body->error().message);
  const nlohmann::json j = nlohmann::json::parse(**body, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("data") || !j["data"].is_array() || j["data"].empty() ||
      !j["data"][0].is_object() || !j["data"][0].contains("id") || !j["data"][0]["id"].is_string())
    return make_error("the server's /v1/models lists no model");
  return j["data"][0]["id"].get<std::string>();
}

}  // namespace inferd::bench
