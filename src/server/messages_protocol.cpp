#include "server/messages_protocol.h"

#include <cmath>
#include <limits>
#include <random>
#include <set>

namespace inferd::server {

using json = nlohmann::json;
using ordered = nlohmann::ordered_json;  // the body keeps the client's key order (schemas, tool inputs)

namespace {

// Thrown inside the parser, caught at its top: keeps each check one line.
struct Invalid {
  ApiError error;
};

[[noreturn]] void fail(std::string message) { throw Invalid{bad_request(std::move(message))}; }

std::string dump(const ordered& v) { return v.dump(-1, ' ', false, ordered::error_handler_t::replace); }

const char* kind_of(const ordered& v) {
  switch (v.type()) {
    case ordered::value_t::null: return "null";
    case ordered::value_t::boolean: return "a boolean";
    case ordered::value_t::string: return "a string";
    case ordered::value_t::array: return "an array";
    case ordered::value_t::object: return "an object";
    default: return "a number";
  }
}

// A present, non-null field.
const ordered* field(const ordered& obj, const char* name) {
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

std::string string_field(const ordered& obj, const char* name, const std::string& at) {
  const ordered* v = field(obj, name);
  if (!v) return {};
  if (!v->is_string()) fail("'" + at + name + "': expected a string, got " + kind_of(*v));
  return v->get<std::string>();
}

std::optional<double> number_field(const ordered& obj, const char* name) {
  const ordered* v = field(obj, name);
  if (!v) return std::nullopt;
  if (!v->is_number()) fail(std::string("'") + name + "': expected a number, got " + kind_of(*v));
  return v->get<double>();
}

std::optional<int64_t> integer_field(const ordered& obj, const char* name, const std::string& at = {}) {
  const ordered* v = field(obj, name);
  if (!v) return std::nullopt;
  if (v->is_number_integer() && !(v->is_number_unsigned() && v->get<uint64_t>() > uint64_t{1} << 62))
    return v->get<int64_t>();
  fail("'" + at + name + "': expected an integer, got " + (v->is_number() ? v->dump() : kind_of(*v)));
}

bool bool_field(const ordered& obj, const char* name, const std::string& at, bool fallback) {
  const ordered* v = field(obj, name);
  if (!v) return fallback;
  if (!v->is_boolean()) fail("'" + at + name + "': expected a boolean, got " + kind_of(*v));
  return v->get<bool>();
}

std::string block_type(const ordered& block, const std::string& at) {
  if (!block.is_object()) fail("'" + at + "': expected a content block (an object with a 'type')");
  const ordered* type = field(block, "type");
  if (!type || !type->is_string()) fail("'" + at + ".type' is required and must be a string");
  return type->get<std::string>();
}

[[noreturn]] void unsupported_block(const std::string& type, const std::string& at) {
  if (type == "image" || type == "document")
    fail("'" + at + "': " + type + " content blocks are not supported: this server's models read text only");
  fail("'" + at + "': content blocks of type '" + type + "' are not supported here");
}

std::string text_of_block(const ordered& block, const std::string& at) {
  const ordered* t = field(block, "text");
  if (!t || !t->is_string()) fail("'" + at + ".text' is required and must be a string");
  return t->get<std::string>();
}

// `system`: a string or text blocks.
std::string system_text(const ordered& system) {
  if (system.is_string()) return system.get<std::string>();
  if (!system.is_array()) fail("'system': expected a string or an array of text blocks, got " + std::string(kind_of(system)));
  std::string text;
  for (size_t i = 0; i < system.size(); ++i) {
    const std::string at = "system[" + std::to_string(i) + "]";
    const std::string type = block_type(system[i], at);
    if (type != "text") fail("'" + at + "': system blocks must be of type 'text', not '" + type + "'");
    if (!text.empty()) text += "\n\n";
    text += text_of_block(system[i], at);
  }
  return text;
}

// A tool_result's content: a string, or text blocks.
std::string tool_result_text(const ordered& block, const std::string& at) {
  const ordered* content = field(block, "content");
  if (!content) return {};
  if (content->is_string()) return content->get<std::string>();
  if (!content->is_array()) fail("'" + at + ".content': expected a string or an array of content blocks");
  std::string text;
  for (size_t i = 0; i < content->size(); ++i) {
    const std::string inner = at + ".content[" + std::to_string(i) + "]";
    const std::string type = block_type((*content)[i], inner);
    if (type != "text") unsupported_block(type, inner);
    if (!text.empty()) text += "\n";
    text += text_of_block((*content)[i], inner);
  }
  return text;
}

// One message of `messages`, appended to `out` as chat messages. `open_calls`
// holds the tool_use ids of the previous assistant message (a tool_result
// must answer one of them); an assistant message replaces them with its own.
void add_message(const ordered& m, size_t i, std::vector<ChatMessage>& out, std::set<std::string>& open_calls) {
  const std::string at = "messages[" + std::to_string(i) + "]";
  if (!m.is_object()) fail("'" + at + "': expected an object with 'role' and 'content'");
  const std::string role = string_field(m, "role", at + ".");
  if (role != "user" && role != "assistant")
    fail("'" + at + ".role' must be 'user' or 'assistant'" +
         (role == "system" ? std::string(" (the system prompt goes in the top-level 'system')") : std::string()));
  const ordered* content = field(m, "content");
  if (!content) fail("'" + at + ".content' is required");
  if (content->is_string()) {
    out.push_back(ChatMessage{role, content->get<std::string>()});
    if (role == "assistant") open_calls.clear();
    return;
  }
  if (!content->is_array()) fail("'" + at + ".content': expected a string or an array of content blocks");

  if (role == "assistant") {
    ChatMessage msg{role, ""};
    ordered calls = ordered::array();
    std::set<std::string> ids;
    for (size_t k = 0; k < content->size(); ++k) {
      const ordered& block = (*content)[k];
      const std::string bat = at + ".content[" + std::to_string(k) + "]";
      const std::string type = block_type(block, bat);
      if (type == "text") {
        msg.content += text_of_block(block, bat);
      } else if (type == "thinking") {
        msg.reasoning_content += string_field(block, "thinking", bat + ".");
      } else if (type == "redacted_thinking") {
        // Encrypted thinking of Anthropic's models: nothing a local model can read.
      } else if (type == "tool_use") {
        const std::string id = string_field(block, "id", bat + ".");
        const std::string name = string_field(block, "name", bat + ".");
        if (id.empty() || name.empty()) fail("'" + bat + "': a tool_use block needs an 'id' and a 'name'");
        const ordered* input = field(block, "input");
        if (input && !input->is_object()) fail("'" + bat + ".input': expected an object, got " + std::string(kind_of(*input)));
        ordered fn = {{"name", name}, {"arguments", input ? *input : ordered::object()}};
        calls.push_back(ordered{{"id", id}, {"type", "function"}, {"function", std::move(fn)}});
        ids.insert(id);
      } else {
        unsupported_block(type, bat);
      }
    }
    if (!calls.empty()) msg.tool_calls_json = dump(calls);
    out.push_back(std::move(msg));
    open_calls = std::move(ids);
    return;
  }

  // A user message: text joined into user turns, each tool_result a tool
  // message in its place.
  std::string text;
  bool has_text = false;
  for (size_t k = 0; k < content->size(); ++k) {
    const ordered& block = (*content)[k];
    const std::string bat = at + ".content[" + std::to_string(k) + "]";
    const std::string type = block_type(block, bat);
    if (type == "text") {
      text += text_of_block(block, bat);
      has_text = true;
    } else if (type == "tool_result") {
      const std::string id = string_field(block, "tool_use_id", bat + ".");
      if (id.empty()) fail("'" + bat + ".tool_use_id' is required");
      if (!open_calls.count(id))
        fail("'" + bat + "': tool_result block with tool_use_id '" + id +
             "' has no matching tool_use block in the previous assistant message");
      (void)bool_field(block, "is_error", bat + ".", false);
      if (has_text) {
        out.push_back(ChatMessage{"user", std::move(text)});
        text.clear();
        has_text = false;
      }
      ChatMessage result{"tool", tool_result_text(block, bat)};
      result.tool_call_id = id;
      out.push_back(std::move(result));
    } else {
      unsupported_block(type, bat);
    }
  }
  if (has_text) out.push_back(ChatMessage{"user", std::move(text)});
}

// Anthropic's rule for tool names.
bool valid_tool_name(const std::string& name) {
  if (name.empty() || name.size() > 128) return false;
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) return false;
  return true;
}

void parse_tools(const ordered& body, GenerationRequest& r) {
  const ordered* tools = field(body, "tools");
  const ordered* choice = field(body, "tool_choice");
  std::string choice_type = "auto";
  if (choice) {
    if (!choice->is_object()) fail("'tool_choice': expected an object with a 'type'");
    choice_type = string_field(*choice, "type", "tool_choice.");
    if (choice_type != "auto" && choice_type != "any" && choice_type != "tool" && choice_type != "none")
      fail("'tool_choice.type' must be 'auto', 'any', 'tool' or 'none'");
  }
  if (tools && !tools->is_array()) fail("'tools': expected an array, got " + std::string(kind_of(*tools)));
  if (!tools || tools->empty()) {
    if (choice_type == "any" || choice_type == "tool") fail("'tool_choice' of type '" + choice_type + "' needs 'tools'");
    return;
  }
  ToolsRequest t;
  ordered functions = ordered::array();  // the tools as chat templates read them (OpenAI's shape)
  for (size_t i = 0; i < tools->size(); ++i) {
    const ordered& tool = (*tools)[i];
    const std::string at = "tools[" + std::to_string(i) + "]";
    if (!tool.is_object()) fail("'" + at + "': expected an object");
    const std::string type = string_field(tool, "type", at + ".");
    if (!type.empty() && type != "custom")
      fail("'" + at + "': tools of type '" + type + "' (Anthropic's server tools) are not supported; give custom "
           "tools with 'name', 'description' and 'input_schema'");
    ToolSpec spec;
    spec.name = string_field(tool, "name", at + ".");
    if (!valid_tool_name(spec.name)) fail("'" + at + ".name' must be 1 to 128 letters, digits, '_' or '-'");
    for (const ToolSpec& other : t.tools)
      if (other.name == spec.name) fail("'tools' has two tools named '" + spec.name + "'");
    const std::string description = string_field(tool, "description", at + ".");
    const ordered* schema = field(tool, "input_schema");
    if (!schema || !schema->is_object()) fail("'" + at + ".input_schema' is required and must be a JSON schema (an object)");
    spec.parameters = dump(*schema);
    ordered fn = {{"name", spec.name}};
    if (!description.empty()) fn["description"] = description;
    fn["parameters"] = *schema;
    functions.push_back(ordered{{"type", "function"}, {"function", std::move(fn)}});
    t.tools.push_back(std::move(spec));
  }
  t.tools_json = dump(functions);
  if (choice) t.parallel = !bool_field(*choice, "disable_parallel_tool_use", "tool_choice.", false);
  if (choice_type == "auto") t.choice = ToolChoice::kAuto;
  else if (choice_type == "none") t.choice = ToolChoice::kNone;
  else if (choice_type == "any") t.choice = ToolChoice::kRequired;
  else {
    t.choice = ToolChoice::kNamed;
    t.named = string_field(*choice, "name", "tool_choice.");
    bool known = false;
    for (const ToolSpec& spec : t.tools) known = known || spec.name == t.named;
    if (!known) fail("'tool_choice' names the tool '" + t.named + "', which is not in 'tools'");
  }
  r.tools = std::move(t);
}

// `thinking`: whether the model may think (and its thinking is returned).
bool parse_thinking(const ordered& body, const std::optional<int64_t>& max_tokens) {
  const ordered* thinking = field(body, "thinking");
  if (!thinking) return false;
  if (!thinking->is_object()) fail("'thinking': expected an object with a 'type'");
  const std::string type = string_field(*thinking, "type", "thinking.");
  if (type == "disabled") return false;
  if (type == "adaptive") return true;
  if (type != "enabled") fail("'thinking.type' must be 'enabled', 'disabled' or 'adaptive'");
  const std::optional<int64_t> budget = integer_field(*thinking, "budget_tokens", "thinking.");
  if (!budget) fail("'thinking.budget_tokens' is required when thinking is enabled");
  if (*budget < 1024) fail("'thinking.budget_tokens' must be at least 1024, got " + std::to_string(*budget));
  if (max_tokens && *budget >= *max_tokens)
    fail("'max_tokens' must be greater than 'thinking.budget_tokens' (" + std::to_string(*budget) + ")");
  return true;
}

void parse_sampling(const ordered& body, GenerationRequest& r, const ProtocolLimits& limits) {
  SamplingParams& s = r.sampling;
  if (const auto t = number_field(body, "temperature")) {
    if (*t < 0 || *t > 1) fail("'temperature' must be between 0 and 1, got " + json(*t).dump());
    s.temperature = static_cast<float>(*t);
  }
  if (const auto p = number_field(body, "top_p")) {
    if (*p <= 0 || *p > 1) fail("'top_p' must be in (0, 1], got " + json(*p).dump());
    s.top_p = static_cast<float>(*p);
  }
  if (const auto k = integer_field(body, "top_k")) {
    if (*k < 0 || *k > std::numeric_limits<int32_t>::max()) fail("'top_k' must be at least 0, got " + std::to_string(*k));
    s.top_k = *k == 0 ? -1 : static_cast<int32_t>(*k);
  }
  if (const ordered* stops = field(body, "stop_sequences")) {
    if (!stops->is_array()) fail("'stop_sequences': expected an array of strings");
    for (const ordered& s_item : *stops) {
      if (!s_item.is_string() || s_item.get<std::string>().empty())
        fail("'stop_sequences' must hold non-empty strings");
      r.stop.push_back(s_item.get<std::string>());
    }
    if (r.stop.size() > limits.max_stop)
      fail("'stop_sequences' has " + std::to_string(r.stop.size()) + " strings; at most " +
           std::to_string(limits.max_stop) + " are allowed");
  }
}

}  // namespace

std::variant<MessagesRequest, ApiError> parse_messages_request(std::string_view text, const ProtocolLimits& limits,
                                                               bool count_tokens) {
  try {
    ordered body;
    try {
      body = ordered::parse(text.begin(), text.end());
    } catch (const ordered::parse_error& e) {
      fail(std::string("the request body is not valid JSON: ") + e.what());
    } catch (const ordered::out_of_range&) {
      fail("the request body holds a number outside the range of a double");
    }
    if (!body.is_object()) fail("the request body must be a JSON object");
    MessagesRequest m;
    GenerationRequest& r = m.req;
    r.chat = true;
    r.model = string_field(body, "model", "");
    if (r.model.empty()) fail("'model' is required");
    if (!count_tokens) {
      r.max_tokens = integer_field(body, "max_tokens");
      if (!r.max_tokens) fail("'max_tokens' is required");
      if (*r.max_tokens < 1) fail("'max_tokens' must be at least 1, got " + std::to_string(*r.max_tokens));
      r.stream = bool_field(body, "stream", "", false);
      parse_sampling(body, r, limits);
      if (const ordered* meta = field(body, "metadata"); meta && !meta->is_object())
        fail("'metadata': expected an object");  // otherwise ignored
    }

    if (const ordered* system = field(body, "system")) {
      std::string s = system_text(*system);
      if (!s.empty()) r.messages.push_back(ChatMessage{"system", std::move(s)});
    }
    const ordered* messages = field(body, "messages");
    if (!messages) fail("'messages' is required");
    if (!messages->is_array() || messages->empty()) fail("'messages' must be a non-empty array");
    std::set<std::string> open_calls;
    for (size_t i = 0; i < messages->size(); ++i) add_message((*messages)[i], i, r.messages, open_calls);
    if (!count_tokens && r.messages.back().role == "assistant")
      fail("the last message is the assistant's: continuing a prefilled assistant turn is not supported; end "
           "'messages' with a user message");

    parse_tools(body, r);
    m.thinking = parse_thinking(body, r.max_tokens);
    // The template is told whether to think (Qwen3's templates read enable_thinking).
    r.chat_template_kwargs = json{{"enable_thinking", m.thinking}}.dump();
    return m;
  } catch (const Invalid& e) {
    return e.error;
  }
}

const char* anthropic_error_type(int status) {
  switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 405: return "invalid_request_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503:
    case 529: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

json anthropic_error(const ApiError& e) {
  return json{{"type", "error"}, {"error", {{"type", anthropic_error_type(e.status)}, {"message", e.message}}}};
}

std::string anthropic_error_json(const ApiError& e) {
  return anthropic_error(e).dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string new_tool_use_id() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static constexpr char kChars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::string id = "toolu_";
  for (int i = 0; i < 24; ++i) id += kChars[rng() % (sizeof(kChars) - 1)];
  return id;
}

json messages_stop_reason(const std::string& finish_reason, const std::string& stop_string, bool called_tool) {
  if (finish_reason == "abort") return nullptr;
  if (called_tool) return "tool_use";
  if (!stop_string.empty()) return "stop_sequence";
  if (finish_reason == "length") return "max_tokens";
  return "end_turn";
}

namespace {

json tool_use_block(const std::string& name, const json& input) {
  return json{{"type", "tool_use"}, {"id", new_tool_use_id()}, {"name", name}, {"input", input}};
}

// A call's arguments as the object they hold (the parsers give a JSON object's text).
json arguments_object(const std::string& arguments) {
  json input = json::parse(arguments, nullptr, /*allow_exceptions=*/false);
  return input.is_object() ? input : json::object();
}

json stop_sequence_of(const std::string& finish_reason, const std::string& stop_string, bool called_tool) {
  return messages_stop_reason(finish_reason, stop_string, called_tool) == "stop_sequence" ? json(stop_string)
                                                                                           : json(nullptr);
}

}  // namespace

json message_json(const std::string& id, const std::string& model, const MessageResult& r) {
  json content = json::array();
  if (!r.thinking.empty()) content.push_back({{"type", "thinking"}, {"thinking", r.thinking}, {"signature", ""}});
  if (!r.text.empty()) content.push_back({{"type", "text"}, {"text", r.text}});
  for (const MessageResult::ToolUse& call : r.tool_uses)
    content.push_back(tool_use_block(call.name, arguments_object(call.arguments)));
  const bool called = !r.tool_uses.empty();
  return json{{"id", id},
              {"type", "message"},
              {"role", "assistant"},
              {"model", model},
              {"content", std::move(content)},
              {"stop_reason", messages_stop_reason(r.finish_reason, r.stop_string, called)},
              {"stop_sequence", stop_sequence_of(r.finish_reason, r.stop_string, called)},
              {"usage", {{"input_tokens", r.input_tokens}, {"output_tokens", r.output_tokens}}}};
}

std::string sse_event(const json& data) {
  return "event: " + data.at("type").get<std::string>() + "\ndata: " +
         data.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

std::string MessagesEventWriter::start() {
  json message = {{"id", id_},
                  {"type", "message"},
                  {"role", "assistant"},
                  {"model", model_},
                  {"content", json::array()},
                  {"stop_reason", nullptr},
                  {"stop_sequence", nullptr},
                  {"usage", {{"input_tokens", input_tokens_}, {"output_tokens", 0}}}};
  return sse_event({{"type", "message_start"}, {"message", std::move(message)}}) + sse_event({{"type", "ping"}});
}

std::string MessagesEventWriter::close() {
  if (open_ == Block::kNone) return {};
  open_ = Block::kNone;
  return sse_event({{"type", "content_block_stop"}, {"index", index_}});
}

std::string MessagesEventWriter::open(Block kind) {
  if (open_ == kind) return {};
  std::string events = close();
  open_ = kind;
  ++index_;
  json block = kind == Block::kThinking ? json{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}
                                        : json{{"type", "text"}, {"text", ""}};
  return events + sse_event({{"type", "content_block_start"}, {"index", index_}, {"content_block", std::move(block)}});
}

std::string MessagesEventWriter::thinking(const std::string& text) {
  if (text.empty()) return {};
  std::string events = open(Block::kThinking);
  return events + sse_event({{"type", "content_block_delta"},
                             {"index", index_},
                             {"delta", {{"type", "thinking_delta"}, {"thinking", text}}}});
}

std::string MessagesEventWriter::text(const std::string& text) {
  if (text.empty()) return {};
  std::string events = open(Block::kText);
  return events + sse_event({{"type", "content_block_delta"},
                             {"index", index_},
                             {"delta", {{"type", "text_delta"}, {"text", text}}}});
}

std::string MessagesEventWriter::tool_use(const std::string& name, const std::string& arguments) {
  std::string events = close();
  ++index_;
  called_tool_ = true;
  events += sse_event({{"type", "content_block_start"},
                       {"index", index_},
                       {"content_block", tool_use_block(name, json::object())}});
  // The arguments re-serialised from the object, so the client's parse of
  // the joined partial_json gives exactly the block's input.
  events += sse_event({{"type", "content_block_delta"},
                       {"index", index_},
                       {"delta", {{"type", "input_json_delta"}, {"partial_json", arguments_object(arguments).dump()}}}});
  return events + sse_event({{"type", "content_block_stop"}, {"index", index_}});
}

std::string MessagesEventWriter::finish(const std::string& finish_reason, const std::string& stop_string,
                                        int64_t output_tokens) {
  std::string events = close();
  json delta = {{"stop_reason", messages_stop_reason(finish_reason, stop_string, called_tool_)},
                {"stop_sequence", stop_sequence_of(finish_reason, stop_string, called_tool_)}};
  events += sse_event({{"type", "message_delta"},
                       {"delta", std::move(delta)},
                       {"usage", {{"input_tokens", input_tokens_}, {"output_tokens", output_tokens}}}});
  return events + sse_event({{"type", "message_stop"}});
}

std::string MessagesEventWriter::error(const ApiError& e) const { return sse_event(anthropic_error(e)); }

}  // namespace inferd::server
