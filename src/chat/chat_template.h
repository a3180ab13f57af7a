// Chat templates: renders a conversation into a prompt with the model's Jinja
// template (tokenizer.chat_template), using minijinja (Rust) through a small C
// ABI, sandboxed with a step ("fuel") limit.
#pragma once
#include <string>
#include <vector>

#include "core/result.h"

namespace inferd {

struct ChatMessage {
  std::string role;
  std::string content;
};

struct ChatTemplateOptions {
  bool add_generation_prompt = true;
  std::string bos_token;
  std::string eos_token;
};

class ChatTemplate {
 public:
  explicit ChatTemplate(std::string source) : source_(std::move(source)) {}
  const std::string& source() const { return source_; }
  // Renders messages; template syntax errors, runtime errors, raise_exception()
  // and running out of fuel all come back as an Error.
  Result<std::string> render(const std::vector<ChatMessage>& messages,
                             const ChatTemplateOptions& options) const;

 private:
  std::string source_;
};

}  // namespace inferd
