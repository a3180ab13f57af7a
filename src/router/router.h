// `inferd router`: the OpenAI API in front of prefill and decode instances
// (prefill/decode disaggregation, vLLM's NixlConnector proxy protocol).
//
// A generation request (/v1/completions, /v1/chat/completions) goes first to
// a prefill instance with max_tokens 1, stream false and kv_transfer_params
// {"do_remote_decode": true}; the kv_transfer_params of its answer (where its
// prompt's KV blocks are) go with the original request to a decode instance,
// whose response is relayed to the client unchanged, streamed or whole.
//
// Faults: a 4xx from prefill is the client's error and is relayed as is; a
// prefill instance that is unreachable, fails, times out or answers without
// parameters costs the request nothing but time: it goes to decode without
// parameters and the decode instance computes the prompt (counted as a
// fallback). No decode instance reachable: 503. A client that goes away
// closes the upstream connection, so the instance aborts the request.
//
// /v1/models and /health are passed to a decode instance; /metrics is the
// router's own (router_metrics.h). After SIGTERM the router drains (as inferd
// serve does): generation requests and /health get 503 while the requests
// under way finish.
#pragma once
#include <utility>

#include <boost/asio/awaitable.hpp>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "bench/base_url.h"
#include "core/result.h"
#include "router/instance_choice.h"
#include "router/router_metrics.h"
#include "server/http_server.h"

namespace inferd::router {

struct RouterOptions {
  std::vector<std::string> prefill;  // instance base URLs, http://host:port
  std::vector<std::string> decode;
  std::string api_key;  // empty: no authentication at the router
  std::chrono::milliseconds connect_timeout{5000};
  // A prefill answer slower than this is given up: the request goes to decode
  // without parameters (its prompt is computed there).
  std::chrono::milliseconds prefill_timeout{60000};
  ChoiceConfig choice;
};

// The body sent to prefill: one token, not streamed, one choice, asking the
// instance to keep the prompt's blocks for a remote decode.
nlohmann::ordered_json prefill_body(const nlohmann::ordered_json& request);
// The body sent to decode: the client's, with the prefill answer's
// kv_transfer_params (none: the client's body as it was).
nlohmann::ordered_json decode_body(const nlohmann::ordered_json& request, const nlohmann::json* kv_transfer_params);

class Router {
 public:
  // Fails with a message naming a malformed URL.
  static Result<std::unique_ptr<Router>> create(RouterOptions options);

  boost::asio::awaitable<void> handle(server::Exchange& ex);
  // The drain after SIGTERM: from now on generation requests get 503 with
  // Retry-After and /health 503 {"status": "draining"} (not asked of an
  // instance), while the requests already relayed run on.
  void begin_drain() { draining_.store(true); }
  // Generation requests being relayed now.
  int64_t in_flight() const { return in_flight_.load(); }
  // Body for a request the HTTP layer refused itself (413, 400, 503).
  std::string rejection_body(server::http::status status, std::string_view message) const;

 private:
  explicit Router(RouterOptions options) : options_(std::move(options)), chooser_(options_.prefill, options_.decode, options_.choice) {}

  boost::asio::awaitable<void> generate(server::Exchange& ex, bool chat);
  // To a decode instance (the least loaded that connects): `body` for a POST,
  // none for a GET; its response relayed to the client.
  boost::asio::awaitable<void> to_decode(server::Exchange& ex, server::http::verb method, std::string target,
                                         std::string body);
  boost::asio::awaitable<void> send_error(server::Exchange& ex, int status, std::string message, const char* type,
                                          const char* code);

  RouterOptions options_;
  std::vector<bench::BaseUrl> prefill_urls_, decode_urls_;
  InstanceChooser chooser_;
  RouterMetrics metrics_;
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> in_flight_{0};
};

}  // namespace inferd::router
