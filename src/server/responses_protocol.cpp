#include "server/responses_protocol.h"

#include <random>
#include <set>

namespace inferd::server {

using json = nlohmann::json;

namespace {

using parsing::fail;
using parsing::Invalid;

const ordered_json* member(const ordered_json& o, const char* key) {
  auto it = o.find(key);
  return it == o.end() || it->is_null() ? nullptr : &*it;
}

std::string string_member(const ordered_json& o, const char* key, const std::string& at, const std::string& param,
                          bool required) {
  const ordered_json* v = member(o, key);
  if (!v) {
    if (required) fail("'" + at + "." + key + "' is required", param);
    return {};
  }
  if (!v->is_string()) fail("'" + at + "." + key + "' must be a string", param);
  return v->get<std::string>();
}

// A message's content: a string, or a list of text parts (input_text,
// output_text; "text" as Chat Completions writes it). Images and files are
// refused: the served models read text only.
std::string message_text(const ordered_json& content, const std::string& at) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) fail("'" + at + ".content' must be a string or an array of content parts", "input");
  std::string text;
  for (size_t k = 0; k < content.size(); ++k) {
    const ordered_json& part = content[k];
    const std::string where = at + ".content[" + std::to_string(k) + "]";
    if (!part.is_object()) fail("'" + where + "' must be an object", "input");
    const std::string type = string_member(part, "type", where, "input", true);
    if (type == "input_text" || type == "output_text" || type == "text" || type == "summary_text" ||
        type == "reasoning_text") {
      text += string_member(part, "text", where, "input", true);
    } else if (type == "input_image" || type == "input_file" || type == "input_audio") {
      fail("'" + where + "' is of type '" + type + "': this model reads text only", "input");
    } else if (type == "refusal") {
      text += string_member(part, "refusal", where, "input", true);
    } else {
      fail("'" + where + ".type' is '" + type + "', which is not a known content part type", "input");
    }
  }
  return text;
}

// The items of `input`, each checked for the fields its type needs.
std::vector<ordered_json> input_items(const ordered_json& input) {
  std::vector<ordered_json> items;
  if (input.is_string()) {
    ordered_json m = ordered_json::object();
    m["type"] = "message";
    m["role"] = "user";
    m["content"] = input;
    items.push_back(std::move(m));
    return items;
  }
  if (!input.is_array()) fail("'input' must be a string or an array of input items", "input");
  if (input.empty()) fail("'input' must not be an empty array", "input");
  for (size_t i = 0; i < input.size(); ++i) {
    const ordered_json& item = input[i];
    const std::string at = "input[" + std::to_string(i) + "]";
    if (!item.is_object()) fail("'" + at + "' must be an object", "input");
    // A message may leave out its type (EasyInputMessage).
    const std::string type = member(item, "type") ? string_member(item, "type", at, "input", true) : "message";
    if (type == "message") {
      const std::string role = string_member(item, "role", at, "input", true);
      if (role != "user" && role != "system" && role != "developer" && role != "assistant")
        fail("'" + at + ".role' is '" + role + "'; it must be one of 'user', 'system', 'developer' or 'assistant'",
             "input");
      const ordered_json* content = member(item, "content");
      if (!content) fail("'" + at + ".content' is required", "input");
      (void)message_text(*content, at);
    } else if (type == "function_call") {
      string_member(item, "call_id", at, "input", true);
      string_member(item, "name", at, "input", true);
      string_member(item, "arguments", at, "input", true);
      string_member(item, "namespace", at, "input", false);
    } else if (type == "function_call_output") {
      string_member(item, "call_id", at, "input", true);
      const ordered_json* output = member(item, "output");
      if (!output) fail("'" + at + ".output' is required", "input");
      if (!output->is_string()) (void)message_text(*output, at + ".output");
    } else if (type == "reasoning") {
      if (const ordered_json* content = member(item, "content")) (void)message_text(*content, at);
    } else if (type == "item_reference") {
      fail("'" + at + "' is an item_reference: give the item itself, or continue with 'previous_response_id'",
           "input");
    } else {
      fail("'" + at + ".type' is '" + type +
               "', which this server does not know; it takes message, function_call, function_call_output and "
               "reasoning items",
           "input");
    }
    items.push_back(item);
  }
  return items;
}

// Tool types the hosted API runs itself. This server runs no tool, so it
// leaves them out (the request's function tools still work) instead of refusing it.
bool is_hosted_tool(const std::string& type) {
  static const std::set<std::string> hosted = {
      "web_search", "web_search_preview", "web_search_preview_2025_03_11", "file_search", "code_interpreter",
      "computer_use_preview", "computer_use", "image_generation", "mcp", "local_shell", "shell", "apply_patch",
      "custom", "tool_search"};
  return hosted.count(type) > 0;
}

// One function tool, as Chat Completions nests it, under `name`.
ordered_json chat_function_tool(const ordered_json& t, const std::string& name) {
  ordered_json fn = ordered_json::object();
  fn["name"] = name;
  if (const ordered_json* d = member(t, "description")) fn["description"] = *d;
  if (const ordered_json* p = member(t, "parameters")) fn["parameters"] = *p;
  if (const ordered_json* s = member(t, "strict")) fn["strict"] = *s;
  ordered_json tool = ordered_json::object();
  tool["type"] = "function";
  tool["function"] = std::move(fn);
  return tool;
}

// Responses' tools as Chat Completions' function tools, into `req`: flat
// function tools nested, a namespace's function tools flattened (their flat
// names remembered), hosted tools left out (their types remembered).
void take_tools(const ordered_json& tools, ResponsesRequest& req) {
  if (!tools.is_array()) fail("'tools' must be an array", "tools");
  for (size_t i = 0; i < tools.size(); ++i) {
    const ordered_json& t = tools[i];
    const std::string at = "tools[" + std::to_string(i) + "]";
    if (!t.is_object()) fail("'" + at + "' must be an object", "tools");
    const std::string type = string_member(t, "type", at, "tools", true);
    if (type == "function") {
      req.chat_tools.push_back(chat_function_tool(t, string_member(t, "name", at, "tools", true)));
    } else if (type == "namespace") {
      const std::string ns = string_member(t, "name", at, "tools", true);
      const ordered_json* inner = member(t, "tools");
      if (!inner || !inner->is_array()) fail("'" + at + ".tools' (an array of function tools) is required", "tools");
      for (size_t k = 0; k < inner->size(); ++k) {
        const ordered_json& f = (*inner)[k];
        const std::string inner_at = at + ".tools[" + std::to_string(k) + "]";
        if (!f.is_object()) fail("'" + inner_at + "' must be an object", "tools");
        const std::string inner_type = string_member(f, "type", inner_at, "tools", true);
        if (inner_type != "function")
          fail("'" + inner_at + ".type' is '" + inner_type + "': a namespace holds function tools only", "tools");
        const std::string name = string_member(f, "name", inner_at, "tools", true);
        const std::string flat = flat_tool_name(ns, name);
        req.namespaced_tools[flat] = NamespacedTool{ns, name};
        req.chat_tools.push_back(chat_function_tool(f, flat));
      }
    } else if (is_hosted_tool(type)) {
      req.ignored_tool_types.push_back(type);
    } else {
      fail("'" + at + ".type' is '" + type + "': this server takes function tools (and namespaces of them)",
           "tools");
    }
  }
}

// A function_call input item's name as the model knows it (flat for a namespaced tool).
std::string model_call_name(const ordered_json& item) {
  const ordered_json* ns = member(item, "namespace");
  const std::string name = item["name"].get<std::string>();
  return ns && ns->is_string() && !ns->get<std::string>().empty() ? flat_tool_name(ns->get<std::string>(), name)
                                                                   : name;
}

ordered_json chat_tool_choice(const ordered_json& choice) {
  if (choice.is_string()) {
    const std::string c = choice.get<std::string>();
    if (c != "auto" && c != "none" && c != "required")
      fail("'tool_choice' is '" + c + "'; it must be 'auto', 'none', 'required' or {\"type\": \"function\", "
           "\"name\": ...}",
           "tool_choice");
    return choice;
  }
  if (choice.is_object()) {
    const std::string type = string_member(choice, "type", "tool_choice", "tool_choice", true);
    if (type != "function")
      fail("'tool_choice.type' is '" + type + "': only function tools can be chosen", "tool_choice");
    ordered_json out = ordered_json::object();
    out["type"] = "function";
    std::string name = string_member(choice, "name", "tool_choice", "tool_choice", true);
    const std::string ns = string_member(choice, "namespace", "tool_choice", "tool_choice", false);
    if (!ns.empty()) name = flat_tool_name(ns, name);
    out["function"] = {{"name", name}};
    return out;
  }
  fail("'tool_choice' must be a string or an object", "tool_choice");
}

// text.format as Chat Completions' response_format; null for plain text.
ordered_json chat_response_format(const ordered_json& text) {
  if (!text.is_object()) fail("'text' must be an object", "text");
  const ordered_json* format = member(text, "format");
  if (!format) return nullptr;
  if (!format->is_object()) fail("'text.format' must be an object", "text.format");
  const std::string type = string_member(*format, "type", "text.format", "text.format", true);
  if (type == "text") return nullptr;
  ordered_json out = ordered_json::object();
  out["type"] = type;
  if (type == "json_object") return out;
  if (type != "json_schema")
    fail("'text.format.type' is '" + type + "'; it must be 'text', 'json_object' or 'json_schema'", "text.format");
  const ordered_json* schema = member(*format, "schema");
  if (!schema || !schema->is_object()) fail("'text.format.schema' (an object) is required", "text.format");
  ordered_json js = ordered_json::object();
  js["name"] = member(*format, "name") ? string_member(*format, "name", "text.format", "text.format", false)
                                       : std::string("response");
  js["schema"] = *schema;
  if (const ordered_json* strict = member(*format, "strict")) js["strict"] = *strict;
  out["json_schema"] = std::move(js);
  return out;
}

// The conversation's items as chat messages (see responses_chat_body).
ordered_json chat_messages(const std::vector<const ordered_json*>& items) {
  ordered_json messages = ordered_json::array();
  std::set<std::string> call_ids;
  std::string pending_reasoning;  // a reasoning item's text, for the assistant turn after it
  // The assistant message being built: consecutive assistant text and calls are one turn.
  ordered_json* assistant = nullptr;
  auto open_assistant = [&]() -> ordered_json& {
    if (!assistant) {
      ordered_json m = ordered_json::object();
      m["role"] = "assistant";
      m["content"] = "";
      messages.push_back(std::move(m));
      assistant = &messages.back();
      if (!pending_reasoning.empty()) (*assistant)["reasoning_content"] = pending_reasoning;
      pending_reasoning.clear();
    }
    return *assistant;
  };
  for (size_t i = 0; i < items.size(); ++i) {
    const ordered_json& item = *items[i];
    const std::string at = "input[" + std::to_string(i) + "]";
    const std::string type = item.contains("type") ? item["type"].get<std::string>() : "message";
    if (type == "reasoning") {
      if (const ordered_json* content = member(item, "content")) pending_reasoning += message_text(*content, at);
      continue;
    }
    if (type == "message" && item["role"] == "assistant") {
      ordered_json& m = open_assistant();
      m["content"] = m["content"].get<std::string>() + message_text(item["content"], at);
      continue;
    }
    if (type == "function_call") {
      ordered_json& m = open_assistant();
      ordered_json fn = ordered_json::object();
      fn["name"] = model_call_name(item);
      fn["arguments"] = item["arguments"];
      ordered_json call = ordered_json::object();
      call["id"] = item["call_id"];
      call["type"] = "function";
      call["function"] = std::move(fn);
      if (!m.contains("tool_calls")) m["tool_calls"] = ordered_json::array();
      m["tool_calls"].push_back(std::move(call));
      call_ids.insert(item["call_id"].get<std::string>());
      continue;
    }
    assistant = nullptr;
    pending_reasoning.clear();
    ordered_json m = ordered_json::object();
    if (type == "function_call_output") {
      const std::string call_id = item["call_id"].get<std::string>();
      if (!call_ids.count(call_id))
        fail("No tool call found for function call output with call_id '" + call_id + "'", "input");
      m["role"] = "tool";
      m["tool_call_id"] = call_id;
      const ordered_json& output = item["output"];
      m["content"] = output.is_string() ? output.get<std::string>() : message_text(output, at + ".output");
    } else {  // a user, system or developer message
      // A developer message is the system's instructions (Codex sends its
      // instructions so); many chat templates (Qwen2.5's) predate the
      // developer role and would drop it without a word.
      m["role"] = item["role"] == "developer" ? ordered_json("system") : item["role"];
      m["content"] = message_text(item["content"], at);
    }
    messages.push_back(std::move(m));
  }
  return messages;
}

}  // namespace

std::string flat_tool_name(const std::string& namespace_name, const std::string& name) {
  const size_t ns_end = namespace_name.find_last_not_of('_');
  const size_t name_begin = name.find_first_not_of('_');
  return (ns_end == std::string::npos ? std::string() : namespace_name.substr(0, ns_end + 1)) + "__" +
         (name_begin == std::string::npos ? std::string() : name.substr(name_begin));
}

void set_call_name(ordered_json& item, const std::string& called, const ResponsesRequest& req) {
  auto it = req.namespaced_tools.find(called);
  if (it == req.namespaced_tools.end()) {
    item["name"] = called;
    return;
  }
  item["name"] = it->second.name;
  item["namespace"] = it->second.namespace_name;
}

std::string new_item_id(std::string_view prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* digits = "0123456789abcdef";
  std::string id(prefix);
  id += '_';
  for (int i = 0; i < 48; ++i) id += digits[rng() % 16];
  return id;
}

std::variant<ResponsesRequest, ApiError> parse_responses_request(std::string_view text) {
  try {
    ResponsesRequest r;
    try {
      r.body = ordered_json::parse(text.begin(), text.end());
    } catch (const ordered_json::parse_error& e) {
      fail(std::string("the request body is not valid JSON: ") + e.what(), "");
    } catch (const ordered_json::out_of_range&) {
      fail("the request body holds a number outside the range of a double", "");
    }
    if (!r.body.is_object()) fail("the request body must be a JSON object", "");
    const ordered_json& body = r.body;
    auto boolean = [&](const char* key, bool fallback) {
      const ordered_json* v = member(body, key);
      if (!v) return fallback;
      if (!v->is_boolean()) fail(std::string("'") + key + "' must be a boolean", key);
      return v->get<bool>();
    };
    if (boolean("background", false))
      fail("'background' responses are not supported by this server: leave 'background' out or false", "background");
    r.store = boolean("store", true);
    r.stream = boolean("stream", false);
    const ordered_json* input = member(body, "input");
    if (!input) fail("'input' is required", "input");
    r.input = input_items(*input);
    if (const ordered_json* prev = member(body, "previous_response_id")) {
      if (!prev->is_string() || prev->get<std::string>().empty())
        fail("'previous_response_id' must be a non-empty string", "previous_response_id");
      r.previous_response_id = prev->get<std::string>();
    }
    if (const ordered_json* instr = member(body, "instructions"); instr && !instr->is_string())
      fail("'instructions' must be a string", "instructions");
    if (const ordered_json* tools = member(body, "tools")) take_tools(*tools, r);
    if (member(body, "conversation"))
      fail("'conversation' is not supported by this server: continue with 'previous_response_id'", "conversation");
    if (const ordered_json* n = member(body, "max_output_tokens"); n && (!n->is_number_integer() || n->get<int64_t>() < 1))
      fail("'max_output_tokens' must be a positive integer", "max_output_tokens");
    return r;
  } catch (const Invalid& e) {
    return e.error;
  }
}

std::variant<std::string, ApiError> responses_chat_body(const ResponsesRequest& req,
                                                       const std::vector<ordered_json>& history) {
  try {
    const ordered_json& body = req.body;
    ordered_json chat = ordered_json::object();
    if (const ordered_json* model = member(body, "model")) chat["model"] = *model;
    std::vector<const ordered_json*> items;
    for (const ordered_json& item : history) items.push_back(&item);
    for (const ordered_json& item : req.input) items.push_back(&item);
    ordered_json messages = chat_messages(items);
    if (const ordered_json* instr = member(body, "instructions"); instr && !instr->get<std::string>().empty()) {
      ordered_json system = ordered_json::object();
      system["role"] = "system";
      system["content"] = *instr;
      messages.insert(messages.begin(), std::move(system));
    }
    chat["messages"] = std::move(messages);
    if (!req.chat_tools.empty()) chat["tools"] = req.chat_tools;
    if (const ordered_json* choice = member(body, "tool_choice")) chat["tool_choice"] = chat_tool_choice(*choice);
    if (const ordered_json* p = member(body, "parallel_tool_calls")) chat["parallel_tool_calls"] = *p;
    if (const ordered_json* text = member(body, "text")) {
      ordered_json format = chat_response_format(*text);
      if (!format.is_null()) chat["response_format"] = std::move(format);
    }
    if (const ordered_json* reasoning = member(body, "reasoning")) {
      if (!reasoning->is_object()) fail("'reasoning' must be an object", "reasoning");
      if (const ordered_json* effort = member(*reasoning, "effort")) {
        if (!effort->is_string()) fail("'reasoning.effort' must be a string", "reasoning.effort");
        const std::string e = effort->get<std::string>();
        if (e == "minimal" || e == "low") chat["reasoning_effort"] = "low";
        else if (e == "medium" || e == "high") chat["reasoning_effort"] = e;
        else if (e != "none")
          fail("'reasoning.effort' is '" + e + "'; it must be 'none', 'minimal', 'low', 'medium' or 'high'",
               "reasoning.effort");
      }
    }
    if (const ordered_json* n = member(body, "max_output_tokens")) chat["max_completion_tokens"] = *n;
    // The sampling parameters (vLLM's extensions too) mean the same in both APIs.
    for (const char* key : {"temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty",
                            "repetition_penalty", "stop", "logit_bias", "cache_salt"})
      if (const ordered_json* v = member(body, key)) chat[key] = *v;
    if (req.stream) chat["stream"] = true;
    return chat.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
  } catch (const Invalid& e) {
    return e.error;
  }
}

ordered_json response_output_items(const ResponseResult& result, const ResponsesRequest& req) {
  ordered_json items = ordered_json::array();
  if (!result.reasoning.empty()) {
    ordered_json part = ordered_json::object();
    part["type"] = "reasoning_text";
    part["text"] = result.reasoning;
    ordered_json r = ordered_json::object();
    r["id"] = new_item_id("rs");
    r["type"] = "reasoning";
    r["summary"] = ordered_json::array();
    r["content"] = ordered_json::array({part});
    r["status"] = "completed";
    items.push_back(std::move(r));
  }
  if (!result.content.empty() || result.tool_calls.empty()) {
    ordered_json part = ordered_json::object();
    part["type"] = "output_text";
    part["text"] = result.content;
    part["annotations"] = ordered_json::array();
    part["logprobs"] = ordered_json::array();
    ordered_json m = ordered_json::object();
    m["id"] = new_item_id("msg");
    m["type"] = "message";
    m["status"] = result.incomplete ? "incomplete" : "completed";
    m["role"] = "assistant";
    m["content"] = ordered_json::array({part});
    items.push_back(std::move(m));
  }
  for (const json& call : result.tool_calls) {
    ordered_json fc = ordered_json::object();
    fc["id"] = new_item_id("fc");
    fc["type"] = "function_call";
    fc["status"] = "completed";
    fc["call_id"] = call.at("id");
    set_call_name(fc, call.at("function").at("name").get<std::string>(), req);
    fc["arguments"] = call.at("function").at("arguments");
    items.push_back(std::move(fc));
  }
  return items;
}

ordered_json response_object(const ResponsesRequest& req, const std::string& id, int64_t created_at,
                             const std::string& model, const std::string& status, ordered_json output,
                             const ResponseUsage* usage) {
  const ordered_json& body = req.body;
  auto given = [&](const char* key, ordered_json fallback) {
    const ordered_json* v = member(body, key);
    return v ? *v : fallback;
  };
  ordered_json r = ordered_json::object();
  r["id"] = id;
  r["object"] = "response";
  r["created_at"] = created_at;
  r["status"] = status;
  r["background"] = false;
  r["error"] = nullptr;
  ordered_json incomplete = nullptr;
  if (status == "incomplete") incomplete = {{"reason", "max_output_tokens"}};
  r["incomplete_details"] = incomplete;
  r["instructions"] = given("instructions", nullptr);
  r["max_output_tokens"] = given("max_output_tokens", nullptr);
  r["metadata"] = given("metadata", ordered_json::object());
  r["model"] = model;
  r["output"] = std::move(output);
  r["parallel_tool_calls"] = given("parallel_tool_calls", true);
  r["previous_response_id"] = req.previous_response_id.empty() ? ordered_json(nullptr)
                                                               : ordered_json(req.previous_response_id);
  ordered_json reasoning = ordered_json::object();
  reasoning["effort"] = nullptr;
  reasoning["summary"] = nullptr;
  if (const ordered_json* given_reasoning = member(body, "reasoning"))
    for (auto it = given_reasoning->begin(); it != given_reasoning->end(); ++it) reasoning[it.key()] = it.value();
  r["reasoning"] = std::move(reasoning);
  r["store"] = req.store;
  r["temperature"] = given("temperature", 1.0);
  ordered_json text = ordered_json::object();
  text["format"] = {{"type", "text"}};
  if (const ordered_json* t = member(body, "text"); t && member(*t, "format")) text["format"] = (*t)["format"];
  r["text"] = std::move(text);
  r["tool_choice"] = given("tool_choice", "auto");
  r["tools"] = given("tools", ordered_json::array());
  r["top_p"] = given("top_p", 1.0);
  r["truncation"] = "disabled";
  if (usage) {
    ordered_json u = ordered_json::object();
    u["input_tokens"] = usage->input_tokens;
    u["input_tokens_details"] = {{"cached_tokens", usage->cached_tokens}};
    u["output_tokens"] = usage->output_tokens;
    u["output_tokens_details"] = {{"reasoning_tokens", usage->reasoning_tokens}};
    u["total_tokens"] = usage->input_tokens + usage->output_tokens;
    r["usage"] = std::move(u);
  } else {
    r["usage"] = nullptr;
  }
  r["user"] = given("user", nullptr);
  return r;
}

// ---- the stream ----

ResponseEventStream::ResponseEventStream(ResponsesRequest req, std::string id, int64_t created_at, std::string model)
    : req_(std::move(req)), id_(std::move(id)), model_(std::move(model)), created_at_(created_at) {}

std::string ResponseEventStream::event(ordered_json e) {
  e["sequence_number"] = sequence_++;
  const std::string type = e["type"].get<std::string>();
  return "event: " + type + "\ndata: " + e.dump(-1, ' ', false, ordered_json::error_handler_t::replace) + "\n\n";
}

std::string ResponseEventStream::begin() {
  ordered_json created = ordered_json::object();
  created["type"] = "response.created";
  created["response"] = response_object(req_, id_, created_at_, model_, "in_progress", ordered_json::array(), nullptr);
  ordered_json in_progress = ordered_json::object();
  in_progress["type"] = "response.in_progress";
  in_progress["response"] = created["response"];
  std::string events = event(std::move(created));
  return events + event(std::move(in_progress));
}

namespace {
ordered_json text_part(const char* type, const std::string& text) {
  ordered_json part = ordered_json::object();
  part["type"] = type;
  part["text"] = text;
  if (std::string_view(type) == "output_text") {
    part["annotations"] = ordered_json::array();
    part["logprobs"] = ordered_json::array();
  }
  return part;
}

ordered_json item_event(const char* type, int64_t output_index, ordered_json item) {
  ordered_json e = ordered_json::object();
  e["type"] = type;
  e["output_index"] = output_index;
  e["item"] = std::move(item);
  return e;
}

ordered_json part_event(const char* type, const std::string& item_id, int64_t output_index, ordered_json part) {
  ordered_json e = ordered_json::object();
  e["type"] = type;
  e["item_id"] = item_id;
  e["output_index"] = output_index;
  e["content_index"] = 0;
  e["part"] = std::move(part);
  return e;
}
}  // namespace

std::string ResponseEventStream::close_open_item() {
  if (open_ == Open::kNone) return {};
  const int64_t index = static_cast<int64_t>(output_.size());
  const bool reasoning = open_ == Open::kReasoning;
  const char* part_type = reasoning ? "reasoning_text" : "output_text";
  std::string events;
  ordered_json done = ordered_json::object();
  done["type"] = reasoning ? "response.reasoning_text.done" : "response.output_text.done";
  done["item_id"] = open_id_;
  done["output_index"] = index;
  done["content_index"] = 0;
  done["text"] = open_text_;
  if (!reasoning) done["logprobs"] = ordered_json::array();
  events += event(std::move(done));
  events += event(part_event("response.content_part.done", open_id_, index, text_part(part_type, open_text_)));
  ordered_json item = ordered_json::object();
  item["id"] = open_id_;
  if (reasoning) {
    item["type"] = "reasoning";
    item["summary"] = ordered_json::array();
    item["content"] = ordered_json::array({text_part(part_type, open_text_)});
    item["status"] = "completed";
  } else {
    item["type"] = "message";
    item["status"] = "completed";
    item["role"] = "assistant";
    item["content"] = ordered_json::array({text_part(part_type, open_text_)});
  }
  output_.push_back(item);
  events += event(item_event("response.output_item.done", index, std::move(item)));
  open_ = Open::kNone;
  open_text_.clear();
  return events;
}

std::string ResponseEventStream::open_item(Open kind) {
  std::string events = close_open_item();
  const bool reasoning = kind == Open::kReasoning;
  open_ = kind;
  open_id_ = new_item_id(reasoning ? "rs" : "msg");
  const int64_t index = static_cast<int64_t>(output_.size());
  ordered_json item = ordered_json::object();
  item["id"] = open_id_;
  if (reasoning) {
    item["type"] = "reasoning";
    item["summary"] = ordered_json::array();
  } else {
    item["type"] = "message";
    item["role"] = "assistant";
  }
  item["content"] = ordered_json::array();
  item["status"] = "in_progress";
  events += event(item_event("response.output_item.added", index, std::move(item)));
  events += event(part_event("response.content_part.added", open_id_, index,
                             text_part(reasoning ? "reasoning_text" : "output_text", "")));
  return events;
}

std::string ResponseEventStream::append(Open kind, const std::string& text) {
  std::string events;
  if (open_ != kind) events += open_item(kind);
  open_text_ += text;
  const bool reasoning = kind == Open::kReasoning;
  ordered_json delta = ordered_json::object();
  delta["type"] = reasoning ? "response.reasoning_text.delta" : "response.output_text.delta";
  delta["item_id"] = open_id_;
  delta["output_index"] = static_cast<int64_t>(output_.size());
  delta["content_index"] = 0;
  delta["delta"] = text;
  if (!reasoning) delta["logprobs"] = ordered_json::array();
  return events + event(std::move(delta));
}

std::string ResponseEventStream::reasoning_delta(const std::string& text) {
  return text.empty() ? std::string() : append(Open::kReasoning, text);
}

std::string ResponseEventStream::text_delta(const std::string& text) {
  if (text.empty()) return {};
  if (open_ != Open::kMessage && text.find_first_not_of(" \t\r\n") == std::string::npos) {
    held_space_ += text;  // no message for whitespace alone (it would come before a call)
    return {};
  }
  const std::string piece = held_space_ + text;
  held_space_.clear();
  return append(Open::kMessage, piece);
}

std::string ResponseEventStream::function_call(const std::string& call_id, const std::string& name,
                                               const std::string& arguments) {
  held_space_.clear();
  any_call_ = true;
  std::string events = close_open_item();
  const int64_t index = static_cast<int64_t>(output_.size());
  ordered_json item = ordered_json::object();
  item["id"] = new_item_id("fc");
  item["type"] = "function_call";
  item["status"] = "in_progress";
  item["call_id"] = call_id;
  set_call_name(item, name, req_);
  item["arguments"] = "";
  const std::string item_id = item["id"].get<std::string>();
  events += event(item_event("response.output_item.added", index, item));
  ordered_json delta = ordered_json::object();
  delta["type"] = "response.function_call_arguments.delta";
  delta["item_id"] = item_id;
  delta["output_index"] = index;
  delta["delta"] = arguments;
  events += event(std::move(delta));
  ordered_json done = ordered_json::object();
  done["type"] = "response.function_call_arguments.done";
  done["item_id"] = item_id;
  done["output_index"] = index;
  done["name"] = item["name"];
  done["arguments"] = arguments;
  events += event(std::move(done));
  item["status"] = "completed";
  item["arguments"] = arguments;
  output_.push_back(item);
  events += event(item_event("response.output_item.done", index, std::move(item)));
  return events;
}

std::string ResponseEventStream::finish(bool incomplete, const ResponseUsage& usage) {
  std::string events;
  // Whitespace held back: dropped after calls; an answer of whitespace alone is sent.
  if (!held_space_.empty() && !any_call_) {
    const std::string space = std::move(held_space_);
    held_space_.clear();
    if (open_ != Open::kMessage) events += open_item(Open::kMessage);
    events += text_delta(space);
  }
  held_space_.clear();
  events += close_open_item();
  final_ = response_object(req_, id_, created_at_, model_, incomplete ? "incomplete" : "completed", output_, &usage);
  ordered_json done = ordered_json::object();
  done["type"] = incomplete ? "response.incomplete" : "response.completed";
  done["response"] = final_;
  events += event(std::move(done));
  return events;
}

std::string ResponseEventStream::error(const std::string& message) {
  ordered_json e = ordered_json::object();
  e["type"] = "error";
  e["code"] = "server_error";
  e["message"] = message;
  e["param"] = nullptr;
  return event(std::move(e));
}

}  // namespace inferd::server
