#include "chat/reasoning.h"

#include "chat/text_scan.h"

namespace inferd {

namespace {

using text_scan::partial_marker_at_end;
using text_scan::skip_space;
using text_scan::trim_right;

}  // namespace

std::optional<ReasoningParser> reasoning_parser_from_name(std::string_view name) {
  if (name == "none") return ReasoningParser::kNone;
  if (name == "auto") return ReasoningParser::kAuto;
  if (name == "qwen3") return ReasoningParser::kQwen3;
  if (name == "deepseek_r1" || name == "deepseek") return ReasoningParser::kDeepSeekR1;
  if (name == "harmony" || name == "openai" || name == "openai_gptoss") return ReasoningParser::kHarmony;
  return std::nullopt;
}

const char* reasoning_parser_name(ReasoningParser p) {
  switch (p) {
    case ReasoningParser::kNone: return "none";
    case ReasoningParser::kAuto: return "auto";
    case ReasoningParser::kQwen3: return "qwen3";
    case ReasoningParser::kDeepSeekR1: return "deepseek_r1";
    case ReasoningParser::kHarmony: return "harmony";
  }
  return "none";
}

bool template_thinks(std::string_view template_source) {
  return template_source.find(kThinkEnd) != std::string_view::npos;
}

PromptThinking prompt_thinking(std::string_view prompt) {
  const std::string_view p = trim_right(prompt);
  if (p.ends_with(kThinkStart)) return PromptThinking::kOpen;
  if (p.ends_with(kThinkEnd)) return PromptThinking::kClosed;
  return PromptThinking::kNone;
}

ReasoningDelta ReasoningStreamParser::feed(std::string_view text) {
  ReasoningDelta out;
  buffer_.append(text);
  run(out, /*at_end=*/false);
  return out;
}

ReasoningDelta ReasoningStreamParser::finish() {
  ReasoningDelta out;
  run(out, /*at_end=*/true);
  buffer_.clear();
  return out;
}

void ReasoningStreamParser::run(ReasoningDelta& out, bool at_end) {
  auto emit_reasoning = [&](std::string_view r) {
    if (!reasoning_started_) {
      r.remove_prefix(skip_space(r));
      if (r.empty()) return;
      reasoning_started_ = true;
    }
    out.reasoning.append(r);
  };
  for (;;) {
    switch (state_) {
      case State::kStart: {
        // Leading whitespace, then either <think> (or a piece of it) or not.
        const size_t p = skip_space(buffer_);
        const std::string_view rest = std::string_view(buffer_).substr(p);
        if (rest.starts_with(kThinkStart)) {
          buffer_.erase(0, p + kThinkStart.size());
          state_ = State::kReasoning;
          continue;
        }
        if (!at_end && kThinkStart.starts_with(rest)) return;  // undecided (rest may be empty)
        if (starts_inside_) {
          state_ = State::kReasoning;
        } else {
          state_ = State::kContent;
          content_started_ = true;  // an output that does not think is returned as written
        }
        continue;
      }
      case State::kReasoning: {
        const size_t e = buffer_.find(kThinkEnd);
        if (e != std::string::npos) {
          emit_reasoning(trim_right(std::string_view(buffer_).substr(0, e)));
          buffer_.erase(0, e + kThinkEnd.size());
          state_ = State::kContent;
          continue;
        }
        if (at_end) {
          emit_reasoning(trim_right(buffer_));
          buffer_.clear();
          return;
        }
        // Hold back what may be the start of </think>, and trailing whitespace
        // (dropped if the thinking ends right after it).
        std::string_view ready(buffer_);
        ready.remove_suffix(partial_marker_at_end(ready, kThinkEnd));
        ready = trim_right(ready);
        const size_t n = ready.size();
        emit_reasoning(ready);
        buffer_.erase(0, n);
        return;
      }
      case State::kContent: {
        if (!content_started_) {
          const size_t p = skip_space(buffer_);
          buffer_.erase(0, p);
          if (buffer_.empty()) return;
          content_started_ = true;
        }
        out.content.append(buffer_);
        buffer_.clear();
        return;
      }
    }
  }
}

ReasoningDelta parse_reasoning(bool starts_inside, std::string_view output) {
  ReasoningStreamParser parser(starts_inside);
  ReasoningDelta out = parser.feed(output);
  ReasoningDelta tail = parser.finish();
  out.reasoning += tail.reasoning;
  out.content += tail.content;
  return out;
}

}  // namespace inferd
