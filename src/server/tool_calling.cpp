#include "server/tool_calling.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <random>

#include "structured/grammar.h"
#include "structured/json_schema.h"

namespace inferd::server {

namespace {

using ordered = nlohmann::ordered_json;

// JSON whitespace inside a call: as for JSON schemas (structured/grammar.cpp),
// one space or a newline and a bounded indent, so a small model cannot run
// away in newlines.
constexpr const char* kWhitespace = "(?: |\\n[ \\t]{0,20})";

// A string as a Lark literal (JSON's escapes are Lark's).
std::string lark_string(const std::string& s) { return ordered(s).dump(-1, ' ', false, ordered::error_handler_t::replace); }

// A schema prepared as response_format's are: objects closed, whitespace bounded.
std::string json_body(ordered schema) {
  close_json_schema_objects(schema);
  if (schema.is_object() && !schema.contains("x-guidance")) schema["x-guidance"] = ordered{{"whitespace_pattern", kWhitespace}};
  return schema.dump(-1, ' ', false, ordered::error_handler_t::replace);
}

// Harmony: messages the model may write before the one the grammar is about,
// each one lexeme from <|channel|> through <|end|> and the next message's
// <|start|>assistant (a body holds no <|end|>). `channels` a Lark regex
// alternation such as "analysis|commentary".
std::string harmony_messages_terminal(const std::string& channels) {
  return "MSG: /<\\|channel\\|>(?:" + channels +
         ")<\\|message\\|>(?s:.)*<\\|end\\|><\\|start\\|>assistant/ & "
         "~/(?s:.)*<\\|end\\|>(?s:.)*<\\|end\\|>(?s:.)*/\n";
}

// The schema of a tool's parameters as %json takes it (or an error).
Result<ordered> parameter_schema(const ToolSpec& tool) {
  ordered params = ordered::parse(tool.parameters, nullptr, /*allow_exceptions=*/false);
  if (params.is_discarded() || !(params.is_object() || params.is_boolean()))
    return make_error("the parameters of '" + tool.name + "' are not a JSON schema");
  if (params.is_boolean()) params = ordered::object();
  return params;
}

// Qwen3-Coder: a call's parameters, in the schema's order, required ones
// always and the others optionally. A string parameter's value is one of its
// enum's strings when it has one, else any text up to the first
// "\n</parameter>\n"; any other is JSON valid against its schema.
Result<std::string> qwen3_coder_call_rules(const ToolSpec& tool, size_t k, std::string& rules) {
  auto params = parameter_schema(tool);
  if (!params) return params.error();
  std::vector<std::string> required;
  if (auto r = params->find("required"); r != params->end() && r->is_array())
    for (const ordered& x : *r)
      if (x.is_string()) required.push_back(x.get<std::string>());
  std::string body;
  size_t j = 0;
  if (auto props = params->find("properties"); props != params->end() && props->is_object()) {
    for (auto it = props->begin(); it != props->end(); ++it, ++j) {
      const std::string rule = "p" + std::to_string(k) + "_" + std::to_string(j);
      ordered sub = it.value();
      bool text = !sub.is_object() || !sub.contains("type");
      if (sub.is_object() && sub.contains("type")) {
        const ordered& t = sub["type"];
        text = (t.is_string() && t.get<std::string>() == "string");
        if (t.is_array())
          for (const ordered& x : t) text = text || (x.is_string() && x.get<std::string>() == "string");
      }
      rules += rule + ": " + lark_string("<parameter=" + it.key() + ">\n");
      // A string's enum (or const) is its values' text, a choice among them.
      std::vector<std::string> choices;
      if (text && sub.is_object()) {
        if (auto c = sub.find("const"); c != sub.end() && c->is_string()) choices.push_back(c->get<std::string>());
        if (auto e = sub.find("enum"); e != sub.end() && e->is_array())
          for (const ordered& v : *e) {
            if (!v.is_string()) {
              choices.clear();  // a mixed enum: its strings are not all it allows
              break;
            }
            choices.push_back(v.get<std::string>());
          }
      }
      if (!choices.empty()) {
        rules += " (";
        for (size_t c = 0; c < choices.size(); ++c) rules += (c ? " | " : "") + lark_string(choices[c]);
        rules += ") \"\\n</parameter>\\n\"\n";
      } else if (text) {
        rules += " VALUE_TEXT\n";
      } else {
        // References into the parameters' definitions still resolve.
        for (const char* defs : {"$defs", "definitions"})
          if (params->contains(defs) && !sub.contains(defs)) sub[defs] = (*params)[defs];
        rules += " " + rule + "_v \"\\n</parameter>\\n\"\n" + rule + "_v: %json " + json_body(std::move(sub)) + "\n";
      }
      const bool is_required = std::find(required.begin(), required.end(), it.key()) != required.end();
      body += " " + rule + (is_required ? "" : "?");
    }
  }
  rules += "call" + std::to_string(k) + ": " + lark_string("<tool_call>\n<function=" + tool.name + ">\n") + body +
           " \"</function>\\n</tool_call>\"\n";
  return std::string("call" + std::to_string(k));
}

}  // namespace

Result<std::string> harmony_final_grammar(GrammarKind kind, const std::string& text) {
  ordered schema;
  if (kind == GrammarKind::kJsonObject) {
    schema = ordered{{"type", "object"}};
  } else if (kind == GrammarKind::kJsonSchema) {
    schema = ordered::parse(text, nullptr, /*allow_exceptions=*/false);
    if (schema.is_discarded()) return make_error("the JSON schema is not valid JSON");
    if (schema.is_boolean()) schema = ordered::object();
  } else {
    return make_error(std::string("with gpt-oss's harmony format only JSON (a schema or json_object) can be "
                                  "enforced on the final message, not ") +
                      grammar_kind_name(kind));
  }
  std::string lark = "start: MSG* FINAL_HEAD body\n";
  lark += harmony_messages_terminal("analysis");
  lark += "FINAL_HEAD: \"<|channel|>final\" (\" <|constrain|>json\" | \" json\")? \"<|message|>\"\n";
  lark += "body: %json " + json_body(std::move(schema)) + "\n";
  return lark;
}

Result<std::string> forced_tool_call_grammar(ToolCallFormat format, const std::vector<ToolSpec>& tools,
                                             const std::string& only, bool parallel, int32_t marker_token) {
  if (format == ToolCallFormat::kQwen3Coder || format == ToolCallFormat::kHarmony) {
    std::string rules, alternatives;
    size_t k = 0;
    for (const ToolSpec& tool : tools) {
      if (!only.empty() && tool.name != only) continue;
      std::string rule;
      if (format == ToolCallFormat::kQwen3Coder) {
        auto r = qwen3_coder_call_rules(tool, k, rules);
        if (!r) return r.error();
        rule = *r;
      } else {
        // The recipient in the channel's header or in the role's (both as
        // the model may write them), then the arguments' JSON.
        auto params = parameter_schema(tool);
        if (!params) return params.error();
        const std::string n = std::to_string(k);
        rule = "call" + n;
        rules += "HEAD" + n + ": (\"<|channel|>\" CHANNEL " + lark_string(" to=functions." + tool.name) +
                 " | " + lark_string(" to=functions." + tool.name + "<|channel|>") +
                 " CHANNEL) (\" <|constrain|>json\" | \" json\")? \"<|message|>\"\n";
        rules += rule + ": HEAD" + n + " args" + n + "\n";
        rules += "args" + n + ": %json " + json_body(std::move(*params)) + "\n";
      }
      alternatives += (alternatives.empty() ? "" : " | ") + rule;
      ++k;
    }
    if (alternatives.empty()) return make_error("no tool named '" + only + "'");
    std::string lark;
    if (format == ToolCallFormat::kQwen3Coder) {
      lark = parallel ? "start: call (\"\\n\" call)*\n" : "start: call\n";
      lark += "VALUE_TEXT: /(?s:.)*\\n<\\/parameter>\\n/ & ~/(?s:.)*\\n<\\/parameter>\\n(?s:.)+/\n";
    } else {
      // One call per output: <|call|> ends the generation. Analysis and
      // commentary messages may come first, free.
      lark = "start: MSG* call\n";
      lark += harmony_messages_terminal("analysis|commentary");
      lark += "CHANNEL: \"commentary\" | \"analysis\"\n";
    }
    lark += "call: " + alternatives + "\n" + rules;
    return lark;
  }
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
    case ToolCallFormat::kQwen3Coder:
    case ToolCallFormat::kHarmony:
      break;  // above
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
