// The OpenAI-compatible API on top of the engine: routing, authentication,
// prompt building (tokenizer, chat template), admission (context length,
// queue bound), streaming of engine outputs as server-sent events, usage,
// logprobs, /metrics, /tokenize and /detokenize.
//
// A request's engine work is tied to its HTTP exchange: when the client goes
// away, or the handler ends for any reason, every unfinished choice is
// aborted, so its KV blocks are freed within one engine step.
#pragma once
#include <utility>

#include <boost/asio/awaitable.hpp>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "chat/chat_template.h"
#include "engine/engine.h"
#include "model/model.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/openai_protocol.h"

namespace inferd::server {

struct ServerOptions {
  std::string served_model_name = "default";
  std::string api_key;                     // empty: no authentication
  int64_t max_queued_requests = 4096;      // waiting requests at most; more get 503
  int64_t default_max_tokens = 16;         // /v1/completions without max_tokens (OpenAI's default)
  bool log_prompts = false;                // put prompt text in the per-request log line
  size_t max_log_len = 256;                // of that text
  ProtocolLimits limits;
};

class OpenAIServer {
 public:
  explicit OpenAIServer(ServerOptions options);

  // The model is loaded and the engine runs: generation routes open. `tmpl` is
  // empty when the model has no chat template (chat requests then get 400).
  // The model and engine must outlive every handler.
  void attach(Model& model, Engine& engine, std::optional<ChatTemplate> tmpl);
  bool ready() const { return ready_.load(); }

  boost::asio::awaitable<void> handle(Exchange& ex);
  // Body for a request the HTTP layer refused itself (413, 400).
  std::string rejection_body(http::status status, std::string_view message) const;
  // The engine's finished listener (engine thread): metrics and the log line.
  void on_finished(const RequestOutput& out);

 private:
  boost::asio::awaitable<void> generate(Exchange& ex, bool chat);
  // /tokenize and /detokenize: the response body, or the error.
  std::variant<std::string, ApiError> tokenize(const std::string& body) const;
  std::variant<std::string, ApiError> detokenize(const std::string& body) const;
  boost::asio::awaitable<void> send_error(Exchange& ex, const ApiError& e, const Headers& extra = {});
  std::optional<ApiError> check_auth(const HttpRequest& req) const;
  std::string models_json() const;
  // Prompt token ids of a chat request (template rendered, then tokenized).
  std::variant<std::vector<int32_t>, ApiError> chat_prompt(const std::vector<ChatMessage>& messages,
                                                            bool add_generation_prompt,
                                                            const std::string& kwargs) const;

  ServerOptions options_;
  std::atomic<bool> ready_{false};
  Model* model_ = nullptr;
  Engine* engine_ = nullptr;
  std::optional<ChatTemplate> template_;
  ServingMetrics metrics_;
  std::atomic<int64_t> unfinished_{0};  // requests added and not yet finished

  std::mutex log_mu_;
  std::unordered_map<std::string, std::string> prompt_log_;  // engine id -> prompt text (log_prompts)
};

}  // namespace inferd::server
