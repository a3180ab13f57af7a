// gpt-oss's "harmony" output format: the model writes a sequence of messages,
// each a header, <|message|>, a body and a terminator, after the template's
// generation prompt <|start|>assistant:
//
//   <|channel|>analysis<|message|>...thinking...<|end|>
//   <|start|>assistant<|channel|>final<|message|>...answer...<|return|>
//
// or a tool call, the recipient in the channel or in the role:
//
//   <|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>
//   <|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{...}<|call|>
//
// Mapped as vLLM (openai_harmony) and llama-server (common/chat.cpp, its
// gpt-oss parser) map it: `analysis` -> reasoning; `final` -> content; a
// message to `functions.NAME` (commentary or analysis channel) -> a tool call
// whose arguments are the body's JSON object; `commentary` without a
// recipient (a "preamble") -> content, as llama-server does. Separate
// analysis messages are joined with a newline (vLLM).
//
// A message ends at <|end|>, <|call|>, <|return|> or the end of the output
// (the engine stops on <|call|> and <|return|> and leaves them out of the
// text). As in tool_calls.h, a call is reported once complete and valid: a
// call whose body is not a JSON object (cut, malformed), a message to another
// recipient, and a body of an unknown channel become content as written, so a
// bad answer is still an answer. Text that is no harmony at all (no header)
// is content too. Parsing the whole output and parsing it in pieces give the
// same result.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "chat/tool_calls.h"

namespace inferd {

// The chat template writes harmony: it mentions <|channel|>.
bool template_uses_harmony(std::string_view template_source);

// One piece of parsed output: reasoning text, content text, or a whole call.
struct HarmonyDelta {
  std::string reasoning;
  std::string content;
  std::optional<ParsedToolCall> call;
  int call_index = -1;
};

class HarmonyStreamParser {
 public:
  // parse_tool_calls false (no tools, tool_choice "none"): calls to functions
  // are content, their JSON as written.
  explicit HarmonyStreamParser(bool parse_tool_calls = true) : parse_calls_(parse_tool_calls) {}
  std::vector<HarmonyDelta> feed(std::string_view text);
  std::vector<HarmonyDelta> finish();

 private:
  enum class State { kHeader, kBody };
  enum class Kind { kReasoning, kContent, kCall };
  void run(std::vector<HarmonyDelta>& out, bool at_end);
  bool step_header(std::vector<HarmonyDelta>& out, bool at_end);
  bool step_body(std::vector<HarmonyDelta>& out, bool at_end);
  void emit(std::vector<HarmonyDelta>& out, Kind kind, std::string_view text);

  bool parse_calls_;
  State state_ = State::kHeader;
  Kind kind_ = Kind::kContent;
  std::string recipient_;  // kCall: the function's name
  std::string buffer_;
  bool reasoning_seen_ = false;       // a reasoning message was written (the next one starts with "\n")
  bool message_has_text_ = false;     // the current reasoning message has emitted text
  int calls_ = 0;
};

struct HarmonyMessage {
  std::string reasoning;
  std::string content;  // trimmed
  std::vector<ParsedToolCall> tool_calls;
};

// The whole output at once.
HarmonyMessage parse_harmony(std::string_view output, bool parse_tool_calls = true);

}  // namespace inferd
