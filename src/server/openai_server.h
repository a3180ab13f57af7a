// The HTTP front of the serving APIs: /health, the web chat page at /,
// authentication, and routing to the APIs, each in its own file on the
// shared serving core (serving_core.h): Chat Completions (serving_chat),
// Completions (serving_completion), Responses (serving_responses), the tokenizer endpoints
// (serving_tokenize), and /v1/models, /version, /metrics (serving_info).
//
// Everything that costs CPU per request byte (JSON parsing, validation, chat
// templates, tokenization) runs on the core's small worker pool, never on the
// I/O threads, so one large upload cannot stall other connections.
#pragma once
#include <utility>

#include <boost/asio/awaitable.hpp>

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/http_server.h"
#include "server/serving_core.h"
#include "server/serving_responses.h"

namespace inferd::server {

class OpenAIServer {
 public:
  explicit OpenAIServer(ServerOptions options);

  // The model is loaded and the engine runs: generation routes open. `tmpl` is
  // empty when the model has no chat template (chat requests then get 400).
  // The model and engine must outlive every handler.
  void attach(Model& model, Engine& engine, std::optional<ChatTemplate> tmpl) {
    core_.attach(model, engine, std::move(tmpl));
  }
  bool ready() const { return core_.ready(); }
  // Shutdown has begun (the drain): from now on no request enters the engine;
  // new ones get 503 with Retry-After and /health 503 {"status": "draining"},
  // while those in the engine run on. Call before stopping the engine.
  void begin_shutdown() { core_.begin_shutdown(); }
  // The engine can run no further step because rank `rank` of the model is
  // gone: /health answers 503 {"status": "dead", "dead_rank": rank, "message":
  // ...} (as vLLM's /health is 503 once its engine is dead), new requests get
  // 503 and running ones end with `message` (ServingCore::fail).
  void fail(std::string message, int rank) { core_.fail(std::move(message), rank); }
  // Engine requests not yet finished: the drain is over at zero.
  int64_t unfinished_requests() const { return core_.unfinished_requests(); }
  // Waits for request preparation in flight. Call after the HTTP server's I/O
  // threads have stopped and before it (and the model) are destroyed.
  void join_workers() { core_.join_workers(); }

  boost::asio::awaitable<void> handle(Exchange& ex);
  // Body for a request the HTTP layer refused itself (413, 400).
  std::string rejection_body(http::status status, std::string_view message, std::string_view path) const;
  // The engine's finished listener (engine thread): metrics and the log line.
  void on_finished(const RequestOutput& out) { core_.on_finished(out); }

 private:
  // One API endpoint: its path (a prefix when `prefix`, for ids in the path),
  // its method, and whether it needs the model loaded (503 until then).
  struct Route {
    std::string path;
    http::verb method;
    bool needs_model = true;
    bool prefix = false;
    std::function<boost::asio::awaitable<void>(Exchange&)> serve;
  };
  std::optional<ApiError> check_auth(const HttpRequest& req) const;

  ServingCore core_;
  ResponsesApi responses_;  // its store of responses
  std::vector<Route> routes_;
};

}  // namespace inferd::server
