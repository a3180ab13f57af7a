#include "chat/chat_prompt.h"

#include <nlohmann/json.hpp>

#include <string_view>

namespace inferd {

namespace {

// Placeholder k is U+E000, k in decimal, U+E001: private-use characters have
// no case and are not whitespace, so trim(), upper() and the like leave them
// (and the digits) as they are.
constexpr std::string_view kOpen = "\xEE\x80\x80";
constexpr std::string_view kClose = "\xEE\x80\x81";

std::string placeholder(size_t k) {
  std::string p(kOpen);
  p += std::to_string(k);
  p += kClose;
  return p;
}

// Puts the original text back in place of each placeholder of `marked` and
// notes where it went (left to right, so the spans come out sorted).
void restore(std::string_view marked, const std::vector<std::string>& originals, ChatPrompt& out) {
  out.text.reserve(marked.size());
  size_t pos = 0;
  while (pos < marked.size()) {
    const size_t open = marked.find(kOpen, pos);
    if (open == std::string_view::npos) break;
    const size_t first_digit = open + kOpen.size();
    size_t end = first_digit;
    size_t k = 0;
    while (end < marked.size() && end - first_digit < 18 && marked[end] >= '0' && marked[end] <= '9')
      k = k * 10 + static_cast<size_t>(marked[end++] - '0');
    if (end == first_digit || k >= originals.size() || marked.substr(end, kClose.size()) != kClose) {
      // Not one of ours: copied as it is (the second rendering then disagrees).
      out.text.append(marked, pos, open + kOpen.size() - pos);
      pos = open + kOpen.size();
      continue;
    }
    out.text.append(marked, pos, open - pos);
    out.literal.push_back(TextSpan{out.text.size(), originals[k].size()});
    out.text += originals[k];
    pos = end + kClose.size();
  }
  out.text.append(marked, pos, std::string_view::npos);
}

// Swaps the special-token text of strings for placeholders, noting the
// originals; `changed` is set when anything was swapped.
class Escaper {
 public:
  explicit Escaper(const Tokenizer& tok) : tok_(tok) {}

  std::string text(const std::string& s) {
    const std::vector<TextSpan> spans = tok_.find_special(s);
    if (spans.empty()) return s;
    std::string e;
    size_t pos = 0;
    for (const TextSpan& sp : spans) {
      e.append(s, pos, sp.offset - pos);
      e += placeholder(originals.size());
      originals.emplace_back(s, sp.offset, sp.length);
      pos = sp.offset + sp.length;
    }
    e.append(s, pos, std::string::npos);
    return e;
  }

  // Every string and key of a JSON value's text (object key order kept).
  std::string json_text(const std::string& text) {
    if (text.empty()) return text;
    const size_t before = originals.size();
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return text;
    j = walk(j);
    if (originals.size() == before) return text;
    return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  }

  std::vector<std::string> originals;

 private:
  nlohmann::ordered_json walk(const nlohmann::ordered_json& v) {
    if (v.is_string()) return text(v.get<std::string>());
    if (v.is_array()) {
      nlohmann::ordered_json out = nlohmann::ordered_json::array();
      for (const auto& item : v) out.push_back(walk(item));
      return out;
    }
    if (v.is_object()) {
      nlohmann::ordered_json out = nlohmann::ordered_json::object();
      for (auto it = v.begin(); it != v.end(); ++it) out[text(it.key())] = walk(it.value());
      return out;
    }
    return v;
  }

  const Tokenizer& tok_;
};

}  // namespace

Result<ChatPrompt> render_chat_prompt(const ChatTemplate& tmpl, const Tokenizer& tok,
                                      const std::vector<ChatMessage>& messages, const ChatPromptOptions& options) {
  ChatTemplateOptions topts;
  topts.add_generation_prompt = options.add_generation_prompt;
  if (tok.bos_id() >= 0) topts.bos_token = tok.token_text(tok.bos_id());
  if (tok.eos_id() >= 0) topts.eos_token = tok.token_text(tok.eos_id());
  topts.extra_context_json = options.extra_context_json;
  topts.tools_json = options.tools_json;

  Result<std::string> text = tmpl.render(messages, topts);
  if (!text) return make_error("the chat template refused these messages: " + text.error().message);

  // The messages (and tools) with their special-token text swapped for placeholders.
  std::vector<ChatMessage> escaped;
  ChatTemplateOptions escaped_opts = topts;
  Escaper esc(tok);
  if (!options.special_tokens_in_content) {
    escaped = messages;
    for (ChatMessage& m : escaped) {
      m.content = esc.text(m.content);
      m.tool_call_id = esc.text(m.tool_call_id);
      m.reasoning_content = esc.text(m.reasoning_content);
      m.tool_calls_json = esc.json_text(m.tool_calls_json);
    }
    escaped_opts.tools_json = esc.json_text(topts.tools_json);
  }
  const std::vector<std::string>& originals = esc.originals;

  ChatPrompt out;
  if (originals.empty()) {
    out.text = std::move(*text);
  } else {
    Result<std::string> marked = tmpl.render(escaped, escaped_opts);
    if (marked) restore(*marked, originals, out);
    if (!marked || out.text != *text)
      return make_error("a message holds special-token text (such as '" + originals.front() +
                        "') that this chat template alters, so it cannot be kept apart from the template's "
                        "own tokens; remove it from the message");
  }
  // A template that writes the BOS token itself must not get a second one.
  out.add_special = topts.bos_token.empty() || out.text.rfind(topts.bos_token, 0) != 0;
  return out;
}

std::vector<int32_t> tokenize_chat_prompt(const Tokenizer& tok, const ChatPrompt& prompt) {
  return tok.encode_with_literals(prompt.text, prompt.add_special, prompt.literal);
}

}  // namespace inferd
