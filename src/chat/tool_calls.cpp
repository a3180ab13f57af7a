#include "chat/tool_calls.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <utility>

#include "chat/text_scan.h"

namespace inferd {

namespace {

using nlohmann::json;

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kMistralCalls = "[TOOL_CALLS]";
constexpr std::string_view kMistralArgs = "[ARGS]";
constexpr std::string_view kFunctionOpen = "<function=";
constexpr std::string_view kFunctionClose = "</function>";
constexpr std::string_view kParameterOpen = "<parameter=";
constexpr std::string_view kParameterClose = "</parameter>";

using text_scan::is_space;
using text_scan::partial_marker_at_end;
using text_scan::skip_space;
using text_scan::trim;

std::string compact(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// A call from one parsed JSON object: a non-empty string "name" and an object
// of arguments under "arguments" (or "parameters", Llama 3's key), given as an
// object or as a string holding one; missing arguments are {}.
std::optional<ParsedToolCall> call_from_json(const json& j) {
  if (!j.is_object()) return std::nullopt;
  const auto name = j.find("name");
  if (name == j.end() || !name->is_string() || name->get_ref<const std::string&>().empty()) return std::nullopt;
  ParsedToolCall call;
  call.name = name->get<std::string>();
  auto args = j.find("arguments");
  if (args == j.end()) args = j.find("parameters");
  if (args == j.end()) {
    call.arguments = "{}";
  } else if (args->is_object()) {
    call.arguments = compact(*args);
  } else if (args->is_string()) {
    const json inner = json::parse(args->get_ref<const std::string&>(), nullptr, /*allow_exceptions=*/false);
    if (!inner.is_object()) return std::nullopt;
    call.arguments = compact(inner);
  } else {
    return std::nullopt;
  }
  return call;
}

std::optional<json> parse_json(std::string_view text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

std::optional<ParsedToolCall> parse_call(std::string_view text) {
  // Bounded nesting first: the parse below recurses.
  const JsonScan scan = scan_json_value(text, 0);
  if (scan.status != JsonScan::kComplete || skip_space(text, scan.end) != text.size()) return std::nullopt;
  const std::optional<json> j = parse_json(text);
  return j ? call_from_json(*j) : std::nullopt;
}

// The JSON types a parameter's schema allows ("type": a name or a list);
// empty when it names none.
std::vector<std::string> schema_types(const json& schema) {
  std::vector<std::string> types;
  if (!schema.is_object()) return types;
  const auto t = schema.find("type");
  if (t == schema.end()) return types;
  if (t->is_string()) types.push_back(t->get<std::string>());
  if (t->is_array())
    for (const json& x : *t)
      if (x.is_string()) types.push_back(x.get<std::string>());
  return types;
}

bool json_has_type(const json& v, const std::vector<std::string>& types) {
  for (const std::string& t : types) {
    const bool whole = v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
    if ((t == "number" && v.is_number()) || (t == "integer" && whole) || (t == "boolean" && v.is_boolean()) ||
        (t == "null" && v.is_null()) || (t == "object" && v.is_object()) || (t == "array" && v.is_array()) ||
        (t == "string" && v.is_string()))
      return true;
  }
  return false;
}

// A Qwen3-Coder parameter's text as JSON, by the type its schema gives it.
json typed_value(const std::string& text, const json* schema) {
  if (!schema) return text;  // a parameter the function does not declare: text
  const std::vector<std::string> types = schema_types(*schema);
  if (types.size() == 1 && types[0] == "string") return text;
  std::string t(trim(text));
  // Python's spellings (vLLM accepts them).
  if (t == "True" || t == "False" || t == "None") {
    bool wants_bool = types.empty();
    for (const std::string& ty : types) wants_bool = wants_bool || ty == "boolean" || ty == "null";
    if (wants_bool) t = t == "True" ? "true" : t == "False" ? "false" : "null";
  }
  if (!t.empty() && (t[0] == '{' || t[0] == '[')) {  // bounded nesting first: the parse below recurses
    const JsonScan scan = scan_json_value(t, 0);
    if (scan.status != JsonScan::kComplete || scan.end != t.size()) return text;
  }
  json v = json::parse(t, nullptr, /*allow_exceptions=*/false, /*ignore_comments=*/false);
  if (v.is_discarded()) return text;
  if (types.empty() || json_has_type(v, types)) return v;
  return text;
}

}  // namespace

std::optional<ParsedToolCall> parse_qwen3_coder_call(std::string_view text,
                                                     const std::vector<ToolSignature>& signatures) {
  std::string_view s = trim(text);
  if (!s.starts_with(kFunctionOpen)) return std::nullopt;
  const size_t name_end = s.find('>');
  if (name_end == std::string_view::npos) return std::nullopt;
  const std::string_view name = trim(s.substr(kFunctionOpen.size(), name_end - kFunctionOpen.size()));
  if (name.empty() || name.find_first_of(" \t\r\n<>") != std::string_view::npos) return std::nullopt;
  const json* properties = nullptr;
  json schema;
  for (const ToolSignature& sig : signatures) {
    if (sig.name != name) continue;
    schema = json::parse(sig.parameters, nullptr, /*allow_exceptions=*/false);
    if (schema.is_object() && schema.contains("properties") && schema["properties"].is_object())
      properties = &schema["properties"];
    break;
  }
  nlohmann::ordered_json args = nlohmann::ordered_json::object();  // in the order the model wrote them
  size_t i = name_end + 1;
  for (;;) {
    i = skip_space(s, i);
    if (i == s.size() || s.substr(i).starts_with(kFunctionClose)) break;  // the closing tag may be missing
    if (!s.substr(i).starts_with(kParameterOpen)) return std::nullopt;
    const size_t key_end = s.find('>', i);
    if (key_end == std::string_view::npos) return std::nullopt;
    const std::string key(trim(s.substr(i + kParameterOpen.size(), key_end - i - kParameterOpen.size())));
    if (key.empty()) return std::nullopt;
    // The value runs to </parameter>, or (when the model left that out) to
    // the next parameter or the function's end.
    size_t value_end = s.find(kParameterClose, key_end);
    size_t next = value_end == std::string_view::npos ? std::string_view::npos : value_end + kParameterClose.size();
    if (value_end == std::string_view::npos) {
      value_end = std::min(s.find(kParameterOpen, key_end), s.find(kFunctionClose, key_end));
      if (value_end == std::string_view::npos) value_end = s.size();
      next = value_end;
    }
    std::string_view value = s.substr(key_end + 1, value_end - key_end - 1);
    if (value.starts_with('\n')) value.remove_prefix(1);
    if (value.ends_with('\n')) value.remove_suffix(1);
    const json* param = nullptr;
    if (properties)
      if (auto it = properties->find(key); it != properties->end()) param = &*it;
    args[key] = nlohmann::ordered_json(typed_value(std::string(value), param));
    i = next;
  }
  if (i < s.size()) {
    i += kFunctionClose.size();
    if (skip_space(s, i) != s.size()) return std::nullopt;  // text after the function
  }
  return ParsedToolCall{std::string(name), args.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace)};
}

std::optional<ToolCallFormat> tool_call_format_from_name(std::string_view name) {
  if (name == "hermes") return ToolCallFormat::kHermes;
  if (name == "llama3_json") return ToolCallFormat::kLlama3Json;
  if (name == "mistral") return ToolCallFormat::kMistral;
  if (name == "qwen3_coder") return ToolCallFormat::kQwen3Coder;
  if (name == "openai" || name == "harmony") return ToolCallFormat::kHarmony;
  return std::nullopt;
}

const char* tool_call_format_name(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes: return "hermes";
    case ToolCallFormat::kLlama3Json: return "llama3_json";
    case ToolCallFormat::kMistral: return "mistral";
    case ToolCallFormat::kQwen3Coder: return "qwen3_coder";
    case ToolCallFormat::kHarmony: return "openai";
  }
  return "";
}

std::optional<ToolCallFormat> detect_tool_call_format(std::string_view source) {
  // Checked from the most specific marker: a template names the markers it
  // asks the model to write (Qwen3-Coder's template shows <tool_call> too).
  if (source.find("<|channel|>") != std::string_view::npos) return ToolCallFormat::kHarmony;
  if (source.find(kFunctionOpen) != std::string_view::npos) return ToolCallFormat::kQwen3Coder;
  if (source.find(kHermesOpen) != std::string_view::npos) return ToolCallFormat::kHermes;
  if (source.find(kMistralCalls) != std::string_view::npos) return ToolCallFormat::kMistral;
  if (source.find(kPythonTag) != std::string_view::npos ||
      source.find("Environment: ipython") != std::string_view::npos) {
    return ToolCallFormat::kLlama3Json;
  }
  return std::nullopt;
}

JsonScan scan_json_value(std::string_view text, size_t begin, int max_depth) {
  size_t i = skip_space(text, begin);
  if (i == text.size()) return {JsonScan::kIncomplete, 0};
  if (text[i] != '{' && text[i] != '[') return {JsonScan::kInvalid, 0};
  std::string closers;  // the brackets still open, innermost last
  bool in_string = false, escaped = false;
  for (; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (static_cast<int>(closers.size()) >= max_depth) return {JsonScan::kInvalid, 0};
      closers.push_back(c == '{' ? '}' : ']');
    } else if (c == '}' || c == ']') {
      if (closers.empty() || closers.back() != c) return {JsonScan::kInvalid, 0};
      closers.pop_back();
      if (closers.empty()) return {JsonScan::kComplete, i + 1};
    }
  }
  return {JsonScan::kIncomplete, 0};
}

// ---- the stream parser ------------------------------------------------------

namespace {

// The tags a small model may wrap an untagged hermes call in instead of
// <tool_call> (the set llama.cpp's hermes parser accepted).
// (<tool_call> itself is the hermes marker, read anywhere in the answer.)
constexpr std::string_view kBareCallTags[] = {"function_call", "tool", "tools", "response", "json", "xml", "JSON"};

// How an answer opens a call without hermes tags: where its JSON object
// starts and what closes the wrappers around it (a tag, then a code fence).
struct BareOpener {
  enum Kind { kNone, kNeedMore, kFound } kind = kNone;
  size_t json_begin = 0;
  std::vector<std::string> closers;
};

// Whether `text` (an answer's start) opens with a call's JSON object, alone or
// in a ```json / ```xml / ``` fence and/or one of kBareCallTags: kNeedMore
// while the text so far could still open one.
BareOpener bare_opener(std::string_view text, bool at_end) {
  BareOpener none;
  BareOpener more{BareOpener::kNeedMore, 0, {}};
  const auto partial = [&](std::string_view rest, std::string_view lit) {
    return !at_end && rest.size() < lit.size() && lit.substr(0, rest.size()) == rest;
  };
  std::vector<std::string> closers;
  size_t i = skip_space(text, 0);
  if (i == text.size()) return at_end ? none : more;
  constexpr std::string_view kFence = "```";
  if (partial(text.substr(i), kFence)) return more;
  if (text.substr(i, kFence.size()) == kFence) {
    size_t k = i + kFence.size();
    while (k < text.size() && text[k] != '\n' && k - i < 16) ++k;
    if (k == text.size()) return at_end ? none : more;
    const std::string_view lang = trim(text.substr(i + kFence.size(), k - i - kFence.size()));
    if (!lang.empty() && lang != "json" && lang != "xml") return none;
    closers.insert(closers.begin(), std::string(kFence));
    i = skip_space(text, k);
    if (i == text.size()) return at_end ? none : more;
  }
  if (text[i] == '<') {
    const size_t close = text.find('>', i);
    if (close == std::string_view::npos) return !at_end && text.size() - i < 16 ? more : none;
    const std::string_view tag = text.substr(i + 1, close - i - 1);
    if (std::find(std::begin(kBareCallTags), std::end(kBareCallTags), tag) == std::end(kBareCallTags)) return none;
    closers.insert(closers.begin(), "</" + std::string(tag) + ">");
    i = skip_space(text, close + 1);
    if (i == text.size()) return at_end ? none : more;
  }
  if (text[i] != '{') return none;
  return {BareOpener::kFound, i, std::move(closers)};
}

}  // namespace


void ToolCallStreamParser::emit_content(std::vector<ToolCallDelta>& out, std::string_view text) {
  if (text.empty()) return;
  if (!out.empty() && !out.back().call) {
    out.back().content += text;
  } else {
    out.push_back({std::string(text), std::nullopt, -1});
  }
}

// The calls parsed from buffer_[0, end) (opened by raw_prefix_) are reported.
void ToolCallStreamParser::accept_calls(std::vector<ToolCallDelta>& out, std::vector<ParsedToolCall> calls,
                                        size_t end) {
  for (ParsedToolCall& call : calls) out.push_back({"", std::move(call), calls_++});
  raw_prefix_.clear();
  buffer_.erase(0, end);
}

std::vector<ToolCallDelta> ToolCallStreamParser::feed(std::string_view text) {
  buffer_ += text;
  std::vector<ToolCallDelta> out;
  step(out, /*at_end=*/false);
  return out;
}

std::vector<ToolCallDelta> ToolCallStreamParser::finish() {
  std::vector<ToolCallDelta> out;
  step(out, /*at_end=*/true);
  return out;
}

void ToolCallStreamParser::step(std::vector<ToolCallDelta>& out, bool at_end) {
  for (;;) {
    bool progressed = false;
    switch (state_) {
      case State::kStart: {
        // Only Llama 3's calls must open the answer; the others may come anywhere.
        if (format_ == ToolCallFormat::kHermes && !bare_call_names_.empty()) {
          // A call without its tags (or in another tag, or a code fence)
          // may open a hermes answer.
          BareOpener opener = bare_opener(buffer_, at_end);
          if (opener.kind == BareOpener::kNeedMore) return;
          if (opener.kind == BareOpener::kFound) {
            raw_prefix_ = buffer_.substr(0, opener.json_begin);
            buffer_.erase(0, opener.json_begin);
            bare_ = true;
            bare_closers_ = std::move(opener.closers);
            state_ = State::kInCall;
          } else {
            state_ = State::kContent;
          }
          progressed = true;
          break;
        }
        if (format_ != ToolCallFormat::kLlama3Json) {
          state_ = State::kContent;
          progressed = true;
          break;
        }
        const size_t i = skip_space(buffer_, 0);
        const std::string_view rest = std::string_view(buffer_).substr(i);
        if (rest.empty() && !at_end) return;  // only whitespace so far
        if (!at_end && rest.size() < kPythonTag.size() && kPythonTag.substr(0, rest.size()) == rest) return;
        size_t call_start = i;
        if (rest.substr(0, kPythonTag.size()) == kPythonTag) call_start = skip_space(buffer_, i + kPythonTag.size());
        if (call_start == buffer_.size() && !at_end) return;
        if (call_start < buffer_.size() && buffer_[call_start] == '{') {
          raw_prefix_ = buffer_.substr(0, call_start);
          buffer_.erase(0, call_start);
          state_ = State::kInCall;
        } else {
          state_ = State::kContent;
        }
        progressed = true;
        break;
      }
      case State::kContent: progressed = step_content(out, at_end); break;
      case State::kInCall: progressed = step_in_call(out, at_end); break;
      case State::kAfterJsonCall: progressed = step_after_json_call(at_end); break;
    }
    if (!progressed) return;
  }
}

bool ToolCallStreamParser::step_content(std::vector<ToolCallDelta>& out, bool at_end) {
  if (buffer_.empty()) return false;
  const std::string_view marker =
      format_ == ToolCallFormat::kHermes || format_ == ToolCallFormat::kQwen3Coder ? kHermesOpen
      : format_ == ToolCallFormat::kMistral                                        ? kMistralCalls
                                                                                   : std::string_view();
  if (marker.empty()) {  // Llama 3: once the answer is text, it is text to the end
    emit_content(out, buffer_);
    buffer_.clear();
    return false;
  }
  const size_t at = buffer_.find(marker);
  if (at != std::string::npos) {
    emit_content(out, std::string_view(buffer_).substr(0, at));
    raw_prefix_ = std::string(marker);
    buffer_.erase(0, at + marker.size());
    state_ = State::kInCall;
    return true;
  }
  const size_t held = at_end ? 0 : partial_marker_at_end(buffer_, marker);
  emit_content(out, std::string_view(buffer_).substr(0, buffer_.size() - held));
  buffer_.erase(0, buffer_.size() - held);
  return false;
}

// The call's text as the model wrote it becomes content (it did not parse).
void ToolCallStreamParser::reject_call(std::vector<ToolCallDelta>& out, size_t end) {
  emit_content(out, raw_prefix_);
  emit_content(out, std::string_view(buffer_).substr(0, end));
  raw_prefix_.clear();
  buffer_.erase(0, end);
}

bool ToolCallStreamParser::step_in_call(std::vector<ToolCallDelta>& out, bool at_end) {
  switch (format_) {
    case ToolCallFormat::kHermes: {
      if (bare_) {
        const JsonScan scan = scan_json_value(buffer_, 0);
        if (scan.status == JsonScan::kIncomplete && !at_end) return false;
        std::optional<ParsedToolCall> call;
        if (scan.status == JsonScan::kComplete) call = parse_call(std::string_view(buffer_).substr(0, scan.end));
        bool known = false;
        for (const std::string& name : bare_call_names_) known = known || (call && call->name == name);
        size_t end = scan.status == JsonScan::kComplete ? scan.end : buffer_.size();
        if (known) {
          // The wrappers' closers, where the model wrote them, go with the call.
          for (const std::string& closer : bare_closers_) {
            const size_t at = skip_space(buffer_, end);
            const std::string_view rest = std::string_view(buffer_).substr(at);
            if (rest.substr(0, closer.size()) == closer) {
              end = at + closer.size();
            } else if (!at_end && rest.size() < closer.size() && std::string_view(closer).substr(0, rest.size()) == rest) {
              return false;  // it may be coming
            } else {
              break;
            }
          }
        }
        bare_ = false;
        bare_closers_.clear();
        state_ = State::kContent;
        if (!known) {  // an answer that happens to be JSON: content
          reject_call(out, end);
          return true;
        }
        accept_calls(out, {std::move(*call)}, end);
        return true;
      }
      const size_t close = buffer_.find(kHermesClose);
      if (close == std::string::npos && !at_end) return false;
      // At the end, a call whose closing tag alone is missing still counts.
      const size_t inner_end = close == std::string::npos ? buffer_.size() : close;
      const size_t end = close == std::string::npos ? buffer_.size() : close + kHermesClose.size();
      if (std::optional<ParsedToolCall> call = parse_call(trim(std::string_view(buffer_).substr(0, inner_end)))) {
        accept_calls(out, {std::move(*call)}, end);
      } else {
        reject_call(out, end);
      }
      state_ = State::kContent;
      return true;
    }
    case ToolCallFormat::kQwen3Coder: {
      const size_t close = buffer_.find(kHermesClose);
      if (close == std::string::npos && !at_end) return false;
      // At the end, a call whose closing tag alone is missing still counts.
      const size_t inner_end = close == std::string::npos ? buffer_.size() : close;
      const size_t end = close == std::string::npos ? buffer_.size() : close + kHermesClose.size();
      const std::string_view inner = std::string_view(buffer_).substr(0, inner_end);
      std::optional<ParsedToolCall> call;
      // A call cut inside a value is not whole: its </function> must be there
      // unless the closing tag was.
      if (close != std::string::npos || trim(inner).ends_with(kFunctionClose))
        call = parse_qwen3_coder_call(inner, signatures_);
      if (call) {
        accept_calls(out, {std::move(*call)}, end);
      } else {
        reject_call(out, end);
      }
      state_ = State::kContent;
      return true;
    }
    case ToolCallFormat::kHarmony:
      reject_call(out, buffer_.size());  // not parsed here (chat/harmony.h)
      state_ = State::kContent;
      return true;
    case ToolCallFormat::kLlama3Json: {
      const JsonScan scan = scan_json_value(buffer_, 0);
      if (scan.status == JsonScan::kIncomplete && !at_end) return false;
      std::optional<ParsedToolCall> call;
      if (scan.status == JsonScan::kComplete) call = parse_call(std::string_view(buffer_).substr(0, scan.end));
      if (!call) {  // not a call after all: the rest of the answer is text
        reject_call(out, buffer_.size());
        state_ = State::kContent;
        return true;
      }
      accept_calls(out, {std::move(*call)}, scan.end);
      state_ = State::kAfterJsonCall;
      return true;
    }
    case ToolCallFormat::kMistral: {
      const size_t i = skip_space(buffer_, 0);
      if (i == buffer_.size() && !at_end) return false;
      std::vector<ParsedToolCall> calls;
      size_t end = buffer_.size();
      bool ok = false;
      if (i < buffer_.size() && buffer_[i] == '[') {  // [TOOL_CALLS] [{...}, ...]
        const JsonScan scan = scan_json_value(buffer_, i);
        if (scan.status == JsonScan::kIncomplete && !at_end) return false;
        if (scan.status == JsonScan::kComplete) {
          end = scan.end;
          if (const std::optional<json> j = parse_json(std::string_view(buffer_).substr(i, end - i))) {
            ok = j->is_array() && !j->empty();
            for (const json& item : *j) {
              std::optional<ParsedToolCall> call = call_from_json(item);
              if (!call) ok = false;
              if (ok) calls.push_back(std::move(*call));
            }
          }
        }
      } else {  // [TOOL_CALLS]name[ARGS]{...}
        const size_t args = buffer_.find(kMistralArgs, i);
        if (args == std::string::npos) {
          // A name is one short word: anything else is not a call.
          std::string_view head = std::string_view(buffer_).substr(i);
          head.remove_suffix(partial_marker_at_end(head, kMistralArgs));
          const bool may_be_name = head.size() <= 256 && head.find_first_of(" \t\r\n{}[]\"") == std::string_view::npos;
          if (may_be_name && !at_end) return false;
        } else {
          const std::string_view name = std::string_view(buffer_).substr(i, args - i);
          const JsonScan scan = scan_json_value(buffer_, args + kMistralArgs.size());
          if (scan.status == JsonScan::kIncomplete && !at_end) return false;
          if (scan.status == JsonScan::kComplete && !name.empty() &&
              name.find_first_of(" \t\r\n{}[]\"") == std::string_view::npos) {
            end = scan.end;
            const size_t body = args + kMistralArgs.size();
            const std::optional<json> j = parse_json(std::string_view(buffer_).substr(body, end - body));
            if (j && j->is_object()) {
              calls.push_back({std::string(name), compact(*j)});
              ok = true;
            }
          }
        }
      }
      if (ok) {
        accept_calls(out, std::move(calls), end);
      } else {
        reject_call(out, end);
      }
      state_ = State::kContent;
      return true;
    }
  }
  return false;
}

bool ToolCallStreamParser::step_after_json_call(bool at_end) {
  // Llama 3: calls are separated by ';'; anything else after them is text.
  const size_t i = skip_space(buffer_, 0);
  if (i == buffer_.size()) {
    if (at_end) buffer_.clear();  // trailing whitespace
    return false;
  }
  if (buffer_[i] == ';') {
    const size_t next = skip_space(buffer_, i + 1);
    if (next == buffer_.size() && !at_end) return false;
    if (next < buffer_.size() && buffer_[next] == '{') {
      raw_prefix_ = buffer_.substr(0, next);
      buffer_.erase(0, next);
      state_ = State::kInCall;
      return true;
    }
  }
  buffer_.erase(0, i);
  state_ = State::kContent;
  return true;
}

ParsedAssistantMessage parse_tool_calls(ToolCallFormat format, std::string_view output,
                                        std::vector<std::string> bare_call_names,
                                        std::vector<ToolSignature> signatures) {
  ToolCallStreamParser parser(format, std::move(bare_call_names), std::move(signatures));
  std::vector<ToolCallDelta> deltas = parser.feed(output);
  for (ToolCallDelta& d : parser.finish()) deltas.push_back(std::move(d));
  ParsedAssistantMessage message;
  for (ToolCallDelta& d : deltas) {
    message.content += d.content;
    if (d.call) message.tool_calls.push_back(std::move(*d.call));
  }
  message.content = std::string(trim(message.content));
  return message;
}

}  // namespace inferd
