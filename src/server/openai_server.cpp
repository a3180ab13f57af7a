#include "server/openai_server.h"

#include "server/serving_chat.h"
#include "server/serving_completion.h"
#include "server/serving_embedding.h"
#include "server/serving_info.h"
#include "server/messages_protocol.h"
#include "server/serving_messages.h"
#include "server/serving_tokenize.h"
#include "server/webui.h"

namespace inferd::server {

namespace net = boost::asio;

namespace {

bool constant_time_equal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// Errors in the shape of the API the path belongs to (Anthropic's for /v1/messages).
std::string error_body_for(std::string_view path, const ApiError& e) {
  return is_messages_path(path) ? anthropic_error_json(e) : error_json(e);
}

net::awaitable<void> send_error(Exchange& ex, const ApiError& e, const Headers& extra = {}) {
  co_await ex.respond(static_cast<http::status>(e.status), "application/json", error_body_for(ex.path(), e), extra);
}

// A header's value ("" when absent); `name` is a beast::http::field or the header's name.
template <class Name>
std::string_view header_value(const HttpRequest& req, Name name) {
  auto it = req.find(name);
  if (it == req.end()) return {};
  return std::string_view(it->value().data(), it->value().size());
}

std::string draining_body() { return R"({"status":"draining"})"; }

std::string dead_body(const ServingCore::Failure& f) {
  nlohmann::json body = {{"status", "dead"}, {"dead_rank", f.rank}, {"message", f.message}};
  return dump_json(body);
}

}  // namespace

OpenAIServer::OpenAIServer(ServerOptions options)
    : core_(std::move(options)),
      responses_(core_, core_.options().responses_store_size, core_.options().responses_store_ttl) {
  // Each route's handler lives in its API's file; the lambdas only bind the core (or the API).
  ServingCore& core = core_;
  ResponsesApi& responses = responses_;
  routes_ = {
      {"/v1/completions", http::verb::post, true, false, [&core](Exchange& ex) { return serve_completions(core, ex); }},
      {"/v1/chat/completions", http::verb::post, true, false,
       [&core](Exchange& ex) { return serve_chat_completions(core, ex); }},
      {"/v1/responses", http::verb::post, true, false, [&responses](Exchange& ex) { return responses.create(ex); }},
      {"/v1/responses/", http::verb::get, true, true, [&responses](Exchange& ex) { return responses.retrieve(ex); }},
      {"/v1/responses/", http::verb::delete_, true, true,
       [&responses](Exchange& ex) { return responses.remove(ex); }},
      {"/v1/embeddings", http::verb::post, true, false, [&core](Exchange& ex) { return serve_embeddings(core, ex); }},
      {"/v1/rerank", http::verb::post, true, false, [&core](Exchange& ex) { return serve_rerank(core, ex); }},
      {"/rerank", http::verb::post, true, false, [&core](Exchange& ex) { return serve_rerank(core, ex); }},
      {"/v1/models", http::verb::get, true, false, [&core](Exchange& ex) { return serve_models(core, ex); }},
      {"/metrics", http::verb::get, true, false, [&core](Exchange& ex) { return serve_metrics(core, ex); }},
      {"/tokenize", http::verb::post, true, false, [&core](Exchange& ex) { return serve_tokenize(core, ex, true); }},
      {"/detokenize", http::verb::post, true, false,
       [&core](Exchange& ex) { return serve_tokenize(core, ex, false); }},
      {"/version", http::verb::get, false, false, [&core](Exchange& ex) { return serve_version(core, ex); }},
      {"/tokenizer_info", http::verb::get, true, false,
       [&core](Exchange& ex) { return serve_tokenizer_info(core, ex); }},
      // Anthropic's Messages API.
      {"/v1/messages", http::verb::post, true, false, [&core](Exchange& ex) { return serve_messages(core, ex); }},
      {"/v1/messages/count_tokens", http::verb::post, true, false,
       [&core](Exchange& ex) { return serve_messages_count_tokens(core, ex); }},
  };
}

std::string OpenAIServer::rejection_body(http::status status, std::string_view message, std::string_view path) const {
  ApiError e{static_cast<int>(status), std::string(message), "invalid_request_error", {}, {}};
  if (status == http::status::payload_too_large) e.code = "request_too_large";
  if (static_cast<int>(status) >= 500) e.type = "server_error";
  if (status == http::status::service_unavailable) e.code = "server_shutting_down";  // the HTTP layer's only 503
  return error_body_for(path, e);
}

std::optional<ApiError> OpenAIServer::check_auth(const HttpRequest& req) const {
  const std::string& api_key = core_.options().api_key;
  if (api_key.empty()) return std::nullopt;
  const std::string_view given = header_value(req, http::field::authorization);
  constexpr std::string_view kBearer = "Bearer ";
  if (given.size() > kBearer.size() && given.substr(0, kBearer.size()) == kBearer &&
      constant_time_equal(given.substr(kBearer.size()), api_key))
    return std::nullopt;
  // Anthropic's clients send the key as x-api-key.
  const std::string_view x_api_key = header_value(req, boost::beast::string_view("x-api-key"));
  if (!x_api_key.empty() && constant_time_equal(x_api_key, api_key)) return std::nullopt;
  return ApiError{401,
                  given.empty() && x_api_key.empty()
                      ? "Missing API key: send it as 'Authorization: Bearer <key>' or 'x-api-key: <key>'."
                      : "Incorrect API key provided.",
                  "invalid_request_error", {}, "invalid_api_key"};
}

net::awaitable<void> OpenAIServer::handle(Exchange& ex) {
  const std::string path(ex.path());
  const http::verb method = ex.request().method();
  if (path == "/health") {
    if (method != http::verb::get && method != http::verb::head) {
      co_await send_error(ex, method_not_allowed("use GET for /health"));
    } else if (std::optional<ServingCore::Failure> failed = core_.failure()) {
      // Dead for good: no Retry-After; the process exits shortly.
      co_await ex.respond(http::status::service_unavailable, "application/json", dead_body(*failed));
    } else if (core_.shutting_down()) {
      // Draining: balancers take the instance out while its requests finish.
      co_await ex.respond(http::status::service_unavailable, "application/json", draining_body(), retry_after());
    } else if (ready()) {
      co_await ex.respond(http::status::ok, "application/json", "{}");
    } else {
      co_await send_error(ex, model_loading());
    }
    co_return;
  }
  // The page loads without the API key (it holds none); its API calls send it.
  if (core_.options().webui && method == http::verb::get) {
    const auto if_none_match = ex.request()[http::field::if_none_match];
    std::optional<WebResponse> page =
        serve_webui(path, std::string_view(if_none_match.data(), if_none_match.size()));
    if (page) {
      co_await ex.respond(page->status, page->content_type, std::move(page->body), page->headers);
      co_return;
    }
  }
  if (auto e = check_auth(ex.request())) {
    co_await send_error(ex, *e);
    co_return;
  }
  // The route of this path and method; else the first of this path (for 405).
  const Route* route = nullptr;
  const Route* same_path = nullptr;
  for (const Route& r : routes_) {
    const bool matches = r.prefix ? path.size() > r.path.size() && path.compare(0, r.path.size(), r.path) == 0
                                  : path == r.path;
    if (!matches) continue;
    if (!same_path) same_path = &r;
    if (r.method == method) {
      route = &r;
      break;
    }
  }
  if (!same_path) {
    co_await send_error(ex, not_found("Not found: " + path));
    co_return;
  }
  if (!route) {
    co_await send_error(ex, method_not_allowed("use " + std::string(http::to_string(same_path->method)) + " for " + path));
    co_return;
  }
  if (route->needs_model && !ready()) {
    co_await send_error(ex, model_loading(), retry_after());
    co_return;
  }
  co_await route->serve(ex);
}

}  // namespace inferd::server
