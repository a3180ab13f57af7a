// The OpenAI API's request side: parses and validates the JSON bodies of
// /v1/completions and /v1/chat/completions into a GenerationRequest, and
// shapes errors as OpenAI does: {"error": {"message", "type", "param", "code"}}
// with an HTTP status. Everything here is pure (no engine, no tokenizer), so
// every bad-input case is unit-tested without a model.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "chat/chat_template.h"
#include "chat/reasoning.h"
#include "engine/beam_search.h"
#include "server/kv_transfer.h"
#include "sampling/sampler.h"
#include "structured/grammar.h"

namespace inferd::server {

struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // empty: null
  std::string code;   // empty: null
};

std::string error_json(const ApiError& e);
ApiError bad_request(std::string message, std::string param = {});
ApiError not_found(std::string message, std::string code = "not_found");

// For the request parsers (this file's, responses_protocol's): a bad request
// thrown inside a parser and caught at its top, so each field check is one line.
namespace parsing {
struct Invalid {
  ApiError error;
};
[[noreturn]] inline void fail(std::string message, std::string param) {
  throw Invalid{bad_request(std::move(message), std::move(param))};
}
}  // namespace parsing

// One prompt of /v1/completions: text, or token ids given by the client.
struct PromptInput {
  std::string text;
  std::vector<int32_t> token_ids;
  bool is_tokens = false;
};

struct ProtocolLimits {
  int32_t max_n = 16;          // choices per prompt
  int32_t max_logprobs = 20;   // alternatives per token
  size_t max_stop = 16;        // stop strings
  size_t max_prompts = 64;     // prompts in one /v1/completions request
};

// A structured-output constraint as the request gave it; compiled later (off
// the I/O threads) by the server's GrammarCompiler. Fields that give one:
// response_format (json_object, json_schema), vLLM's structured_outputs
// (json, regex, choice, grammar, json_object) and its older guided_json,
// guided_regex, guided_choice, guided_grammar, and llama-server's json_schema
// and grammar (GBNF). vLLM's grammar fields take Lark, or GBNF when the text
// has GBNF's "::=".
struct StructuredOutputRequest {
  GrammarKind kind = GrammarKind::kJsonObject;
  std::string text;   // a JSON schema's text (key order kept), a regex, a grammar
  std::string param;  // the request field it came from (named in errors)
};

// Tool calling (chat only). tool_choice: "none" renders the tools but parses
// nothing; "auto" lets the model choose and parses what it wrote; "required"
// and a named function are enforced by a grammar built from the tools'
// parameter schemas.
enum class ToolChoice { kNone, kAuto, kRequired, kNamed };

struct ToolSpec {
  std::string name;
  std::string parameters;  // its JSON schema's text, client key order ({"type": "object"} when absent)
};

struct ToolsRequest {
  std::string tools_json;        // the tools as the client gave them (the template's `tools`)
  std::vector<ToolSpec> tools;   // in the client's order, names unique
  ToolChoice choice = ToolChoice::kAuto;
  std::string named;             // kNamed: the function
  bool parallel = true;          // parallel_tool_calls
};

struct GenerationRequest {
  bool chat = false;
  std::string model;                  // empty: the served model
  std::vector<PromptInput> prompts;   // completions
  std::vector<ChatMessage> messages;  // chat
  bool add_generation_prompt = true;  // chat
  std::string chat_template_kwargs;   // chat: extra template variables, a JSON object's text
  int32_t n = 1;
  bool stream = false;
  bool include_usage = false;           // stream_options.include_usage
  std::optional<int64_t> max_tokens;    // absent: the endpoint's default
  SamplingParams sampling;              // temperature, top_p/k, min_p, penalties, seed
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  // vLLM's skip_special_tokens: false puts control tokens' text in the output
  // (never the token that ended it).
  bool skip_special_tokens = true;
  int32_t logprobs = -1;                // alternatives per token; -1: no logprobs
  // completions: the prompt's text before the completion; with `logprobs`,
  // the prompt tokens' logprobs before the completion's (the first null). With
  // max_tokens 0 (allowed only with echo) nothing is generated. Not with stream.
  bool echo = false;
  // vLLM's prompt_logprobs (both endpoints): each prompt token's logprob, rank
  // and this many alternatives, in the response's `prompt_logprobs`; -1: none.
  // Not with stream.
  int32_t prompt_logprobs = -1;
  std::string cache_salt;
  std::optional<StructuredOutputRequest> structured;  // at most one constraint
  std::optional<ToolsRequest> tools;                  // chat: a non-empty 'tools'
  // vLLM's beam search: `n` beams, returned as the n choices, best first.
  // Not with streaming, logprobs or a grammar; length_penalty and
  // early_stopping only with it (as vLLM v0 refused them without).
  bool use_beam_search = false;
  float length_penalty = 1.0f;
  EarlyStopping early_stopping = EarlyStopping::kFalse;
  // chat: llama-server's per-request `reasoning_format` ("none", "auto",
  // "deepseek", and the server flag's "qwen3", "deepseek_r1"); absent: the server's.
  std::optional<ReasoningParser> reasoning_format;
  // chat: OpenAI's reasoning_effort ("low", "medium", "high"; empty: not
  // given), passed to the chat template as `reasoning_effort`.
  std::string reasoning_effort;
  // Prefill/decode disaggregation (server/kv_transfer.h); what it means
  // depends on the instance's --kv-transfer-config.
  std::optional<KVTransferParams> kv_transfer;
};

using ParseResult = std::variant<GenerationRequest, ApiError>;

// Parse a request body. Malformed JSON (invalid UTF-8 included), a wrong type
// or an out-of-range value gives a 400 naming the field.
ParseResult parse_completion_request(std::string_view body, const ProtocolLimits& limits);
ParseResult parse_chat_request(std::string_view body, const ProtocolLimits& limits);

// vLLM's words for a request beyond the context, so clients that parse them work.
ApiError context_length_error(int64_t max_model_len, int64_t prompt_tokens, std::optional<int64_t> max_tokens);
// The same words for a prompt refused by its size in bytes before it was
// tokenized: it has at least `min_prompt_tokens` tokens.
ApiError context_length_error_by_bytes(int64_t max_model_len, int64_t min_prompt_tokens, size_t prompt_bytes,
                                       std::optional<int64_t> max_tokens);

}  // namespace inferd::server
