// Chat templates: renders a conversation into a prompt with the model's Jinja
// template (tokenizer.chat_template), using minijinja (Rust) through a small C
// ABI, sandboxed with a step ("fuel") limit.
//
// Rendering follows Hugging Face transformers' apply_chat_template: trim_blocks
// and lstrip_blocks on, one trailing newline of the template dropped, undefined
// variables lenient as in Jinja2, Python string/dict methods (.strip(),
// .items(), ...), raise_exception(), strftime_now(), tojson as json.dumps, and
// the {% generation %} tag. No file access: {% include %} and friends fail.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace inferd {

struct ChatMessage {
  std::string role;
  std::string content;
  // An assistant's tool calls: the text of a JSON array of OpenAI's
  // {"id", "type": "function", "function": {"name", "arguments"}} objects, as
  // templates expect them (`arguments` an object where the client's string
  // parsed as one); empty: the message has none.
  std::string tool_calls_json = {};
  std::string tool_call_id = {};  // role "tool": the call it answers; empty: none
  // An assistant's earlier thinking (the request's `reasoning_content`), given
  // to the template as `reasoning_content` (Qwen3's templates read it) and as
  // `thinking` (gpt-oss's reads that, as llama-server passes it); empty: none.
  std::string reasoning_content = {};
};

// Bounds on one render, so a hostile or broken template errors out instead of
// hanging or eating memory.
struct ChatTemplateLimits {
  // Template engine instructions ("fuel") one render may execute: `fuel` plus
  // `fuel_per_message` for each message. Chat templates spend tens to a few
  // hundred instructions per message (SmolLM2's: 23); a template stuck in a
  // loop burns the base budget in well under a second (about 20 million
  // instructions per second on a busy core).
  uint64_t fuel = 2'000'000;
  uint64_t fuel_per_message = 10'000;
  uint64_t max_output_bytes = uint64_t{64} << 20;
};

struct ChatTemplateOptions {
  bool add_generation_prompt = true;
  std::string bos_token;
  std::string eos_token;
  // The tools offered to the model (the Jinja variable `tools`): the text of a
  // JSON array of OpenAI's {"type": "function", "function": {...}} objects;
  // empty: the variable is left undefined.
  std::string tools_json;
  // Further template variables as the text of a JSON object, e.g.
  // {"tools": [...], "enable_thinking": false}; empty for none. Its keys are
  // set after the ones above, so they win on a clash.
  std::string extra_context_json;
  ChatTemplateLimits limits;
};

class ChatTemplate {
 public:
  explicit ChatTemplate(std::string source) : source_(std::move(source)) {}
  const std::string& source() const { return source_; }
  // Renders messages; template syntax errors, runtime errors, raise_exception()
  // and running out of fuel all come back as an Error.
  Result<std::string> render(const std::vector<ChatMessage>& messages,
                             const ChatTemplateOptions& options) const;
  // Renders with a complete context given as the text of a JSON object (for
  // messages richer than role + content: content parts, tool calls, ...).
  Result<std::string> render_json(std::string_view context_json,
                                  const ChatTemplateLimits& limits = {}) const;

 private:
  std::string source_;
};

// Reads a chat template given by the user: a raw Jinja file (.jinja, .txt,
// ...) or a Hugging Face tokenizer_config.json / chat_template.json whose
// "chat_template" is a string or a list of {"name", "template"} (the one named
// "default" is taken).
Result<std::string> read_chat_template_file(const std::string& path);

// Picks the template to use: a file given by the user wins over the model's
// own (the GGUF key tokenizer.chat_template, empty if the model has none).
Result<ChatTemplate> select_chat_template(const std::string& gguf_chat_template,
                                          const std::string& user_template_path);

}  // namespace inferd
