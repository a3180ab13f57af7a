// Tool calls in a model's output: finds the calls a chat model wrote in its
// own format and splits them from the plain answer, whole or while streaming.
//
// The formats of the template families people serve:
//   hermes      <tool_call>{"name": ..., "arguments": {...}}</tool_call>, any
//               number, text around them (Qwen2/2.5/3, Hermes, many fine-tunes)
//   llama3_json the whole answer is {"name": ..., "parameters": {...}} (or
//               "arguments"), several separated by ';', after an optional
//               <|python_tag|> (Llama 3.1-3.3's JSON tool calling)
//   mistral     [TOOL_CALLS] then a JSON array of {"name", "arguments"}
//               objects (v3 tokenizers), or name[ARGS]{...} per call (v11+)
//   qwen3_coder <tool_call>\n<function=NAME>\n<parameter=ARG>\nVALUE\n</parameter>\n
//               ...</function>\n</tool_call> (Qwen3-Coder); a value is text,
//               turned into JSON by the type the function's parameter schema
//               gives it, as vLLM's qwen3_coder parser and llama.cpp do: a
//               string stays the text; numbers, booleans, null, objects and
//               arrays are parsed as JSON (text that does not parse stays a
//               string); a parameter the schema does not know is a string
//   harmony     gpt-oss's channels (chat/harmony.h parses them; this parser
//               does not take this format)
//
// A call is only reported once it is complete and parses: a malformed or cut
// call stays in the content as the model wrote it, so a bad answer is still
// an answer (never an error). Parsing the whole output and parsing it in
// pieces give the same result: the whole-text parse is the stream parser fed
// once.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace inferd {

enum class ToolCallFormat { kHermes, kLlama3Json, kMistral, kQwen3Coder, kHarmony };

// "hermes", "llama3_json", "mistral", "qwen3_coder", "openai" (the names vLLM's
// --tool-call-parser uses; "harmony" too for openai).
std::optional<ToolCallFormat> tool_call_format_from_name(std::string_view name);
const char* tool_call_format_name(ToolCallFormat format);
// The format a chat template's tool section asks the model for, from markers
// in the template's source; nullopt when the template shows no tool support.
std::optional<ToolCallFormat> detect_tool_call_format(std::string_view template_source);

struct ParsedToolCall {
  std::string name;
  std::string arguments;  // a JSON object, as compact text (OpenAI's `arguments` string)
};

// A function the request offers: its name and parameters' JSON schema (text).
// qwen3_coder reads the parameters' types from it.
struct ToolSignature {
  std::string name;
  std::string parameters;
};

struct ParsedAssistantMessage {
  std::string content;  // the text outside the calls, surrounding whitespace trimmed
  std::vector<ParsedToolCall> tool_calls;
};

// What a piece of streamed output adds: content text, a complete call, or both
// (content first). A call comes whole, in one delta: the server sends its name
// and then its arguments, as OpenAI streams them.
struct ToolCallDelta {
  std::string content;
  std::optional<ParsedToolCall> call;
  int call_index = -1;  // the call's index among this output's calls
};

class ToolCallStreamParser {
 public:
  // `bare_call_names` (hermes only): an answer that opens with a call's JSON
  // object alone, {"name": ..., "arguments": {...}} without the <tool_call>
  // tags, naming one of these functions, counts as a call too, and so does
  // one in a ```json (or ```xml, ```) fence or in another tag
  // (<tools>, <function_call>, <json>, ...; kBareCallTags). Small Qwen models
  // often write their calls so; llama.cpp's hermes parser accepted the same
  // openers. Empty: only tagged calls.
  // `signatures` (qwen3_coder): the request's functions, whose schemas type
  // the arguments.
  explicit ToolCallStreamParser(ToolCallFormat format, std::vector<std::string> bare_call_names = {},
                                std::vector<ToolSignature> signatures = {})
      : format_(format), bare_call_names_(std::move(bare_call_names)), signatures_(std::move(signatures)) {}
  // The deltas that text (the next piece of output) completes. Text that may
  // start a call is held back until it is known whether it does.
  std::vector<ToolCallDelta> feed(std::string_view text);
  // The end of the output: held-back text becomes content, and so does an
  // unfinished call (a hermes call whose closing tag alone is missing counts
  // as finished when its JSON is whole).
  std::vector<ToolCallDelta> finish();

 private:
  enum class State { kStart, kContent, kInCall, kAfterJsonCall };
  void step(std::vector<ToolCallDelta>& out, bool at_end);
  bool step_content(std::vector<ToolCallDelta>& out, bool at_end);
  bool step_in_call(std::vector<ToolCallDelta>& out, bool at_end);
  bool step_after_json_call(bool at_end);
  void emit_content(std::vector<ToolCallDelta>& out, std::string_view text);
  void accept_calls(std::vector<ToolCallDelta>& out, std::vector<ParsedToolCall> calls, size_t end);
  void reject_call(std::vector<ToolCallDelta>& out, size_t end);

  ToolCallFormat format_;
  std::vector<std::string> bare_call_names_;
  std::vector<ToolSignature> signatures_;
  bool bare_ = false;  // the call in buffer_ has no tags (hermes)
  std::vector<std::string> bare_closers_;  // what closes its wrappers: a tag, a code fence
  State state_ = State::kStart;
  std::string buffer_;      // output not yet turned into deltas
  std::string raw_prefix_;  // the text that opened the call in buffer_ (content if it fails)
  int calls_ = 0;
};

// The whole output at once.
ParsedAssistantMessage parse_tool_calls(ToolCallFormat format, std::string_view output,
                                        std::vector<std::string> bare_call_names = {},
                                        std::vector<ToolSignature> signatures = {});

// One Qwen3-Coder call, the text between <tool_call> and </tool_call>
// (surrounding whitespace allowed), its values typed by `signatures`;
// nullopt when it is not such a call.
std::optional<ParsedToolCall> parse_qwen3_coder_call(std::string_view text,
                                                     const std::vector<ToolSignature>& signatures);

// Where the JSON object or array that starts at text[begin] (after
// whitespace) ends: string escapes and nesting are followed, nothing else is
// validated (the caller parses the span).
struct JsonScan {
  enum Status { kComplete, kIncomplete, kInvalid } status = kInvalid;
  size_t end = 0;  // one past the closing bracket, when complete
};
JsonScan scan_json_value(std::string_view text, size_t begin, int max_depth = 128);

}  // namespace inferd
