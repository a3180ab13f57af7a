#include "router/router.h"

#include <spdlog/spdlog.h>

#include <boost/asio/this_coro.hpp>

#include <optional>

#include "router/upstream_call.h"
#include "server/openai_protocol.h"
#include "server/serving_core.h"

namespace inferd::router {

namespace net = boost::asio;
using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;
using server::Exchange;
using server::http::status;
using server::http::verb;

nlohmann::ordered_json prefill_body(const ordered_json& request) {
  ordered_json body = request;
  body["max_tokens"] = 1;
  if (body.contains("max_completion_tokens")) body["max_completion_tokens"] = 1;
  body["stream"] = false;
  body.erase("stream_options");
  if (body.contains("n")) body["n"] = 1;  // the prompt's blocks are the same for every choice
  body.erase("best_of");
  // A beam search's prompt, too: prefilled as one plain request, whose blocks
  // the decode instance's first beam pulls.
  for (const char* beam : {"use_beam_search", "length_penalty", "early_stopping"}) body.erase(beam);
  ordered_json params = ordered_json::object();
  params["do_remote_decode"] = true;
  params["do_remote_prefill"] = false;
  body["kv_transfer_params"] = std::move(params);
  return body;
}

nlohmann::ordered_json decode_body(const ordered_json& request, const json* kv_transfer_params) {
  ordered_json body = request;
  if (kv_transfer_params) body["kv_transfer_params"] = ordered_json::parse(kv_transfer_params->dump());
  return body;
}

namespace {

// A draining router's answer: /health's status, or OpenAI's error for a new request.
std::string draining_body(bool health) {
  if (health) return R"({"status":"draining"})";
  return server::error_json(server::shutting_down_error());
}

std::string dump(const ordered_json& j) { return j.dump(-1, ' ', false, ordered_json::error_handler_t::replace); }

bool constant_time_equal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

std::string header_value(const server::HttpRequest& req, server::http::field f) {
  auto it = req.find(f);
  return it == req.end() ? std::string() : std::string(it->value());
}

server::Headers retry_after_header(const UpstreamCall& call) {
  server::Headers h;
  if (!call.retry_after().empty()) h.emplace_back("Retry-After", call.retry_after());
  return h;
}

// The kv_transfer_params of a prefill answer's body, if it is a JSON object with them.
std::optional<json> transfer_params_of(const std::string& body) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  auto it = j.find("kv_transfer_params");
  if (it == j.end() || !it->is_object()) return std::nullopt;
  return *it;
}

std::string stream_error_event(const std::string& message) {
  return "data: " + server::error_json(server::ApiError{502, message, "server_error", {}, "upstream_failed"}) + "\n\n";
}

// Cancels the call if the handler leaves before it is over (client gone, a
// failed write, the coroutine destroyed): the instance then aborts it.
struct CancelUnfinished {
  std::shared_ptr<UpstreamCall> call;
  ~CancelUnfinished() {
    if (call && !call->done()) call->cancel();
  }
};

// Waits until the call has its response head (or the whole response, with
// `whole`, its body taken into `into`) or has failed. False: the client went
// away first, and the call is cancelled.
net::awaitable<bool> await_call(Exchange& ex, UpstreamCall& call, bool whole, std::string* into = nullptr) {
  for (;;) {
    if (into) *into += call.take_body();
    if (call.done() || (!whole && call.head_ready())) co_return true;
    if (ex.client_gone()) {
      call.cancel();
      co_return false;
    }
    co_await ex.wait();
  }
}

UpstreamRequest upstream_request(const bench::BaseUrl& url, verb method, const std::string& target, std::string body,
                                 const server::HttpRequest& client, std::chrono::milliseconds connect_timeout) {
  UpstreamRequest r;
  r.method = method;
  r.target = url.target(target);
  r.body = std::move(body);
  r.authorization = header_value(client, server::http::field::authorization);
  r.connect_timeout = connect_timeout;
  return r;
}

}  // namespace

Result<std::unique_ptr<Router>> Router::create(RouterOptions options) {
  if (options.decode.empty()) return make_error("at least one decode instance (--decode URL) is needed");
  std::unique_ptr<Router> r(new Router(std::move(options)));
  for (const std::string& u : r->options_.prefill) {
    auto url = bench::parse_base_url(u);
    if (!url) return make_error("--prefill " + u + ": " + url.error().message);
    r->prefill_urls_.push_back(*url);
  }
  for (const std::string& u : r->options_.decode) {
    auto url = bench::parse_base_url(u);
    if (!url) return make_error("--decode " + u + ": " + url.error().message);
    r->decode_urls_.push_back(*url);
  }
  return r;
}

std::string Router::rejection_body(status s, std::string_view message) const {
  server::ApiError e{static_cast<int>(s), std::string(message), "invalid_request_error", {}, {}};
  if (static_cast<int>(s) >= 500) e.type = "server_error";
  return server::error_json(e);
}

net::awaitable<void> Router::send_error(Exchange& ex, int code, std::string message, const char* type,
                                        const char* error_code) {
  server::ApiError e;
  e.status = code;
  e.message = std::move(message);
  e.type = type;
  e.code = error_code ? error_code : "";
  co_await ex.respond(static_cast<status>(code), "application/json", server::error_json(e));
}

net::awaitable<void> Router::handle(Exchange& ex) {
  const std::string path(ex.path());
  const verb method = ex.request().method();
  const bool generation = path == "/v1/completions" || path == "/v1/chat/completions";
  if (draining_.load() && (path == "/health" || generation)) {
    co_await ex.respond(status::service_unavailable, "application/json", draining_body(path == "/health"),
                        server::retry_after());
    co_return;
  }
  if (path == "/health") {
    co_await to_decode(ex, verb::get, "/health", std::string());
    co_return;
  }
  if (!options_.api_key.empty()) {
    const std::string given = header_value(ex.request(), server::http::field::authorization);
    if (!(given.starts_with("Bearer ") && constant_time_equal(std::string_view(given).substr(7), options_.api_key))) {
      co_await send_error(ex, 401, given.empty() ? "Missing API key: send it as 'Authorization: Bearer <key>'."
                                                 : "Incorrect API key provided.",
                          "invalid_request_error", "invalid_api_key");
      co_return;
    }
  }
  if (path == "/v1/completions" || path == "/v1/chat/completions") {
    if (method != verb::post) {
      co_await send_error(ex, 405, "use POST for " + path, "invalid_request_error", "method_not_allowed");
      co_return;
    }
    // Counted while it runs, for the drain.
    struct Counted {
      std::atomic<int64_t>& n;
      explicit Counted(std::atomic<int64_t>& count) : n(count) { ++n; }
      ~Counted() { --n; }
    } counted(in_flight_);
    co_await generate(ex, path == "/v1/chat/completions");
  } else if (path == "/v1/models") {
    co_await to_decode(ex, verb::get, "/v1/models", std::string());
  } else if (path == "/metrics" && method == verb::get) {
    co_await ex.respond(status::ok, "text/plain; version=0.0.4; charset=utf-8", metrics_.render(chooser_));
  } else {
    co_await send_error(ex, 404, "Not found: " + path, "invalid_request_error", "not_found");
  }
}

net::awaitable<void> Router::generate(Exchange& ex, bool chat) {
  const std::string target = chat ? "/v1/chat/completions" : "/v1/completions";
  const std::string& raw = ex.request().body();
  ordered_json request = ordered_json::parse(raw, nullptr, /*allow_exceptions=*/false);
  if (request.is_discarded() || !request.is_object()) {
    // Not ours to judge: the decode instance answers it with its own 400.
    co_await to_decode(ex, verb::post, target, raw);
    co_return;
  }
  if (request.contains("kv_transfer_params")) {
    co_await send_error(ex, 400, "'kv_transfer_params' is set by the router; leave it out of requests to it",
                        "invalid_request_error", nullptr);
    co_return;
  }
  std::string salt;
  if (auto it = request.find("model"); it != request.end() && it->is_string()) salt = it->get<std::string>();
  if (auto it = request.find("cache_salt"); it != request.end() && it->is_string()) salt += '\0' + it->get<std::string>();
  const std::vector<uint64_t> hashes = chunk_hashes(prompt_text(request, chat), salt);

  // ---- prefill ----
  std::optional<json> params;
  if (const std::optional<size_t> p = chooser_.pick_prefill(hashes)) {
    InFlight in_flight(chooser_, Role::kPrefill, *p);
    metrics_.count_request(Role::kPrefill, *p);
    UpstreamRequest up = upstream_request(prefill_urls_[*p], verb::post, target, dump(prefill_body(request)),
                                          ex.request(), options_.connect_timeout);
    up.head_timeout = options_.prefill_timeout;
    auto call = UpstreamCall::start(co_await net::this_coro::executor, prefill_urls_[*p], std::move(up), ex.waker());
    CancelUnfinished cancel_prefill{call};
    std::string answer;
    if (!co_await await_call(ex, *call, /*whole=*/true, &answer)) co_return;
    std::optional<FallbackReason> fallback;
    if (call->failed()) {
      fallback = !call->connected() ? FallbackReason::kUnreachable
                 : call->timed_out()  ? FallbackReason::kTimeout
                                      : FallbackReason::kFailed;
      // One line per outage, not one per request while it lasts.
      const bool newly_down = !call->connected() && chooser_.mark_down(Role::kPrefill, *p);
      if (call->connected() || newly_down)
        spdlog::warn("prefill at {} failed ({}: {}): decode computes the prompt{}", options_.prefill[*p],
                     fallback_reason_name(*fallback), call->failure(),
                     newly_down ? "; the instance is passed over for a while" : "");
    } else if (call->status() >= 400 && call->status() < 500) {
      // The client's mistake (a bad field, a prompt too long): the same at decode, so answered now.
      const server::Headers extra = retry_after_header(*call);
      co_await ex.respond(static_cast<status>(call->status()), call->content_type(), std::move(answer), extra);
      co_return;
    } else if (call->status() != 200) {
      fallback = FallbackReason::kFailed;
    } else if (!(params = transfer_params_of(answer))) {
      fallback = FallbackReason::kNoParams;
    }
    if (fallback) {
      if (*fallback != FallbackReason::kNoParams) metrics_.count_upstream_error(Role::kPrefill, *p);
      metrics_.count_fallback(*fallback);
      if (*fallback == FallbackReason::kNoParams)
        spdlog::warn("prefill at {} answered without kv_transfer_params (is it a kv_producer?): decode computes "
                     "the prompt",
                     options_.prefill[*p]);
    }
  }

  // ---- decode ----
  co_await to_decode(ex, verb::post, target, dump(decode_body(request, params ? &*params : nullptr)));
}

net::awaitable<void> Router::to_decode(Exchange& ex, verb method, std::string target, std::string body) {
  std::string last_failure = "no decode instance";
  for (size_t d : chooser_.decode_order()) {
    InFlight in_flight(chooser_, Role::kDecode, d);
    metrics_.count_request(Role::kDecode, d);
    UpstreamRequest up = upstream_request(decode_urls_[d], method, target, body, ex.request(), options_.connect_timeout);
    auto call = UpstreamCall::start(co_await net::this_coro::executor, decode_urls_[d], std::move(up), ex.waker());
    CancelUnfinished cancel_decode{call};
    if (!co_await await_call(ex, *call, /*whole=*/false)) co_return;
    if (call->failed() && !call->connected()) {  // never reached it: the next one may do
      metrics_.count_upstream_error(Role::kDecode, d);
      if (chooser_.mark_down(Role::kDecode, d)) spdlog::warn("decode instance {} is unreachable: {}", options_.decode[d], call->failure());
      last_failure = call->failure();
      continue;
    }
    if (call->failed() && !call->head_ready()) {  // it took the request and broke off
      metrics_.count_upstream_error(Role::kDecode, d);
      co_await send_error(ex, 502, "the decode instance failed: " + call->failure(), "server_error", "upstream_failed");
      co_return;
    }
    if (call->status() >= 500) metrics_.count_upstream_error(Role::kDecode, d);

    if (!call->content_type().starts_with("text/event-stream")) {
      std::string whole;
      if (!co_await await_call(ex, *call, /*whole=*/true, &whole)) co_return;
      if (call->failed()) {
        metrics_.count_upstream_error(Role::kDecode, d);
        co_await send_error(ex, 502, "the decode instance failed: " + call->failure(), "server_error",
                            "upstream_failed");
        co_return;
      }
      const server::Headers extra = retry_after_header(*call);
      co_await ex.respond(static_cast<status>(call->status()), call->content_type(), std::move(whole), extra);
      co_return;
    }

    // A stream: each piece goes on as it comes.
    if (!co_await ex.begin_stream(static_cast<status>(call->status()), call->content_type())) co_return;
    for (;;) {
      // Read before the take: a write suspends, and the call may receive its
      // last bytes meanwhile, which the next turn must still take.
      const bool finished = call->done();
      std::string piece = call->take_body();
      if (!piece.empty() && !co_await ex.write_chunk(std::move(piece))) co_return;
      if (finished) break;
      if (ex.client_gone()) co_return;
      co_await ex.wait();
    }
    if (call->failed()) {
      metrics_.count_upstream_error(Role::kDecode, d);
      if (!co_await ex.write_chunk(stream_error_event("the decode instance failed: " + call->failure()))) co_return;
    }
    co_await ex.end_stream();
    co_return;
  }
  co_await send_error(ex, 503, "no decode instance is reachable (" + last_failure + ")", "server_error",
                      "decode_unavailable");
}

}  // namespace inferd::router
