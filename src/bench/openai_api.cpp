#include "bench/openai_api.h"

namespace inferd::bench {

ApiKind api_kind_of_endpoint(std::string_view endpoint) {
  while (endpoint.ends_with('/')) endpoint.remove_suffix(1);
  return endpoint.ends_with("chat/completions") ? ApiKind::kChatCompletions : ApiKind::kCompletions;
}

Result<nlohmann::json> make_request_body(ApiKind kind, const SampleRequest& request,
                                         const RequestOptions& options) {
  nlohmann::json body;
  body["model"] = options.model;
  if (kind == ApiKind::kChatCompletions) {
    const auto* chat = std::get_if<ChatMessages>(&request.prompt);
    if (!chat) return make_error("the chat endpoint needs conversations (a JSONL dataset)");
    body["messages"] = chat->messages;
    // Both names: older servers know only max_tokens, newer OpenAI models only max_completion_tokens.
    body["max_completion_tokens"] = request.expected_output_len;
  } else {
    if (const auto* text = std::get_if<std::string>(&request.prompt)) body["prompt"] = *text;
    else if (const auto* ids = std::get_if<std::vector<int32_t>>(&request.prompt)) body["prompt"] = *ids;
    else return make_error("the completions endpoint needs a prompt, not a conversation");
  }
  body["max_tokens"] = request.expected_output_len;
  body["temperature"] = options.temperature;
  if (options.seed) body["seed"] = *options.seed;
  if (options.ignore_eos) body["ignore_eos"] = true;
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  if (options.extra_body.is_object()) body.update(options.extra_body);
  return body;
}

namespace {

std::string error_message(const nlohmann::json& e) {
  if (e.is_string()) return e.get<std::string>();
  if (e.is_object() && e.contains("message") && e["message"].is_string()) return e["message"];
  return e.dump();
}

}  // namespace

Result<StreamChunk> parse_stream_chunk(ApiKind kind, std::string_view data) {
  StreamChunk chunk;
  // Servers put no whitespace around the sentinel, but nothing forbids it.
  while (!data.empty() && (data.back() == ' ' || data.back() == '\t')) data.remove_suffix(1);
  while (!data.empty() && (data.front() == ' ' || data.front() == '\t')) data.remove_prefix(1);
  if (data == "[DONE]") {
    chunk.done = true;
    return chunk;
  }
  const nlohmann::json j = nlohmann::json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    constexpr size_t kShown = 120;
    return make_error("stream chunk is not a JSON object: " +
                      std::string(data.substr(0, kShown)) + (data.size() > kShown ? "..." : ""));
  }
  if (j.contains("error") && !j["error"].is_null()) {
    chunk.error = error_message(j["error"]);
    return chunk;
  }
  if (j.contains("choices") && j["choices"].is_array() && !j["choices"].empty()) {
    const nlohmann::json& choice = j["choices"][0];
    chunk.has_choice = true;
    if (kind == ApiKind::kChatCompletions) {
      if (choice.contains("delta") && choice["delta"].is_object()) {
        const nlohmann::json& delta = choice["delta"];
        if (delta.contains("content") && delta["content"].is_string()) chunk.text = delta["content"];
        // Reasoning models stream their thinking separately; it is output all the same.
        else if (delta.contains("reasoning_content") && delta["reasoning_content"].is_string())
          chunk.text = delta["reasoning_content"];
      }
    } else if (choice.contains("text") && choice["text"].is_string()) {
      chunk.text = choice["text"];
    }
    if (choice.contains("finish_reason") && choice["finish_reason"].is_string())
      chunk.finish_reason = choice["finish_reason"];
  }
  if (j.contains("usage") && j["usage"].is_object()) {
    const nlohmann::json& u = j["usage"];
    TokenUsage usage;
    if (u.contains("prompt_tokens") && u["prompt_tokens"].is_number_integer())
      usage.prompt_tokens = u["prompt_tokens"];
    if (u.contains("completion_tokens") && u["completion_tokens"].is_number_integer())
      usage.completion_tokens = u["completion_tokens"];
    if (u.contains("prompt_tokens_details") && u["prompt_tokens_details"].is_object()) {
      const nlohmann::json& d = u["prompt_tokens_details"];
      if (d.contains("cached_tokens") && d["cached_tokens"].is_number_integer())
        usage.cached_tokens = d["cached_tokens"];
    }
    chunk.usage = usage;
  }
  return chunk;
}

}  // namespace inferd::bench
