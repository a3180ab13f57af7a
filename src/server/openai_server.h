// The OpenAI-compatible API on top of the engine: routing, authentication,
// prompt building (tokenizer, chat template), admission (context length,
// queue bound), streaming of engine outputs as server-sent events, usage,
// logprobs, /metrics, /tokenize, /detokenize and /tokenizer_info, and the web chat page at /.
//
// A request's engine work is tied to its HTTP exchange: when the client goes
// away, or the handler ends for any reason, every unfinished choice is
// aborted, so its KV blocks are freed within one engine step.
//
// Everything that costs CPU per request byte (JSON parsing, validation, chat
// templates, tokenization) runs on a small worker pool, never on the I/O
// threads, so one large upload cannot stall other connections.
#pragma once
#include <utility>

#include <boost/asio/awaitable.hpp>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include "chat/chat_template.h"
#include "chat/harmony.h"
#include "chat/reasoning.h"
#include "chat/tool_calls.h"
#include "engine/engine.h"
#include "model/model.h"
#include "chat/chat_prompt.h"
#include "server/http_server.h"
#include "server/kv_transfer.h"
#include "server/metrics.h"
#include "server/openai_protocol.h"
#include "server/worker_pool.h"

namespace inferd::server {

struct ServerOptions {
  std::string served_model_name = "default";
  std::string api_key;                     // empty: no authentication
  int64_t max_queued_requests = 4096;      // waiting requests at most; more get 503
  int64_t default_max_tokens = 16;         // /v1/completions without max_tokens (OpenAI's default)
  bool log_prompts = false;                // put prompt text in the per-request log line
  size_t max_log_len = 256;                // of that text
  // Read special-token text in chat message content as the token (the old
  // behaviour, which lets a message forge the template's turns).
  bool special_tokens_in_chat_content = false;
  // The tool-call format (vLLM's --tool-call-parser); nullopt: the one the
  // chat template shows (detect_tool_call_format).
  std::optional<ToolCallFormat> tool_call_parser;
  // Reasoning output (vLLM's --reasoning-parser): chat answers return the
  // thinking as `reasoning_content`, and a grammar applies after it. kAuto:
  // harmony when the chat template writes <|channel|> (gpt-oss), qwen3 when
  // it writes </think>, else none.
  ReasoningParser reasoning_parser = ReasoningParser::kAuto;
  size_t worker_threads = 2;  // parse, render and tokenize requests (off the I/O threads)
  bool webui = true;          // serve the web chat page at / (server/webui.h)
  // --kv-transfer-config: this instance's part in prefill/decode
  // disaggregation (server/kv_transfer.h); nullopt: none, kv_transfer_params ignored.
  std::optional<KVTransferConfig> kv_transfer;
  ProtocolLimits limits;
};

struct Choice;              // one engine request of a response (openai_server.cpp)
struct PreparedGeneration;  // a generation request parsed, checked and tokenized (openai_server.cpp)

class OpenAIServer {
 public:
  explicit OpenAIServer(ServerOptions options);

  // The model is loaded and the engine runs: generation routes open. `tmpl` is
  // empty when the model has no chat template (chat requests then get 400).
  // The model and engine must outlive every handler.
  void attach(Model& model, Engine& engine, std::optional<ChatTemplate> tmpl);
  bool ready() const { return ready_.load(); }
  // Shutdown has begun: from now on no request enters the engine; those not
  // yet in it get 503. Call before stopping the engine.
  void begin_shutdown();
  // Waits for request preparation in flight. Call after the HTTP server's I/O
  // threads have stopped and before it (and the model) are destroyed.
  void join_workers() { workers_.join(); }

  boost::asio::awaitable<void> handle(Exchange& ex);
  // Body for a request the HTTP layer refused itself (413, 400).
  std::string rejection_body(http::status status, std::string_view message) const;
  // The engine's finished listener (engine thread): metrics and the log line.
  void on_finished(const RequestOutput& out);

 private:
  boost::asio::awaitable<void> generate(Exchange& ex, bool chat);
  // Worker thread: the body parsed and validated, prompts tokenized, the
  // context checked.
  std::variant<PreparedGeneration, ApiError> prepare_generation(const std::string& body, bool chat) const;
  // The prompt's bytes alone show it cannot fit the context: refused before
  // it is tokenized.
  std::optional<ApiError> surely_too_long(std::string_view prompt, std::optional<int64_t> max_tokens) const;
  // Adds one engine request per prompt and choice (into `choices`), unless
  // the server is shutting down or the queue is full.
  std::optional<ApiError> admit(PreparedGeneration& prepared, const std::string& api_id,
                                const std::function<void()>& wake, std::vector<Choice>& choices);
  // /tokenize and /detokenize: the response body, or the error.
  std::variant<std::string, ApiError> tokenize(const std::string& body) const;
  std::variant<std::string, ApiError> detokenize(const std::string& body) const;
  // vLLM's GET /tokenizer_info: the special tokens' text, the context length
  // and the chat template (lm-evaluation-harness's remote tokenizer reads it,
  // then tokenizes through /tokenize and /detokenize).
  std::string tokenizer_info_json() const;
  boost::asio::awaitable<void> send_error(Exchange& ex, const ApiError& e, const Headers& extra = {});
  std::optional<ApiError> check_auth(const HttpRequest& req) const;
  std::string models_json() const;
  // A chat request's prompt, rendered (see chat_prompt.h); tokenized by the caller.
  std::variant<ChatPrompt, ApiError> render_chat(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                                 const std::string& kwargs, const std::string& tools_json = {}) const;
  // A chat request's tools checked against the model: the format its output
  // is parsed in (nullopt for tool_choice "none"), and the grammar of a
  // forced call compiled into pg.
  std::optional<ApiError> prepare_tools(PreparedGeneration& pg) const;

  ServerOptions options_;
  std::atomic<bool> ready_{false};
  Model* model_ = nullptr;
  Engine* engine_ = nullptr;
  std::optional<ChatTemplate> template_;
  std::unique_ptr<GrammarCompiler> grammars_;  // structured outputs; null if the vocabulary was refused
  std::string grammar_error_;                  // why grammars_ is null
  std::optional<ToolCallFormat> tool_format_;  // the parser's flag, or the template's format
  int32_t tool_marker_token_ = -1;             // the control token opening the format's calls ([TOOL_CALLS])
  ReasoningParser reasoning_ = ReasoningParser::kNone;  // options_.reasoning_parser, auto resolved
  bool harmony_ = false;  // the output is gpt-oss's harmony (either parser's flag, or the template's markers)
  ServingMetrics metrics_;
  std::atomic<int64_t> unfinished_{0};  // requests added and not yet finished

  std::mutex log_mu_;
  std::unordered_map<std::string, std::string> prompt_log_;  // engine id -> prompt text (log_prompts)

  std::mutex admit_mu_;         // shutdown and the queue bound are checked and requests added under it
  bool shutting_down_ = false;  // guarded by admit_mu_

  WorkerPool workers_;  // last: its work uses the members above, so it is joined first
};

}  // namespace inferd::server
