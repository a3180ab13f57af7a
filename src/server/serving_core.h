// What every generation API of the server shares: the model's chat template,
// tool-call and reasoning formats and grammar compiler; request preparation
// that does not depend on the API's protocol (chat prompt rendering, tools,
// structured outputs, the context length); admission into the engine (the
// queue bound, shutdown); and the loop that carries engine outputs back to
// the client, streamed or whole.
//
// An API (serving_chat.cpp, serving_completion.cpp, ...) turns its protocol
// into a PreparedGeneration and gives the loop a GenerationOutput that turns
// engine outputs into its protocol: adding an API is one file that does those
// two things, and one route in openai_server.cpp.
//
// A request's engine work is tied to its HTTP exchange: when the client goes
// away, or the handler ends for any reason, every unfinished choice is
// aborted, so its KV blocks are freed within one engine step.
#pragma once
#include <utility>

#include <boost/asio/awaitable.hpp>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
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

#include "chat/chat_prompt.h"
#include "chat/chat_template.h"
#include "chat/harmony.h"
#include "chat/reasoning.h"
#include "chat/tool_calls.h"
#include "engine/engine.h"
#include "model/model.h"
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
  // The Responses API's stored responses (previous_response_id, GET and
  // DELETE /v1/responses/{id}): at most this many, each for this long.
  size_t responses_store_size = 1024;
  std::chrono::seconds responses_store_ttl{3600};
};

// One choice: an engine request and what has come back from it so far.
struct Choice {
  std::string engine_id;
  std::shared_ptr<RequestStream> stream;
  int32_t index = 0;
  size_t prompt_index = 0;
  std::string text;
  int64_t num_tokens = 0;
  std::vector<SampledLogprobs> logprobs;
  size_t logprob_text_offset = 0;  // completions: where the next token's text starts
  // Scoring the prompt: echo's text before the completion (completions), the
  // prompt's first token (which has no logprob), and the engine's prompt logprobs.
  std::optional<std::string> echo;
  int32_t prompt_first_token = 0;
  std::vector<SampledLogprobs> prompt_logprobs;
  bool finished = false;
  bool sent_role = false;  // chat streaming: the first delta carries the role
  std::string finish_reason;
  std::string stop_string;  // the stop string that ended it, if one did
  std::string error;
  RequestMetrics metrics;
  // Tool calls: the parser of this choice's output (null: none parsed), and
  // the calls found so far, in OpenAI's shape.
  std::shared_ptr<ToolCallStreamParser> tool_parser;
  nlohmann::json tool_calls = nlohmann::json::array();
  std::string content;     // chat with tools: the content outside the calls
  std::string held_space;  // streaming with tools: whitespace not yet sent
  // Reasoning: the parser that splits the thinking from the answer (null: not
  // split), and the thinking found (whole responses).
  std::shared_ptr<ReasoningStreamParser> reasoning_parser;
  std::string reasoning;
  // gpt-oss's harmony format: one parser splits the channels into reasoning,
  // content and tool calls (null: not harmony).
  std::shared_ptr<HarmonyStreamParser> harmony_parser;
  std::vector<BeamOutput> beams;  // beam search: the engine request's beams (it stands for n choices)
  // Prefill for a remote decode: the lease holding the prompt's blocks, and their ids per KV group.
  uint64_t kv_lease_id = 0;
  std::vector<std::vector<int32_t>> kv_lease_blocks;
};

// A generation request parsed, checked and tokenized, ready for admission.
struct PreparedGeneration {
  GenerationRequest req;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> prompt_texts;  // for the log (log_prompts)
  std::vector<int64_t> max_tokens;        // per prompt
  std::shared_ptr<const CompiledGrammar> grammar;  // structured output, compiled (shared by every choice)
  std::optional<ToolCallFormat> tool_format;       // tool calls are parsed from the output in this format
  std::vector<std::string> tool_names;             // the request's functions (untagged hermes calls)
  std::vector<ToolSignature> tool_signatures;      // and their parameter schemas (qwen3_coder's types)
  bool harmony = false;                            // the output is harmony (chat/harmony.h)
  bool harmony_calls = false;                      // harmony: messages to functions are tool calls
  std::optional<ReasoningSpec> reasoning;          // chat: the thinking is split from the answer
  bool render_special = false;                     // the output's text shows control tokens
  // completions' echo: each prompt's text as the response repeats it (the
  // client's text, or its token ids decoded); score_only: max_tokens 0, the
  // one token the engine generates is dropped.
  std::vector<std::string> echo_texts;
  bool score_only = false;
};

// An API's side of one generation: what its client receives as the engine's
// outputs come in. The loop (ServingCore::generate) has already added each
// output's text and token count to its choice, and its finish.
class GenerationOutput {
 public:
  virtual ~GenerationOutput() = default;
  // The API's error body (OpenAI's shape unless it says otherwise).
  virtual std::string error_body(const ApiError& e) const { return error_json(e); }
  // Streaming: the events sent once the stream opens, before any output.
  virtual std::string stream_head() { return {}; }
  // Streaming: the events for one engine output of a choice; "" for none.
  virtual std::string stream_output(Choice& c, const RequestOutput& out) = 0;
  // Streaming: the event telling the client that generation failed.
  virtual std::string stream_error(const std::string& message) = 0;
  // Streaming: the events once every choice has finished (usage, the end marker).
  virtual std::string stream_tail(std::vector<Choice>& choices) = 0;
  // Whole: the response body once every choice finished without error.
  virtual std::string body(std::vector<Choice>& choices) = 0;
};

// Errors and headers are built by plain functions, never as braced temporaries
// inside a coroutine: GCC 12 miscompiles those (double free, or "array used
// as initializer" for string literals).
ApiError method_not_allowed(std::string message);
ApiError model_loading();
ApiError server_error(std::string message);
ApiError shutting_down_error();  // 503 server_shutting_down: draining, or stopped
Headers retry_after();

// A request body that must be a JSON object.
std::variant<nlohmann::json, ApiError> parse_object(const std::string& text);
// Compact JSON; invalid UTF-8 replaced.
std::string dump_json(const nlohmann::json& j);
// Seconds since the epoch (`created` fields).
int64_t unix_now();
// n random lowercase hex digits (response ids).
std::string random_hex(size_t n);

// Whole responses: the thinking split from the answer, then the answer's tool
// calls (into c.reasoning, c.content and c.tool_calls; finish_reason
// "tool_calls" once there is a call).
void finish_message(Choice& c, const PreparedGeneration& pg);
// Streaming with tool parsing: what one engine output of the choice adds.
std::vector<ToolCallDelta> parse_streamed(Choice& c, const RequestOutput& out);
// What one engine output of a choice says, split by the choice's parsers:
// the thinking, then the answer as content and whole tool calls (harmony's
// channels, the reasoning parser's split, the tool-call parser's calls; the
// text as content where there is no parser). An API streams these in its own
// protocol's events.
struct OutputParts {
  std::string reasoning;
  std::vector<ToolCallDelta> answer;
};
OutputParts split_output(Choice& c, const RequestOutput& out);
// Beam search: each engine request (one per prompt) becomes its beams, one
// choice each, best first, at the indexes the request holds for its prompt.
std::vector<Choice> beam_choices(const std::vector<Choice>& requests);

class ServingCore {
 public:
  explicit ServingCore(ServerOptions options);

  // The model is loaded and the engine runs. `tmpl` is empty when the model
  // has no chat template (chat requests then get 400). The model and engine
  // must outlive every handler.
  void attach(Model& model, Engine& engine, std::optional<ChatTemplate> tmpl);
  bool ready() const { return ready_.load(); }
  // From now on no request enters the engine; those not yet in it get 503
  // (with Retry-After), while those in it run on (the drain).
  void begin_shutdown();
  bool shutting_down() const { return stopping_.load(); }
  // The engine can run no further step (a rank of a model split across
  // processes is gone, cli/parallel.h): from now on new requests get 503 with
  // `message`, /health answers 503 naming `rank`, and every running request
  // ends now with `message` as its error. Any thread; the engine's own thread
  // may be stuck for good (in MPI, waiting for the lost rank).
  void fail(std::string message, int rank);
  struct Failure {
    std::string message;
    int rank = -1;
  };
  std::optional<Failure> failure() const;
  // Engine requests added and not yet finished (the drain waits for none).
  int64_t unfinished_requests() const { return unfinished_.load(); }
  void join_workers() { workers_.join(); }
  // The engine's finished listener (engine thread): metrics and the log line.
  void on_finished(const RequestOutput& out);

  const ServerOptions& options() const { return options_; }
  const Model& model() const { return *model_; }
  const Tokenizer& tokenizer() const { return model_->tokenizer(); }
  const Engine& engine() const { return *engine_; }
  const std::optional<ChatTemplate>& chat_template() const { return template_; }
  WorkerPool& workers() { return workers_; }
  // The Prometheus text of /metrics.
  std::string metrics_text() const;

  // ---- preparation (worker threads) ----
  // The request names this model, and its kv_transfer_params suit this
  // instance (dropped without --kv-transfer-config).
  std::optional<ApiError> check_request(GenerationRequest& req) const;
  // A chat request's prompt, rendered (see chat_prompt.h); tokenized by the caller.
  std::variant<ChatPrompt, ApiError> render_chat(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                                 const std::string& kwargs, const std::string& tools_json = {}) const;
  // The chat request's messages and tools rendered and tokenized into
  // pg.prompts, with its tool-call format and reasoning split.
  std::optional<ApiError> prepare_chat_prompt(PreparedGeneration& pg) const;
  // The prompt's bytes alone show it cannot fit the context: refused before
  // it is tokenized.
  std::optional<ApiError> surely_too_long(std::string_view prompt, std::optional<int64_t> max_tokens) const;
  // The structured-output constraint compiled, max_tokens 0 made score-only,
  // and each prompt checked against the context: its max_tokens, by default
  // the room left (chat) or --default-max-tokens (completions).
  std::optional<ApiError> finish_preparation(PreparedGeneration& pg, bool fill_context) const;

  // ---- the generation ----
  // Admits one engine request per prompt and choice, then answers the
  // exchange as `output` shapes it: streamed (pg.req.stream) or whole.
  // `api_id` names the engine requests (api_id-0, api_id-1, ...).
  boost::asio::awaitable<void> generate(Exchange& ex, PreparedGeneration& pg, const std::string& api_id,
                                        GenerationOutput& output);
  // ---- pooled requests (embeddings, reranking) ----
  // `model` (when given) names this model: else 404, as check_request.
  std::optional<ApiError> check_model(const std::string& model) const;
  // Admits one pooled engine request per input (GenerationParams::pooled;
  // the queue bound and shutdown as for generations, all inputs or none),
  // batched by the engine like any other requests, and waits for them: each
  // input's pooled output, in order; nullopt when it has answered the
  // exchange with an error instead, or the client went away (its requests
  // are then aborted).
  boost::asio::awaitable<std::optional<std::vector<std::vector<float>>>> run_pooled(
      Exchange& ex, const std::vector<std::vector<int32_t>>& inputs, const std::string& api_id);

  // The disaggregation parameters of a whole response: a producer's
  // (do_remote_decode) blocks for its consumer; null otherwise.
  nlohmann::json kv_transfer_response(const PreparedGeneration& pg, const std::string& api_id,
                                      const std::vector<Choice>& choices) const;

 private:
  // A chat request's tools checked against the model: the format its output
  // is parsed in (nullopt for tool_choice "none"), and the grammar of a
  // forced call compiled into pg.
  std::optional<ApiError> prepare_tools(PreparedGeneration& pg) const;
  // Adds one engine request per prompt and choice (into `choices`), unless
  // the server is shutting down or the queue is full.
  std::optional<ApiError> admit(PreparedGeneration& prepared, const std::string& api_id,
                                const std::function<void()>& wake, std::vector<Choice>& choices);
  // Why new_requests more cannot be admitted now (shutdown, the queue bound); under admit_mu_.
  std::optional<ApiError> admission_refusal(int64_t new_requests) const;

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
  std::atomic<bool> stopping_{false};  // shutting_down_, readable without the lock

  // Every unfinished engine request's stream, so that fail() can end them
  // without the engine's thread.
  void track(const Choice& c);
  mutable std::mutex streams_mu_;  // a leaf: nothing else is locked under it
  std::unordered_map<std::string, std::weak_ptr<RequestStream>> live_streams_;
  std::optional<Failure> failure_;  // under streams_mu_

  WorkerPool workers_;  // last: its work uses the members above, so it is joined first
};

}  // namespace inferd::server
