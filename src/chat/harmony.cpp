#include "chat/harmony.h"

#include <nlohmann/json.hpp>

#include <array>

#include "chat/text_scan.h"

namespace inferd {

namespace {

using text_scan::partial_marker_at_end;
using text_scan::trim;

constexpr std::string_view kStart = "<|start|>";
constexpr std::string_view kChannel = "<|channel|>";
constexpr std::string_view kMessage = "<|message|>";
constexpr std::array<std::string_view, 4> kTerminators = {"<|end|>", "<|call|>", "<|return|>", "<|start|>"};
// What a header may begin with: the next message's start, its channel, or a
// recipient written before the channel.
constexpr std::array<std::string_view, 4> kHeaderOpeners = {kStart, kChannel, " to=", "to="};
// A header longer than this without <|message|> is not one.
constexpr size_t kMaxHeader = 1024;

bool is_name_end(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '<'; }

// The word that starts at s[i] (up to whitespace or the next marker).
std::string_view word_at(std::string_view s, size_t i) {
  size_t e = i;
  while (e < s.size() && !is_name_end(s[e])) ++e;
  return s.substr(i, e - i);
}

}  // namespace

bool template_uses_harmony(std::string_view source) { return source.find(kChannel) != std::string_view::npos; }

void HarmonyStreamParser::emit(std::vector<HarmonyDelta>& out, Kind kind, std::string_view text) {
  if (text.empty()) return;
  if (kind == Kind::kReasoning) {
    std::string piece;
    if (!message_has_text_ && reasoning_seen_) piece = "\n";  // a new analysis message (vLLM joins them so)
    piece += text;
    message_has_text_ = reasoning_seen_ = true;
    if (!out.empty() && !out.back().call && out.back().content.empty()) {
      out.back().reasoning += piece;
    } else {
      out.push_back({std::move(piece), "", std::nullopt, -1});
    }
    return;
  }
  if (!out.empty() && !out.back().call && out.back().reasoning.empty()) {
    out.back().content += text;
  } else {
    out.push_back({"", std::string(text), std::nullopt, -1});
  }
}

std::vector<HarmonyDelta> HarmonyStreamParser::feed(std::string_view text) {
  buffer_ += text;
  std::vector<HarmonyDelta> out;
  run(out, /*at_end=*/false);
  return out;
}

std::vector<HarmonyDelta> HarmonyStreamParser::finish() {
  std::vector<HarmonyDelta> out;
  run(out, /*at_end=*/true);
  buffer_.clear();
  return out;
}

void HarmonyStreamParser::run(std::vector<HarmonyDelta>& out, bool at_end) {
  for (;;) {
    const bool progressed = state_ == State::kHeader ? step_header(out, at_end) : step_body(out, at_end);
    if (!progressed) return;
  }
}

bool HarmonyStreamParser::step_header(std::vector<HarmonyDelta>& out, bool at_end) {
  if (buffer_.empty()) return false;
  // Whitespace between messages is dropped (a recipient's " to=" keeps its space).
  size_t lead = 0;
  while (lead < buffer_.size() && (buffer_[lead] == '\n' || buffer_[lead] == '\r')) ++lead;
  std::string_view s = std::string_view(buffer_).substr(lead);
  if (s.empty()) {
    if (at_end) buffer_.clear();
    return false;
  }
  bool opens = false, may_open = false;
  for (std::string_view o : kHeaderOpeners) {
    opens = opens || s.starts_with(o);
    may_open = may_open || (s.size() < o.size() && o.starts_with(s));
  }
  if (!opens) {
    if (may_open && !at_end) return false;  // undecided
    // No harmony header: plain text, content up to a terminator.
    kind_ = Kind::kContent;
    state_ = State::kBody;
    return true;
  }
  const size_t msg = s.find(kMessage);
  if (msg == std::string_view::npos) {
    if (!at_end && s.size() <= kMaxHeader) return false;
    if (at_end) {
      buffer_.clear();  // a header cut short says nothing
      return false;
    }
    kind_ = Kind::kContent;  // too long for a header: text
    state_ = State::kBody;
    return true;
  }
  const std::string_view header = s.substr(0, msg);
  // The recipient, in the role (<|start|>assistant to=functions.f<|channel|>...)
  // or in the channel (<|channel|>commentary to=functions.f ...).
  std::string recipient;
  if (size_t to = header.find("to="); to != std::string_view::npos && (to == 0 || header[to - 1] == ' '))
    recipient = std::string(word_at(header, to + 3));
  std::string channel;
  if (size_t ch = header.find(kChannel); ch != std::string_view::npos)
    channel = std::string(word_at(header, ch + kChannel.size()));
  message_has_text_ = false;
  recipient_.clear();
  if (!recipient.empty() && recipient != "assistant") {
    constexpr std::string_view kFunctions = "functions.";
    if (parse_calls_ && recipient.starts_with(kFunctions) && recipient.size() > kFunctions.size()) {
      kind_ = Kind::kCall;
      recipient_ = recipient.substr(kFunctions.size());
    } else {
      kind_ = Kind::kContent;
    }
  } else if (channel == "analysis") {
    kind_ = Kind::kReasoning;
  } else {
    kind_ = Kind::kContent;  // final, a commentary preamble, or an unknown channel
  }
  buffer_.erase(0, lead + msg + kMessage.size());
  state_ = State::kBody;
  return true;
}

bool HarmonyStreamParser::step_body(std::vector<HarmonyDelta>& out, bool at_end) {
  size_t end = std::string::npos;
  std::string_view terminator;
  for (std::string_view t : kTerminators) {
    const size_t p = buffer_.find(t);
    if (p < end) {
      end = p;
      terminator = t;
    }
  }
  if (kind_ == Kind::kCall) {
    if (end == std::string::npos && !at_end) return false;  // a call comes whole
    const std::string_view body = std::string_view(buffer_).substr(0, end == std::string::npos ? buffer_.size() : end);
    const std::string_view args = trim(body);
    const JsonScan scan = scan_json_value(args, 0);
    nlohmann::ordered_json j;  // keys in the model's order
    if (scan.status == JsonScan::kComplete && scan.end == args.size())
      j = nlohmann::ordered_json::parse(args, nullptr, /*allow_exceptions=*/false);
    if (j.is_object()) {
      out.push_back({"", "", ParsedToolCall{recipient_, j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace)},
                     calls_++});
    } else {
      emit(out, Kind::kContent, body);  // not a call after all: the text as written
    }
  } else if (end != std::string::npos) {
    emit(out, kind_, std::string_view(buffer_).substr(0, end));
  } else {
    size_t held = 0;
    if (!at_end)
      for (std::string_view t : kTerminators) held = std::max(held, partial_marker_at_end(buffer_, t));
    emit(out, kind_, std::string_view(buffer_).substr(0, buffer_.size() - held));
    buffer_.erase(0, buffer_.size() - held);
    return false;
  }
  if (end == std::string::npos) {
    buffer_.clear();
    return false;
  }
  // <|start|> opens the next message: it stays for the header.
  buffer_.erase(0, terminator == kStart ? end : end + terminator.size());
  state_ = State::kHeader;
  return true;
}

HarmonyMessage parse_harmony(std::string_view output, bool parse_tool_calls) {
  HarmonyStreamParser parser(parse_tool_calls);
  std::vector<HarmonyDelta> deltas = parser.feed(output);
  for (HarmonyDelta& d : parser.finish()) deltas.push_back(std::move(d));
  HarmonyMessage m;
  for (HarmonyDelta& d : deltas) {
    m.reasoning += d.reasoning;
    m.content += d.content;
    if (d.call) m.tool_calls.push_back(std::move(*d.call));
  }
  m.content = std::string(trim(m.content));
  m.reasoning = std::string(trim(m.reasoning));
  return m;
}

}  // namespace inferd
