#include "server/openai_protocol.h"

#include <nlohmann/json.hpp>

#include <cctype>
#include <cmath>
#include <limits>

#include "structured/gbnf.h"

namespace inferd::server {

using json = nlohmann::json;

namespace {

using parsing::fail;
using parsing::Invalid;

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    default: return "a number";
  }
}

// A present, non-null field.
const json* field(const json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

bool get_bool(const json& body, const char* name, bool fallback) {
  const json* v = field(body, name);
  if (!v) return fallback;
  if (!v->is_boolean()) fail(std::string("'") + name + "' must be a boolean, not " + type_name(*v), name);
  return v->get<bool>();
}

// Integers as JSON integers, or as numbers with no fraction (16.0), as
// Python's lax validation accepts them.
int64_t as_integer(const json& v, const std::string& name) {
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      fail("'" + name + "' is too large", name);
    return v.get<int64_t>();
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.2e18) return static_cast<int64_t>(d);
    fail("'" + name + "' must be an integer, not " + v.dump(), name);
  }
  fail("'" + name + "' must be an integer, not " + std::string(type_name(v)), name);
}

std::optional<int64_t> get_int(const json& body, const char* name) {
  const json* v = field(body, name);
  if (!v) return std::nullopt;
  return as_integer(*v, name);
}

std::optional<double> get_number(const json& body, const char* name) {
  const json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_number()) fail(std::string("'") + name + "' must be a number, not " + type_name(*v), name);
  return v->get<double>();
}

std::string fmt(double d) {
  json j = d;
  return j.dump();
}

// A number in [lo, hi] (or (lo, hi] when lo_open).
float get_ranged(const json& body, const char* name, float fallback, double lo, double hi, bool lo_open = false) {
  const auto v = get_number(body, name);
  if (!v) return fallback;
  if ((lo_open ? *v <= lo : *v < lo) || *v > hi)
    fail(std::string("'") + name + "' must be in " + (lo_open ? "(" : "[") + fmt(lo) + ", " + fmt(hi) + "], got " +
             fmt(*v),
         name);
  return static_cast<float>(*v);
}

std::string get_string(const json& body, const char* name) {
  const json* v = field(body, name);
  if (!v) return {};
  if (!v->is_string()) fail(std::string("'") + name + "' must be a string, not " + type_name(*v), name);
  return v->get<std::string>();
}

std::vector<int32_t> token_ids(const json& arr, const std::string& name) {
  std::vector<int32_t> ids;
  ids.reserve(arr.size());
  for (size_t i = 0; i < arr.size(); ++i) {
    const std::string item = name + "[" + std::to_string(i) + "]";
    if (!arr[i].is_number_integer()) fail("'" + item + "' must be a token id (an integer)", name);
    const int64_t id = as_integer(arr[i], item);
    if (id < 0 || id > std::numeric_limits<int32_t>::max()) fail("'" + item + "' is not a valid token id", name);
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

// Fields both endpoints share.
void parse_common(const json& body, GenerationRequest& r, const ProtocolLimits& limits) {
  r.model = get_string(body, "model");
  if (const auto n = get_int(body, "n")) {
    if (*n < 1 || *n > limits.max_n)
      fail("'n' must be between 1 and " + std::to_string(limits.max_n) + ", got " + std::to_string(*n), "n");
    r.n = static_cast<int32_t>(*n);
  }
  if (const auto best_of = get_int(body, "best_of"); best_of && *best_of != r.n)
    fail("'best_of' different from 'n' is not supported", "best_of");
  r.stream = get_bool(body, "stream", false);
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object()) fail("'stream_options' must be an object", "stream_options");
    if (!r.stream) fail("'stream_options' is only allowed when 'stream' is true", "stream_options");
    r.include_usage = get_bool(*so, "include_usage", false);
  }

  SamplingParams& s = r.sampling;
  s.temperature = get_ranged(body, "temperature", 1.0f, 0.0, 2.0);
  s.top_p = get_ranged(body, "top_p", 1.0f, 0.0, 1.0, /*lo_open=*/true);
  s.min_p = get_ranged(body, "min_p", 0.0f, 0.0, 1.0);
  s.presence_penalty = get_ranged(body, "presence_penalty", 0.0f, -2.0, 2.0);
  s.frequency_penalty = get_ranged(body, "frequency_penalty", 0.0f, -2.0, 2.0);
  s.repetition_penalty = get_ranged(body, "repetition_penalty", 1.0f, 0.0, 2.0, /*lo_open=*/true);
  if (const auto k = get_int(body, "top_k")) {
    if (*k < -1 || *k > std::numeric_limits<int32_t>::max())
      fail("'top_k' must be -1 (disabled) or at least 0, got " + std::to_string(*k), "top_k");
    s.top_k = static_cast<int32_t>(*k);
  }
  if (const auto seed = get_int(body, "seed")) s.seed = static_cast<uint64_t>(*seed);

  if (const json* stop = field(body, "stop")) {
    if (stop->is_string()) {
      r.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (const json& s_item : *stop) {
        if (!s_item.is_string()) fail("'stop' must be a string or an array of strings", "stop");
        r.stop.push_back(s_item.get<std::string>());
      }
    } else {
      fail("'stop' must be a string or an array of strings, not " + std::string(type_name(*stop)), "stop");
    }
    if (r.stop.size() > limits.max_stop)
      fail("'stop' has " + std::to_string(r.stop.size()) + " strings; at most " + std::to_string(limits.max_stop) +
               " are allowed",
           "stop");
    for (const std::string& s_item : r.stop)
      if (s_item.empty()) fail("'stop' strings must not be empty", "stop");
  }
  if (const json* ids = field(body, "stop_token_ids")) {
    if (!ids->is_array()) fail("'stop_token_ids' must be an array of integers", "stop_token_ids");
    r.stop_token_ids = token_ids(*ids, "stop_token_ids");
  }
  r.ignore_eos = get_bool(body, "ignore_eos", false);
  if (const auto k = get_int(body, "prompt_logprobs")) {
    // vLLM's -1 (the whole vocabulary per token) is not offered.
    if (*k < 0 || *k > limits.max_logprobs)
      fail("'prompt_logprobs' must be between 0 and " + std::to_string(limits.max_logprobs) + ", got " +
               std::to_string(*k),
           "prompt_logprobs");
    if (r.stream) fail("'prompt_logprobs' is not supported with 'stream'", "prompt_logprobs");
    r.prompt_logprobs = static_cast<int32_t>(*k);
  }
  r.skip_special_tokens = get_bool(body, "skip_special_tokens", true);
  r.cache_salt = get_string(body, "cache_salt");
  if (field(body, "cache_salt") && r.cache_salt.empty()) fail("'cache_salt' must not be empty", "cache_salt");

  if (const json* bias = field(body, "logit_bias"); bias && !(bias->is_object() && bias->empty()))
    fail("'logit_bias' is not supported", "logit_bias");
  if (const auto min_tokens = get_int(body, "min_tokens"); min_tokens && *min_tokens != 0)
    fail("'min_tokens' is not supported", "min_tokens");
  if (get_bool(body, "include_stop_str_in_output", false))
    fail("'include_stop_str_in_output' is not supported", "include_stop_str_in_output");
  (void)get_string(body, "user");  // accepted, unused
  if (const json* kv = field(body, "kv_transfer_params")) {
    Result<KVTransferParams> params = parse_kv_transfer_params(kv->dump());
    if (!params) fail(params.error().message, "kv_transfer_params");
    r.kv_transfer = std::move(*params);
  }

  // vLLM's beam search (its extra parameters).
  r.use_beam_search = get_bool(body, "use_beam_search", false);
  if (const auto lp = get_number(body, "length_penalty")) {
    if (std::fabs(*lp) > 1e6) fail("'length_penalty' must be in [-1e6, 1e6], got " + fmt(*lp), "length_penalty");
    r.length_penalty = static_cast<float>(*lp);
  }
  if (const json* es = field(body, "early_stopping")) {
    if (es->is_boolean()) r.early_stopping = es->get<bool>() ? EarlyStopping::kTrue : EarlyStopping::kFalse;
    else if (es->is_string() && *es == "never") r.early_stopping = EarlyStopping::kNever;
    else fail("'early_stopping' must be true, false or \"never\"", "early_stopping");
  }
  if (!r.use_beam_search) {
    if (r.length_penalty != 1.0f) fail("'length_penalty' is only used with 'use_beam_search'", "length_penalty");
    if (r.early_stopping != EarlyStopping::kFalse)
      fail("'early_stopping' is only used with 'use_beam_search'", "early_stopping");
  } else if (r.stream) {
    fail("'stream' is not supported with 'use_beam_search': the beams are ranked when they have all finished",
         "stream");
  }
}

// What beam search cannot be combined with (checked once the whole body is read).
void check_beam_search(const GenerationRequest& r) {
  if (!r.use_beam_search) return;
  if (r.logprobs >= 0) fail("'logprobs' is not supported with 'use_beam_search'", "logprobs");
  if (r.prompt_logprobs >= 0) fail("'prompt_logprobs' is not supported with 'use_beam_search'", "prompt_logprobs");
  if (r.echo) fail("'echo' is not supported with 'use_beam_search'", "echo");
  if (r.structured) fail("'" + r.structured->param + "' cannot be combined with 'use_beam_search'", r.structured->param);
  if (r.tools && (r.tools->choice == ToolChoice::kRequired || r.tools->choice == ToolChoice::kNamed))
    fail("'tool_choice' that forces a call cannot be combined with 'use_beam_search'", "tool_choice");
}

// `min` is 0 where echo may score the prompt alone (completions; checked there).
void parse_max_tokens(const json& body, const char* name, GenerationRequest& r, int64_t min = 1) {
  if (const auto m = get_int(body, name)) {
    if (*m < min) fail(std::string("'") + name + "' must be at least " + std::to_string(min) + ", got " + std::to_string(*m), name);
    r.max_tokens = *m;
  }
}

json parse_body(std::string_view body) {
  json j;
  try {
    j = json::parse(body.begin(), body.end());
  } catch (const json::parse_error& e) {
    const std::string what = e.what();
    if (what.find("UTF-8") != std::string::npos || what.find("utf-8") != std::string::npos)
      fail("the request body is not valid UTF-8: " + what, "");
    fail("the request body is not valid JSON: " + what, "");
  } catch (const json::out_of_range&) {
    // A number past the range of a double (1e999): the parser's out_of_range.406.
    fail("the request body holds a number outside the range of a double", "");
  }
  if (!j.is_object()) fail("the request body must be a JSON object, not " + std::string(type_name(j)), "");
  return j;
}

// Text of a message's content: a string, or an array of text parts.
std::string message_content(const json& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (content.is_array()) {
    std::string text;
    for (size_t i = 0; i < content.size(); ++i) {
      const json& part = content[i];
      const std::string at = where + "[" + std::to_string(i) + "]";
      if (!part.is_object()) fail("'" + at + "' must be an object with a 'type'", "messages");
      const std::string type = get_string(part, "type");
      if (type != "text")
        fail("'" + at + "': content parts of type '" + type + "' are not supported (only 'text')", "messages");
      const json* t = field(part, "text");
      if (!t || !t->is_string()) fail("'" + at + ".text' must be a string", "messages");
      text += t->get<std::string>();
    }
    return text;
  }
  fail("'" + where + "' must be a string or an array of content parts, not " + std::string(type_name(content)),
       "messages");
}

// ---- structured outputs ----

// A JSON schema as text with its keys in the client's order (the order of
// "properties" is the order the fields are generated in; nlohmann's json sorts
// keys, so the schema is read again from the body as an ordered_json).
// `path` leads from the body to the schema; a schema given as a string (as
// vLLM allows) is parsed first.
std::string schema_text(std::string_view body_text, std::initializer_list<const char*> path, const std::string& param) {
  nlohmann::ordered_json v = nlohmann::ordered_json::parse(body_text.begin(), body_text.end());
  for (const char* key : path) v = nlohmann::ordered_json(v.at(key));
  if (v.is_string()) {
    const std::string inner = v.get<std::string>();
    try {
      v = nlohmann::ordered_json::parse(inner);
    } catch (const nlohmann::ordered_json::exception& e) {
      fail("'" + param + "' is a string that is not valid JSON: " + e.what(), param);
    }
  }
  if (!v.is_object() && !v.is_boolean())
    fail("'" + param + "' must be a JSON schema (an object)", param);
  return v.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

std::string grammar_string(const json& v, const std::string& param) {
  if (!v.is_string()) fail("'" + param + "' must be a string, not " + std::string(type_name(v)), param);
  std::string text = v.get<std::string>();
  if (text.empty()) fail("'" + param + "' must not be empty", param);
  return text;
}

// vLLM's grammar fields take Lark; a grammar written in GBNF (with "::=")
// is read as GBNF, as vLLM's guidance backend does.
GrammarKind lark_or_gbnf(const std::string& text) {
  return text.find("::=") != std::string::npos ? GrammarKind::kGbnf : GrammarKind::kLark;
}

StructuredOutputRequest choice_constraint(const json& v, const std::string& param) {
  if (!v.is_array() || v.empty()) fail("'" + param + "' must be a non-empty array of strings", param);
  std::vector<std::string> choices;
  for (const json& c : v) {
    if (!c.is_string()) fail("'" + param + "' must be a non-empty array of strings", param);
    choices.push_back(c.get<std::string>());
  }
  auto lark = choices_to_lark(choices);
  if (!lark) fail("'" + param + "': " + lark.error().message, param);
  return {GrammarKind::kLark, std::move(*lark), param};
}

void parse_structured(const json& body, std::string_view text, GenerationRequest& r) {
  std::vector<StructuredOutputRequest> found;
  bool no_whitespace = false;  // structured_outputs.disable_any_whitespace
  if (const json* rf = field(body, "response_format")) {
    if (!rf->is_object()) fail("'response_format' must be an object", "response_format");
    const std::string type = get_string(*rf, "type");
    if (type == "json_object") {
      found.push_back({GrammarKind::kJsonObject, "", "response_format"});
    } else if (type == "json_schema") {
      const json* js = field(*rf, "json_schema");
      if (!js || !js->is_object())
        fail("'response_format.json_schema' must be an object with a 'schema'", "response_format");
      if (const json* strict = field(*js, "strict"); strict && !strict->is_boolean())
        fail("'response_format.json_schema.strict' must be a boolean", "response_format");
      if (const json* name = field(*js, "name"); name && !name->is_string())
        fail("'response_format.json_schema.name' must be a string", "response_format");
      // Without a schema (OpenAI makes it optional), any JSON object.
      if (!field(*js, "schema"))
        found.push_back({GrammarKind::kJsonObject, "", "response_format"});
      else
        found.push_back({GrammarKind::kJsonSchema,
                         schema_text(text, {"response_format", "json_schema", "schema"}, "response_format.json_schema.schema"),
                         "response_format"});
    } else if (type != "text") {
      fail("'response_format.type' is '" + type + "'; it must be 'text', 'json_object' or 'json_schema'",
           "response_format");
    }
  }
  if (const json* so = field(body, "structured_outputs")) {
    if (!so->is_object()) fail("'structured_outputs' must be an object", "structured_outputs");
    for (const auto& [key, v] : so->items()) {
      if (v.is_null()) continue;
      const std::string param = "structured_outputs." + key;
      if (key == "json") {
        found.push_back({GrammarKind::kJsonSchema, schema_text(text, {"structured_outputs", "json"}, param), param});
      } else if (key == "regex") {
        found.push_back({GrammarKind::kRegex, grammar_string(v, param), param});
      } else if (key == "choice") {
        found.push_back(choice_constraint(v, param));
      } else if (key == "grammar") {
        std::string g = grammar_string(v, param);
        const GrammarKind kind = lark_or_gbnf(g);
        found.push_back({kind, std::move(g), param});
      } else if (key == "json_object") {
        if (!v.is_boolean()) fail("'" + param + "' must be a boolean", param);
        if (v.get<bool>()) found.push_back({GrammarKind::kJsonObject, "", param});
      } else if (key == "disable_any_whitespace") {
        if (!v.is_boolean()) fail("'" + param + "' must be a boolean", param);
        no_whitespace = v.get<bool>();
      } else if (key == "backend" || key == "disable_fallback" || key == "disable_additional_properties") {
        // Choices among vLLM's engines; inferd has one (llguidance), and it
        // closes objects without additionalProperties already (structured/json_schema.h).
      } else {
        fail("'" + param + "' is not supported", param);
      }
    }
  }
  if (field(body, "guided_json"))
    found.push_back({GrammarKind::kJsonSchema, schema_text(text, {"guided_json"}, "guided_json"), "guided_json"});
  if (const json* v = field(body, "guided_regex"))
    found.push_back({GrammarKind::kRegex, grammar_string(*v, "guided_regex"), "guided_regex"});
  if (const json* v = field(body, "guided_choice")) found.push_back(choice_constraint(*v, "guided_choice"));
  if (const json* v = field(body, "guided_grammar")) {
    std::string g = grammar_string(*v, "guided_grammar");
    const GrammarKind kind = lark_or_gbnf(g);
    found.push_back({kind, std::move(g), "guided_grammar"});
  }
  if (field(body, "guided_whitespace_pattern"))
    fail("'guided_whitespace_pattern' is not supported", "guided_whitespace_pattern");
  (void)get_string(body, "guided_decoding_backend");  // accepted, unused (one engine)
  // llama-server's fields.
  if (field(body, "json_schema"))
    found.push_back({GrammarKind::kJsonSchema, schema_text(text, {"json_schema"}, "json_schema"), "json_schema"});
  if (const json* v = field(body, "grammar"))
    found.push_back({GrammarKind::kGbnf, grammar_string(*v, "grammar"), "grammar"});

  if (found.size() > 1)
    fail("only one structured output constraint is allowed per request; got '" + found[0].param + "' and '" +
             found[1].param + "'",
         found[1].param);
  if (found.empty()) return;
  r.structured = std::move(found[0]);
  StructuredOutputRequest& so = *r.structured;
  if (no_whitespace && (so.kind == GrammarKind::kJsonSchema || so.kind == GrammarKind::kJsonObject)) {
    // JSON with no whitespace between tokens, through llguidance's own option.
    nlohmann::ordered_json schema = so.kind == GrammarKind::kJsonObject
                                        ? nlohmann::ordered_json{{"type", "object"}}
                                        : nlohmann::ordered_json::parse(so.text);
    if (schema.is_boolean()) schema = nlohmann::ordered_json::object();
    if (schema.is_object() && !schema.contains("x-guidance")) {
      schema["x-guidance"] = {{"whitespace_flexible", false}};
      so.kind = GrammarKind::kJsonSchema;
      so.text = schema.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    }
  }
}

// ---- tools ----

using ordered = nlohmann::ordered_json;

std::string dump_ordered(const ordered& v) { return v.dump(-1, ' ', false, ordered::error_handler_t::replace); }

// OpenAI's rule for function names: letters, digits, '_' and '-', at most 64.
bool valid_function_name(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) return false;
  return true;
}

// `tools`, `tool_choice` and `parallel_tool_calls`. `ordered_body` is the body
// read again with its key order (schemas and the template's `tools` keep it).
void parse_tools(const json& body, const ordered& ordered_body, GenerationRequest& r) {
  const json* tools = field(body, "tools");
  const json* choice = field(body, "tool_choice");
  const bool parallel = get_bool(body, "parallel_tool_calls", true);
  if (tools && !tools->is_array()) fail("'tools' must be an array, not " + std::string(type_name(*tools)), "tools");
  if (!tools || tools->empty()) {
    // Without tools only "none" (or "auto", which then means none) makes sense.
    if (choice && !(choice->is_string() && (*choice == "none" || *choice == "auto")))
      fail("'tool_choice' needs 'tools'", "tool_choice");
    return;
  }
  ToolsRequest t;
  t.parallel = parallel;
  const ordered& otools = ordered_body.at("tools");
  for (size_t i = 0; i < tools->size(); ++i) {
    const json& tool = (*tools)[i];
    const std::string at = "tools[" + std::to_string(i) + "]";
    if (!tool.is_object()) fail("'" + at + "' must be an object", "tools");
    const json* type = field(tool, "type");
    if (!type || !type->is_string() || *type != "function")
      fail("'" + at + ".type' must be 'function'", "tools");
    const json* fn = field(tool, "function");
    if (!fn || !fn->is_object()) fail("'" + at + ".function' must be an object", "tools");
    const json* name = field(*fn, "name");
    if (!name || !name->is_string()) fail("'" + at + ".function.name' is required and must be a string", "tools");
    ToolSpec spec;
    spec.name = name->get<std::string>();
    if (!valid_function_name(spec.name))
      fail("'" + at + ".function.name' must be 1 to 64 letters, digits, '_' or '-'", "tools");
    for (const ToolSpec& other : t.tools)
      if (other.name == spec.name) fail("'tools' has two functions named '" + spec.name + "'", "tools");
    if (const json* d = field(*fn, "description"); d && !d->is_string())
      fail("'" + at + ".function.description' must be a string", "tools");
    if (const json* strict = field(*fn, "strict"); strict && !strict->is_boolean())
      fail("'" + at + ".function.strict' must be a boolean", "tools");
    if (const json* params = field(*fn, "parameters")) {
      if (!params->is_object()) fail("'" + at + ".function.parameters' must be a JSON schema (an object)", "tools");
      spec.parameters = dump_ordered(otools.at(i).at("function").at("parameters"));
    } else {
      spec.parameters = R"({"type":"object","properties":{}})";
    }
    t.tools.push_back(std::move(spec));
  }
  t.tools_json = dump_ordered(otools);

  if (!choice || (choice->is_string() && *choice == "auto")) {
    t.choice = ToolChoice::kAuto;
  } else if (choice->is_string() && *choice == "none") {
    t.choice = ToolChoice::kNone;
  } else if (choice->is_string() && *choice == "required") {
    t.choice = ToolChoice::kRequired;
  } else if (choice->is_object()) {
    const json* type = field(*choice, "type");
    const json* fn = field(*choice, "function");
    const json* name = fn && fn->is_object() ? field(*fn, "name") : nullptr;
    if (!type || *type != "function" || !name || !name->is_string())
      fail("'tool_choice' as an object must be {\"type\": \"function\", \"function\": {\"name\": ...}}",
           "tool_choice");
    t.choice = ToolChoice::kNamed;
    t.named = name->get<std::string>();
    bool known = false;
    for (const ToolSpec& spec : t.tools) known = known || spec.name == t.named;
    if (!known) fail("'tool_choice' names the function '" + t.named + "', which is not in 'tools'", "tool_choice");
  } else {
    fail("'tool_choice' must be 'none', 'auto', 'required' or {\"type\": \"function\", \"function\": "
         "{\"name\": ...}}",
         "tool_choice");
  }
  if ((t.choice == ToolChoice::kRequired || t.choice == ToolChoice::kNamed) && r.structured)
    fail("'tool_choice' " + std::string(t.choice == ToolChoice::kRequired ? "'required'" : "naming a function") +
             " cannot be combined with '" + r.structured->param + "'",
         "tool_choice");
  r.tools = std::move(t);
}

// An assistant message's tool_calls, as the template gets them: each
// function's `arguments` string turned into the object it holds (templates
// write `arguments | tojson`); a string that is not a JSON object stays a string.
std::string tool_calls_for_template(const json& calls, const ordered& ocalls, const std::string& at) {
  if (!calls.is_array()) fail("'" + at + ".tool_calls' must be an array", "messages");
  ordered out = ordered::array();
  for (size_t k = 0; k < calls.size(); ++k) {
    const json& call = calls[k];
    const std::string where = at + ".tool_calls[" + std::to_string(k) + "]";
    if (!call.is_object()) fail("'" + where + "' must be an object", "messages");
    if (const json* type = field(call, "type"); type && *type != "function")
      fail("'" + where + ".type' must be 'function'", "messages");
    if (const json* id = field(call, "id"); id && !id->is_string())
      fail("'" + where + ".id' must be a string", "messages");
    const json* fn = field(call, "function");
    if (!fn || !fn->is_object()) fail("'" + where + ".function' must be an object", "messages");
    const json* name = field(*fn, "name");
    if (!name || !name->is_string()) fail("'" + where + ".function.name' must be a string", "messages");
    const json* args = field(*fn, "arguments");
    if (args && !args->is_string() && !args->is_object())
      fail("'" + where + ".function.arguments' must be a string (JSON)", "messages");
    ordered c = ocalls.at(k);
    if (!c.contains("type")) c["type"] = "function";
    ordered& f = c["function"];
    if (!args) {
      f["arguments"] = ordered::object();
    } else if (args->is_string()) {
      ordered parsed = ordered::parse(args->get<std::string>(), nullptr, /*allow_exceptions=*/false);
      if (!parsed.is_discarded() && parsed.is_object()) f["arguments"] = std::move(parsed);
    }
    out.push_back(std::move(c));
  }
  return dump_ordered(out);
}

}  // namespace

std::string error_json(const ApiError& e) {
  json err = {{"message", e.message},
              {"type", e.type},
              {"param", e.param.empty() ? json(nullptr) : json(e.param)},
              {"code", e.code.empty() ? json(nullptr) : json(e.code)}};
  return json{{"error", err}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

ApiError bad_request(std::string message, std::string param) {
  return ApiError{400, std::move(message), "invalid_request_error", std::move(param), {}};
}

ApiError not_found(std::string message, std::string code) {
  return ApiError{404, std::move(message), "invalid_request_error", {}, std::move(code)};
}

ApiError context_length_error(int64_t max_model_len, int64_t prompt_tokens, std::optional<int64_t> max_tokens) {
  const std::string n = std::to_string(max_model_len);
  if (!max_tokens)
    return bad_request("This model's maximum context length is " + n + " tokens. However, your request has " +
                           std::to_string(prompt_tokens) +
                           " input tokens. Please reduce the length of the input messages.",
                       "messages");
  return bad_request("This model's maximum context length is " + n + " tokens. However, you requested " +
                         std::to_string(prompt_tokens + *max_tokens) + " tokens (" + std::to_string(prompt_tokens) +
                         " in the messages, " + std::to_string(*max_tokens) +
                         " in the completion). Please reduce the length of the messages or completion.",
                     "max_tokens");
}

ApiError context_length_error_by_bytes(int64_t max_model_len, int64_t min_prompt_tokens, size_t prompt_bytes,
                                       std::optional<int64_t> max_tokens) {
  const std::string n = std::to_string(max_model_len);
  const std::string at_least = "at least " + std::to_string(min_prompt_tokens);
  const std::string bytes = " (the prompt is " + std::to_string(prompt_bytes) + " bytes long)";
  if (!max_tokens || min_prompt_tokens >= max_model_len)
    return bad_request("This model's maximum context length is " + n + " tokens. However, your request has " +
                           at_least + " input tokens" + bytes + ". Please reduce the length of the input messages.",
                       "messages");
  return bad_request("This model's maximum context length is " + n + " tokens. However, you requested at least " +
                         std::to_string(min_prompt_tokens + *max_tokens) + " tokens (" + at_least +
                         " in the messages" + bytes + ", " + std::to_string(*max_tokens) +
                         " in the completion). Please reduce the length of the messages or completion.",
                     "max_tokens");
}

ParseResult parse_completion_request(std::string_view text, const ProtocolLimits& limits) {
  try {
    const json body = parse_body(text);
    GenerationRequest r;
    parse_common(body, r, limits);
    parse_max_tokens(body, "max_tokens", r, 0);
    parse_structured(body, text, r);

    const json* prompt = field(body, "prompt");
    if (!prompt) fail("'prompt' is required", "prompt");
    auto add_text = [&](const json& p) { r.prompts.push_back(PromptInput{p.get<std::string>(), {}, false}); };
    if (prompt->is_string()) {
      add_text(*prompt);
    } else if (prompt->is_array() && !prompt->empty()) {
      const json& first = (*prompt)[0];
      if (first.is_number()) {  // one prompt of token ids
        r.prompts.push_back(PromptInput{{}, token_ids(*prompt, "prompt"), true});
      } else {
        for (size_t i = 0; i < prompt->size(); ++i) {
          const json& p = (*prompt)[i];
          if (p.is_string()) add_text(p);
          else if (p.is_array()) r.prompts.push_back(PromptInput{{}, token_ids(p, "prompt"), true});
          else fail("'prompt[" + std::to_string(i) + "]' must be a string or an array of token ids", "prompt");
        }
      }
    } else {
      fail("'prompt' must be a string, an array of strings, or an array of token ids", "prompt");
    }
    if (r.prompts.size() > limits.max_prompts)
      fail("at most " + std::to_string(limits.max_prompts) + " prompts are allowed in one request", "prompt");
    for (const PromptInput& p : r.prompts)
      if (p.is_tokens ? p.token_ids.empty() : p.text.empty()) fail("'prompt' must not be empty", "prompt");

    if (const json* lp = field(body, "logprobs")) {
      const int64_t n = as_integer(*lp, "logprobs");
      if (n < 0 || n > limits.max_logprobs)
        fail("'logprobs' must be between 0 and " + std::to_string(limits.max_logprobs) + ", got " + std::to_string(n),
             "logprobs");
      r.logprobs = static_cast<int32_t>(n);
    }
    r.echo = get_bool(body, "echo", false);
    if (r.max_tokens == 0 && !r.echo)
      fail("'max_tokens' must be at least 1, got 0 (0 only with 'echo', to score the prompt)", "max_tokens");
    if (r.echo && r.stream) fail("'echo' is not supported with 'stream'", "echo");
    if (!get_string(body, "suffix").empty()) fail("'suffix' is not supported", "suffix");
    check_beam_search(r);
    return r;
  } catch (const Invalid& e) {
    return e.error;
  }
}

ParseResult parse_chat_request(std::string_view text, const ProtocolLimits& limits) {
  try {
    const json body = parse_body(text);
    GenerationRequest r;
    r.chat = true;
    parse_common(body, r, limits);
    parse_max_tokens(body, "max_tokens", r);
    parse_max_tokens(body, "max_completion_tokens", r);  // the newer name wins
    parse_structured(body, text, r);
    // The body again with its key order, read only when needed (tools, tool calls).
    std::optional<ordered> ordered_cache;
    auto ordered_body = [&]() -> const ordered& {
      if (!ordered_cache) ordered_cache = ordered::parse(text.begin(), text.end());
      return *ordered_cache;
    };

    const json* messages = field(body, "messages");
    if (!messages) fail("'messages' is required", "messages");
    if (!messages->is_array() || messages->empty()) fail("'messages' must be a non-empty array", "messages");
    for (size_t i = 0; i < messages->size(); ++i) {
      const json& m = (*messages)[i];
      const std::string at = "messages[" + std::to_string(i) + "]";
      if (!m.is_object()) fail("'" + at + "' must be an object with 'role' and 'content'", "messages");
      const json* role = field(m, "role");
      if (!role || !role->is_string()) fail("'" + at + ".role' is required and must be a string", "messages");
      const std::string role_name = role->get<std::string>();
      if (role_name != "system" && role_name != "developer" && role_name != "user" && role_name != "assistant" &&
          role_name != "tool")
        fail("'" + at + ".role' is '" + role_name +
                 "'; it must be one of 'system', 'developer', 'user', 'assistant' or 'tool'",
             "messages");
      const json* content = field(m, "content");
      if (!content && role_name != "assistant") fail("'" + at + ".content' is required", "messages");
      ChatMessage message{role_name, content ? message_content(*content, at + ".content") : ""};
      if (const json* calls = field(m, "tool_calls")) {
        if (role_name != "assistant") fail("'" + at + ".tool_calls' is only allowed in assistant messages", "messages");
        if (!calls->is_array()) fail("'" + at + ".tool_calls' must be an array", "messages");
        if (!calls->empty()) message.tool_calls_json = tool_calls_for_template(*calls, ordered_body().at("messages").at(i).at("tool_calls"), at);
      }
      if (const json* id = field(m, "tool_call_id")) {
        if (!id->is_string()) fail("'" + at + ".tool_call_id' must be a string", "messages");
        if (role_name == "tool") message.tool_call_id = id->get<std::string>();
      }
      // An assistant's earlier thinking: `reasoning_content` (llama-server's
      // and vLLM's name) or `reasoning` (vLLM's newer one).
      for (const char* key : {"reasoning_content", "reasoning"}) {
        const json* rc = field(m, key);
        if (!rc || rc->is_null()) continue;
        if (!rc->is_string()) fail("'" + at + "." + key + "' must be a string", "messages");
        if (role_name == "assistant" && message.reasoning_content.empty()) message.reasoning_content = rc->get<std::string>();
      }
      r.messages.push_back(std::move(message));
    }

    if (get_bool(body, "logprobs", false)) {
      r.logprobs = 0;
      if (const auto top = get_int(body, "top_logprobs")) {
        if (*top < 0 || *top > limits.max_logprobs)
          fail("'top_logprobs' must be between 0 and " + std::to_string(limits.max_logprobs) + ", got " +
                   std::to_string(*top),
               "top_logprobs");
        r.logprobs = static_cast<int32_t>(*top);
      }
    } else if (const auto top = get_int(body, "top_logprobs"); top && *top > 0) {
      fail("'top_logprobs' needs 'logprobs' to be true", "top_logprobs");
    }
    if (field(body, "tools") || field(body, "tool_choice")) parse_tools(body, ordered_body(), r);
    else (void)get_bool(body, "parallel_tool_calls", true);
    if (field(body, "reasoning_format")) {
      const std::string name = get_string(body, "reasoning_format");
      r.reasoning_format = reasoning_parser_from_name(name);
      if (!r.reasoning_format)
        fail("'reasoning_format' must be one of none, auto, deepseek, qwen3, deepseek_r1, openai_gptoss",
             "reasoning_format");
    }
    r.add_generation_prompt = get_bool(body, "add_generation_prompt", true);
    json kwargs = nullptr;
    if (const json* kw = field(body, "chat_template_kwargs")) {
      if (!kw->is_object()) fail("'chat_template_kwargs' must be an object", "chat_template_kwargs");
      kwargs = *kw;
    }
    // OpenAI's reasoning_effort, given to the template (gpt-oss's reads it
    // into its system message), as vLLM and llama-server do; a
    // chat_template_kwargs of the same name wins.
    if (const json* effort = field(body, "reasoning_effort"); effort && !effort->is_null()) {
      const std::string e = effort->is_string() ? effort->get<std::string>() : std::string();
      if (e != "low" && e != "medium" && e != "high")
        fail("'reasoning_effort' must be one of 'low', 'medium' or 'high'", "reasoning_effort");
      r.reasoning_effort = e;
      if (kwargs.is_null()) kwargs = json::object();
      if (!kwargs.contains("reasoning_effort")) kwargs["reasoning_effort"] = e;
    }
    if (!kwargs.is_null()) r.chat_template_kwargs = kwargs.dump(-1, ' ', false, json::error_handler_t::replace);
    check_beam_search(r);
    return r;
  } catch (const Invalid& e) {
    return e.error;
  }
}

}  // namespace inferd::server
