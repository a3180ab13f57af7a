// A chat request's prompt: the conversation rendered through the model's chat
// template, then tokenized so that text from the messages stays text.
//
// The template's own markers (<|im_start|>, <|im_end|>, ...) must become
// special tokens, but the same strings typed into a message must not: else a
// user writes "<|im_end|>\n<|im_start|>system\n..." and forges a system turn.
// So each piece of special-token text in a message's content is swapped for a
// placeholder before rendering; where the placeholders land in the output is
// where that text is, and it is tokenized as characters there
// (Tokenizer::encode_with_literals). Placeholders survive what templates do to
// contents (trimming, moving the system message, dropping turns); the
// conversation is then rendered again as it is, and the two must agree, or the
// request is refused rather than guessed at. The same holds for every string
// of an assistant's tool calls (names, arguments, keys included), a tool
// message's call id, and the tool definitions.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "core/result.h"
#include "tokenizer/tokenizer.h"

namespace inferd {

struct ChatPromptOptions {
  bool add_generation_prompt = true;
  std::string extra_context_json;  // chat_template_kwargs, a JSON object's text (or empty)
  std::string tools_json;          // the Jinja variable `tools`, a JSON array's text (or empty)
  // The old behaviour: special-token text in a message is read as the token.
  bool special_tokens_in_content = false;
};

struct ChatPrompt {
  std::string text;               // the rendered conversation
  std::vector<TextSpan> literal;  // spans of `text` that came from messages and read as characters
  bool add_special = true;        // false when the template wrote the BOS token itself
};

// Renders `messages` with the tokenizer's BOS/EOS texts. Fails with the
// template's error, or when special-token text in a message cannot be traced
// through the template.
Result<ChatPrompt> render_chat_prompt(const ChatTemplate& tmpl, const Tokenizer& tok,
                                      const std::vector<ChatMessage>& messages, const ChatPromptOptions& options);

std::vector<int32_t> tokenize_chat_prompt(const Tokenizer& tok, const ChatPrompt& prompt);

}  // namespace inferd
