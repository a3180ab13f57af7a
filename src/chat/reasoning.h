// Reasoning in a model's output: models that think before they answer (Qwen3,
// QwQ, DeepSeek-R1 and their distills) write the thinking between <think> and
// </think>; this splits it from the answer, whole or while streaming, so the
// server can return it as `reasoning_content` beside `content`.
//
// Two ways a thinking output begins (vLLM's --reasoning-parser names):
//   qwen3        the output itself opens the thinking with <think>; an output
//                that does not open it is all answer
//   deepseek_r1  the chat template already opened <think> in the prompt, so
//                the output starts inside the thinking (a repeated <think> at
//                its start is dropped)
//   harmony      gpt-oss: the thinking is the `analysis` channel's messages
//                (chat/harmony.h parses them, not this parser); vLLM's name
//                "openai_gptoss", and "openai" as for its tool-call parser
// The server also reads the rendered prompt: one that ends in an open <think>
// starts inside whatever the parser, and one that ends in a closed
// <think>...</think> (Qwen3's enable_thinking=false) has no thinking to split.
//
// An output whose thinking never closes (cut by max_tokens) is all reasoning.
// Whitespace around the thinking and at the start of the answer is dropped.
// Parsing the whole output and parsing it in pieces give the same result.
#pragma once
#include <optional>
#include <string>
#include <string_view>

namespace inferd {

inline constexpr std::string_view kThinkStart = "<think>";
inline constexpr std::string_view kThinkEnd = "</think>";

enum class ReasoningParser { kNone, kAuto, kQwen3, kDeepSeekR1, kHarmony };

// "none", "auto", "qwen3", "deepseek_r1", "openai_gptoss" (the server flag's
// names, vLLM's), llama-server's "deepseek" (= deepseek_r1), and "harmony" or
// "openai" (= openai_gptoss).
std::optional<ReasoningParser> reasoning_parser_from_name(std::string_view name);
const char* reasoning_parser_name(ReasoningParser p);

// The chat template writes thinking blocks: it mentions </think>.
bool template_thinks(std::string_view template_source);

// Where a rendered prompt leaves the thinking: the prompt ends (whitespace
// aside) in an open <think> (kOpen), in a closed </think> (kClosed), or
// neither (kNone).
enum class PromptThinking { kNone, kOpen, kClosed };
PromptThinking prompt_thinking(std::string_view prompt);

struct ReasoningDelta {
  std::string reasoning;
  std::string content;
};

class ReasoningStreamParser {
 public:
  // starts_inside: the output begins in the thinking (deepseek_r1, or a prompt
  // that opened it); else only an output that opens <think> thinks.
  explicit ReasoningStreamParser(bool starts_inside) : starts_inside_(starts_inside) {}
  // What the next piece of output adds. Text that may be part of a marker,
  // and whitespace that may end the thinking, are held back until known.
  ReasoningDelta feed(std::string_view text);
  // The end of the output: what was held back is released.
  ReasoningDelta finish();
  // The thinking has ended (or there was none): the rest is answer.
  bool in_content() const { return state_ == State::kContent; }

 private:
  enum class State { kStart, kReasoning, kContent };
  void run(ReasoningDelta& out, bool at_end);

  bool starts_inside_;
  State state_ = State::kStart;
  bool reasoning_started_ = false;  // non-whitespace reasoning seen (leading whitespace is dropped)
  bool content_started_ = false;    // non-whitespace content seen
  std::string buffer_;              // text not yet released
};

// The whole output at once.
ReasoningDelta parse_reasoning(bool starts_inside, std::string_view output);

}  // namespace inferd
