// ChatTemplate: builds the JSON context, hands it to the Rust renderer through
// the C ABI in chat_template_ffi.h and turns its status into Result.
#include "chat/chat_template.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "chat/chat_template_ffi.h"

namespace inferd {
namespace {

// ordered_json keeps keys in insertion order, like the Python dicts HF passes
// to Jinja, so `message|tojson` and `.items()` see role before content.
using Json = nlohmann::ordered_json;

// Files larger than this are certainly not chat templates.
constexpr std::streamoff kMaxTemplateFileBytes = 4 << 20;

// Owns a buffer returned by inferd_chat_render.
struct RustBuffer {
  uint8_t* ptr = nullptr;
  size_t len = 0;
  RustBuffer() = default;
  RustBuffer(const RustBuffer&) = delete;
  RustBuffer& operator=(const RustBuffer&) = delete;
  ~RustBuffer() { inferd_chat_free(ptr, len); }
  std::string str() const { return ptr ? std::string(reinterpret_cast<const char*>(ptr), len) : ""; }
};

Result<std::string> render_with(const std::string& source, std::string_view context_json,
                                const ChatTemplateLimits& limits) {
  const inferd_chat_limits c_limits{limits.fuel, limits.fuel_per_message, limits.max_output_bytes};
  RustBuffer out;
  const int32_t status = inferd_chat_render(
      reinterpret_cast<const uint8_t*>(source.data()), source.size(),
      reinterpret_cast<const uint8_t*>(context_json.data()), context_json.size(), &c_limits,
      &out.ptr, &out.len);
  switch (status) {
    case INFERD_CHAT_OK:
      return out.str();
    case INFERD_CHAT_TEMPLATE_ERROR:
      return make_error("chat template error: " + out.str());
    case INFERD_CHAT_RAISED_EXCEPTION:
      return make_error("chat template raised an exception: " + out.str());
    case INFERD_CHAT_OUT_OF_FUEL:
      return make_error("chat template ran out of fuel: " + out.str());
    case INFERD_CHAT_OUTPUT_TOO_LARGE:
      return make_error("chat template output too large: " + out.str());
    case INFERD_CHAT_BAD_INPUT:
      return make_error("chat template input rejected: " + out.str());
    default:
      return make_error("chat template renderer failed: " + out.str());
  }
}

}  // namespace

Result<std::string> ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                         const ChatTemplateOptions& options) const {
  Json context = Json::object();
  Json& list = context["messages"] = Json::array();
  for (const ChatMessage& m : messages) {
    Json message = Json{{"role", m.role}, {"content", m.content}};
    if (!m.tool_calls_json.empty()) {
      Json calls = Json::parse(m.tool_calls_json, nullptr, /*allow_exceptions=*/false);
      if (calls.is_discarded() || !calls.is_array()) return make_error("chat template: tool_calls is not a JSON array");
      message["tool_calls"] = std::move(calls);
    }
    if (!m.tool_call_id.empty()) message["tool_call_id"] = m.tool_call_id;
    if (!m.reasoning_content.empty()) {
      message["reasoning_content"] = m.reasoning_content;
      message["thinking"] = m.reasoning_content;
    }
    list.push_back(std::move(message));
  }
  context["add_generation_prompt"] = options.add_generation_prompt;
  context["bos_token"] = options.bos_token;
  context["eos_token"] = options.eos_token;
  if (!options.tools_json.empty()) {
    Json tools = Json::parse(options.tools_json, nullptr, /*allow_exceptions=*/false);
    if (tools.is_discarded() || !tools.is_array()) return make_error("chat template: tools is not a JSON array");
    context["tools"] = std::move(tools);
  }
  if (!options.extra_context_json.empty()) {
    Json extra = Json::parse(options.extra_context_json, nullptr, /*allow_exceptions=*/false);
    if (extra.is_discarded() || !extra.is_object()) {
      return make_error("chat template: extra_context_json is not a JSON object");
    }
    for (auto& [key, value] : extra.items()) context[key] = std::move(value);
  }
  std::string context_text;
  try {
    context_text = context.dump();
  } catch (const Json::type_error&) {  // strict UTF-8 check of every string
    return make_error("chat template: a message or token is not valid UTF-8");
  }
  return render_with(source_, context_text, options.limits);
}

Result<std::string> ChatTemplate::render_json(std::string_view context_json,
                                              const ChatTemplateLimits& limits) const {
  return render_with(source_, context_json, limits);
}

Result<std::string> read_chat_template_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary | std::ios::ate);
  if (!file) return make_error("cannot open chat template file '" + path + "'");
  const std::streamoff size = file.tellg();
  if (size < 0 || size > kMaxTemplateFileBytes) {
    return make_error("chat template file '" + path + "' is too large");
  }
  file.seekg(0);
  std::string text(static_cast<size_t>(size), '\0');
  if (!file.read(text.data(), size)) return make_error("cannot read chat template file '" + path + "'");

  const bool is_json = path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0;
  if (!is_json) return text;

  // tokenizer_config.json or chat_template.json from a Hugging Face repo.
  Json config = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object()) {
    return make_error("chat template file '" + path + "' is not a JSON object");
  }
  auto it = config.find("chat_template");
  if (it == config.end()) return make_error("'" + path + "' has no \"chat_template\" key");
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    // Named templates: take "default", or the only one there is.
    const Json* only = it->size() == 1 ? &(*it)[0] : nullptr;
    for (const Json& entry : *it) {
      if (entry.is_object() && entry.value("name", "") == "default") only = &entry;
    }
    if (only && only->is_object() && only->contains("template") && (*only)["template"].is_string()) {
      return (*only)["template"].get<std::string>();
    }
    return make_error("'" + path + "' lists chat templates but none is named \"default\"");
  }
  return make_error("\"chat_template\" in '" + path + "' is neither a string nor a list");
}

Result<ChatTemplate> select_chat_template(const std::string& gguf_chat_template,
                                          const std::string& user_template_path) {
  if (!user_template_path.empty()) {
    Result<std::string> text = read_chat_template_file(user_template_path);
    if (!text) return text.error();
    return ChatTemplate(std::move(text.value()));
  }
  if (gguf_chat_template.empty()) {
    return make_error(
        "the model has no chat template (GGUF key tokenizer.chat_template); give one as a file");
  }
  return ChatTemplate(gguf_chat_template);
}

}  // namespace inferd
