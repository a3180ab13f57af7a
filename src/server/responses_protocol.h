// OpenAI's Responses API (/v1/responses), the protocol alone: a request's
// body turned into the Chat Completions request it means (so it shares the
// chat path's validation, templates, tools, structured outputs and
// reasoning), a generation's results turned into output items and the
// Response object, and the semantic stream events in their order with their
// sequence numbers. Pure (no engine, no tokenizer): unit-tested without a model.
//
// The shapes follow openai-python's types (src/openai/types/responses/).
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "server/openai_protocol.h"

namespace inferd::server {

using ordered_json = nlohmann::ordered_json;

// A function tool given inside a `namespace` tool (Codex groups its
// sub-agent tools so): the model sees it under one flat name, and its calls
// go back with the namespace and the inner name apart.
struct NamespacedTool {
  std::string namespace_name;
  std::string name;
};

// The flat name a namespaced tool has for the model: "<namespace>__<name>",
// the join Codex itself uses where a namespace cannot be kept apart.
std::string flat_tool_name(const std::string& namespace_name, const std::string& name);

// A POST /v1/responses body, checked.
struct ResponsesRequest {
  ordered_json body;                 // as the client gave it (the Response echoes its settings)
  std::vector<ordered_json> input;   // this request's input items (a string input: one user message)
  std::string previous_response_id;  // empty: none
  bool store = true;
  bool stream = false;
  // `tools` as Chat Completions' function tools: namespaces flattened, hosted tools left out.
  ordered_json chat_tools = ordered_json::array();
  std::map<std::string, NamespacedTool> namespaced_tools;  // by flat name
  // The hosted tools' types (web_search, file_search, ...) that were left out:
  // this server runs no tool itself, and a client that offers them (Codex
  // offers web_search) still gets its function tools.
  std::vector<std::string> ignored_tool_types;
};

std::variant<ResponsesRequest, ApiError> parse_responses_request(std::string_view body);

// The Chat Completions body that `req` means, its conversation being
// `history` (a previous response's input and output items, oldest first)
// followed by req.input: instructions as the system message, message items
// as messages, function_call items (and the reasoning before them) as an
// assistant message's tool_calls, function_call_output items as tool
// messages; tools, tool_choice, text.format (response_format), reasoning
// (reasoning_effort), max_output_tokens and the sampling parameters carried
// over. A 400 for item types it does not know, an empty conversation, or a
// function_call_output whose call_id no function_call has.
std::variant<std::string, ApiError> responses_chat_body(const ResponsesRequest& req,
                                                       const std::vector<ordered_json>& history);

// What one choice produced, as the output items say it.
struct ResponseResult {
  std::string reasoning;                               // empty: no reasoning item
  std::string content;                                 // the answer's text
  nlohmann::json tool_calls = nlohmann::json::array();  // chat's shape: {id, type, function: {name, arguments}}
  bool incomplete = false;                             // stopped by max_output_tokens
};

// Item ids as OpenAI writes them: a prefix ("msg", "rs", "fc", "resp") and 48 hex digits.
std::string new_item_id(std::string_view prefix);

// A function_call item's name (and namespace, for a namespaced tool's flat name).
void set_call_name(ordered_json& item, const std::string& called, const ResponsesRequest& req);

// The output items of a result: a reasoning item (when there is reasoning),
// the message (when there is text, or nothing else), one function_call item
// per call (a namespaced tool's call named as the request gave it).
ordered_json response_output_items(const ResponseResult& result, const ResponsesRequest& req);

// The Response object: the request's settings echoed, `output`, `status`
// ("completed", "incomplete", "in_progress"), and usage (null while in progress).
struct ResponseUsage {
  int64_t input_tokens = 0, cached_tokens = 0, output_tokens = 0, reasoning_tokens = 0;
};
ordered_json response_object(const ResponsesRequest& req, const std::string& id, int64_t created_at,
                             const std::string& model, const std::string& status, ordered_json output,
                             const ResponseUsage* usage);

// The stream of one response: each call returns the SSE events for what it
// adds, each event with its `sequence_number`, the items opened and closed in
// the official order (output_item.added, content_part.added, the deltas,
// the .done events, content_part.done, output_item.done).
class ResponseEventStream {
 public:
  ResponseEventStream(ResponsesRequest req, std::string id, int64_t created_at, std::string model);

  // response.created and response.in_progress.
  std::string begin();
  // A piece of the reasoning: opens a reasoning item if none is open.
  std::string reasoning_delta(const std::string& text);
  // A piece of the answer's text: opens a message item if none is open
  // (whitespace alone waits for more text: it is dropped before a call).
  std::string text_delta(const std::string& text);
  // A whole tool call: its function_call item added, its arguments as one
  // delta, then done.
  std::string function_call(const std::string& call_id, const std::string& name, const std::string& arguments);
  // The open items closed, then response.completed (or response.incomplete).
  std::string finish(bool incomplete, const ResponseUsage& usage);
  // An error event (generation failed).
  std::string error(const std::string& message);

  // The final Response object (after finish()).
  const ordered_json& response() const { return final_; }

 private:
  enum class Open { kNone, kReasoning, kMessage };
  std::string event(ordered_json e);  // numbered and framed as SSE
  std::string open_item(Open kind);   // closes the open item, opens a reasoning item or a message
  std::string close_open_item();      // its .done events; it joins output_
  std::string append(Open kind, const std::string& text);  // to the open item of that kind (opened if need be)

  ResponsesRequest req_;
  std::string id_, model_;
  int64_t created_at_;
  int64_t sequence_ = 0;
  ordered_json output_ = ordered_json::array();  // the items done so far
  Open open_ = Open::kNone;
  std::string open_id_, open_text_;
  std::string held_space_;  // whitespace not yet sent
  bool any_call_ = false;
  ordered_json final_;
};

}  // namespace inferd::server
