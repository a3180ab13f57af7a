#include "server/tool_calling.h"

#include <nlohmann/json.hpp>

#include <random>

#include "structured/json_schema.h"

namespace inferd::server {

namespace {

using ordered = nlohmann::ordered_json;

// JSON whitespace inside a call: as for JSON schemas (structured/grammar.cpp),
// one space or a newline and a bounded indent, so a small model cannot run
// away in newlines.
constexpr const char* kWhitespace = "(?: |\\n[ \\t]{0,20})";

}  // namespace

Result<std::string> forced_tool_call_grammar(ToolCallFormat format, const std::vector<ToolSpec>& tools,
                                             const std::string& only, bool parallel, int32_t marker_token) {
  const char* args_key = format == ToolCallFormat::kLlama3Json ? "parameters" : "arguments";
  ordered alternatives = ordered::array();
  for (const ToolSpec& tool : tools) {
    if (!only.empty() && tool.name != only) continue;
    ordered params = ordered::parse(tool.parameters, nullptr, /*allow_exceptions=*/false);
    if (params.is_discarded() || !(params.is_object() || params.is_boolean()))
      return make_error("the parameters of '" + tool.name + "' are not a JSON schema");
    close_json_schema_objects(params);  // as response_format's schemas are
    ordered call = ordered::object();
    call["type"] = "object";
    call["properties"] = ordered::object();
    call["properties"]["name"] = ordered{{"const", tool.name}};
    call["properties"][args_key] = std::move(params);
    call["required"] = ordered::array({"name", args_key});
    call["additionalProperties"] = false;
    alternatives.push_back(std::move(call));
  }
  if (alternatives.empty()) return make_error("no tool named '" + only + "'");
  ordered schema = alternatives.size() == 1 ? alternatives[0] : ordered{{"anyOf", alternatives}};
  if (format == ToolCallFormat::kMistral) {
    // The calls are one JSON array: its length says one call or several.
    ordered array = ordered{{"type", "array"}, {"items", std::move(schema)}, {"minItems", 1}};
    if (!parallel) array["maxItems"] = 1;
    schema = std::move(array);
  }
  schema["x-guidance"] = ordered{{"whitespace_pattern", kWhitespace}};
  const std::string body = schema.dump(-1, ' ', false, ordered::error_handler_t::replace);

  std::string lark;
  switch (format) {
    case ToolCallFormat::kHermes:
      lark += parallel ? "start: call (\"\\n\" call)*\n" : "start: call\n";
      lark += "call: \"<tool_call>\\n\" body \"\\n</tool_call>\"\n";
      break;
    case ToolCallFormat::kLlama3Json:
      lark += parallel ? "start: body (\"; \" body)*\n" : "start: body\n";
      break;
    case ToolCallFormat::kMistral:
      // llguidance names a token by id as <[id]> (its <name> form looks up a
      // special token spelled <...>, which [TOOL_CALLS] is not). Mistral's
      // template writes "[TOOL_CALLS] [": the space is allowed, not forced.
      lark += "start: " +
              (marker_token >= 0 ? "<[" + std::to_string(marker_token) + "]>" : std::string("\"[TOOL_CALLS]\"")) +
              " \" \"? body\n";
      break;
  }
  lark += "body: %json " + body + "\n";
  return lark;
}

int32_t tool_call_marker_token(ToolCallFormat format, const Tokenizer& tokenizer) {
  if (format != ToolCallFormat::kMistral) return -1;
  for (int32_t id = 0; id < tokenizer.n_vocab(); ++id)
    if (tokenizer.is_control(id) && tokenizer.token_text(id) == "[TOOL_CALLS]") return id;
  return -1;
}

std::string new_tool_call_id() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static constexpr char kChars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kChars[rng() % (sizeof(kChars) - 1)];
  return id;
}

bool template_supports_tools(const std::string& source) { return source.find("tools") != std::string::npos; }

}  // namespace inferd::server
