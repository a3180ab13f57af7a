// Anthropic's Messages API (/v1/messages) as a protocol: the request body
// turned into the chat request the serving core prepares (system prompt,
// content blocks, tools and tool_choice, thinking, stop_sequences), its
// errors in Anthropic's shape, and the response and its server-sent events
// built from what the model wrote. Pure (no engine, no tokenizer), so every
// case is unit-tested without a model; serving_messages.cpp plugs it into the
// core.
//
// How Anthropic's shapes map onto the chat path:
//   system (string or text blocks)    a leading "system" message
//   user text blocks                  the user message's content, joined
//   user tool_result blocks           "tool" messages (tool_call_id = tool_use_id),
//                                     in their place among the text
//   assistant tool_use blocks         the assistant message's tool_calls
//   assistant thinking blocks         its reasoning_content
//   tools {name, description, input_schema}   OpenAI's function tools
//   tool_choice auto / any / tool / none      auto / required / named / none
//   thinking enabled (or adaptive)    the template's enable_thinking, and the
//                                     thinking returned as thinking blocks
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "server/openai_protocol.h"

namespace inferd::server {

struct MessagesRequest {
  GenerationRequest req;  // chat: messages, tools, sampling, stop, max_tokens, stream
  // thinking {type: enabled|adaptive}: the model may think, and its thinking
  // comes back as thinking blocks; otherwise the template is asked not to
  // think (enable_thinking false) and thinking the model writes anyway is dropped.
  bool thinking = false;
};

// /v1/messages (max_tokens required, as Anthropic requires it) or, with
// `count_tokens`, /v1/messages/count_tokens (no max_tokens, no sampling).
// Errors are 400s whose message names the field.
std::variant<MessagesRequest, ApiError> parse_messages_request(std::string_view body, const ProtocolLimits& limits,
                                                               bool count_tokens = false);

// Anthropic's error type for an HTTP status (invalid_request_error,
// authentication_error, not_found_error, rate_limit_error, api_error,
// overloaded_error, ...).
const char* anthropic_error_type(int status);
// {"type": "error", "error": {"type": ..., "message": ...}}.
nlohmann::json anthropic_error(const ApiError& e);
std::string anthropic_error_json(const ApiError& e);

// A new tool_use id: "toolu_" and 24 letters or digits.
std::string new_tool_use_id();

// Anthropic's stop_reason for how a generation ended: "tool_use" when it
// called a tool, "stop_sequence" when one of the request's stop sequences
// ended it, "max_tokens" at the token limit, "end_turn" otherwise; null for
// an aborted generation (Anthropic has no word for it).
nlohmann::json messages_stop_reason(const std::string& finish_reason, const std::string& stop_string,
                                    bool called_tool);

// What a finished generation said, in order: thinking, then text, then tool calls.
struct MessageResult {
  std::string thinking;
  std::string text;
  struct ToolUse {
    std::string name;
    std::string arguments;  // a JSON object's text
  };
  std::vector<ToolUse> tool_uses;
  std::string finish_reason;  // the engine's: stop, length, abort
  std::string stop_string;    // the stop sequence that ended it, if one did
  int64_t input_tokens = 0;
  int64_t output_tokens = 0;
};

// The whole response: {id, type "message", role "assistant", model, content,
// stop_reason, stop_sequence, usage}.
nlohmann::json message_json(const std::string& id, const std::string& model, const MessageResult& r);

// The server-sent events of one streamed message, as Anthropic sends them:
// message_start (and a ping), then for each content block its
// content_block_start, deltas (thinking_delta, text_delta, input_json_delta)
// and content_block_stop, then message_delta (stop_reason, usage) and
// message_stop. Each method returns the events' text ("" for none).
class MessagesEventWriter {
 public:
  MessagesEventWriter(std::string id, std::string model, int64_t input_tokens)
      : id_(std::move(id)), model_(std::move(model)), input_tokens_(input_tokens) {}

  std::string start();
  std::string thinking(const std::string& text);
  std::string text(const std::string& text);
  // A whole call: its block opens with the name and an empty input, one
  // input_json_delta carries the arguments, and the block closes.
  std::string tool_use(const std::string& name, const std::string& arguments);
  // The open block closed, message_delta and message_stop.
  std::string finish(const std::string& finish_reason, const std::string& stop_string, int64_t output_tokens);
  // An `error` event (generation failed after the stream opened).
  std::string error(const ApiError& e) const;

 private:
  enum class Block { kNone, kThinking, kText };
  // Opens a block of `kind` unless one is open; closes another kind first.
  std::string open(Block kind);
  std::string close();

  const std::string id_, model_;
  const int64_t input_tokens_;
  Block open_ = Block::kNone;
  int index_ = -1;  // the current (or last) block's index
  bool called_tool_ = false;
};

// One SSE event: "event: <type>\ndata: <json>\n\n".
std::string sse_event(const nlohmann::json& data);

}  // namespace inferd::server
