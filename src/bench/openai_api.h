// The OpenAI wire format as a streaming benchmark client needs it: the body of
// a streamed completion or chat completion request, and what one streamed
// chunk says (new text, token usage, an error, the end).
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "bench/dataset.h"
#include "core/result.h"

namespace inferd::bench {

enum class ApiKind {
  kCompletions,      // /v1/completions: prompt (text or token ids), choices[0].text
  kChatCompletions,  // /v1/chat/completions: messages, choices[0].delta.content
};

// Chat for an endpoint path ending in "chat/completions", else completions.
ApiKind api_kind_of_endpoint(std::string_view endpoint);

struct RequestOptions {
  std::string model;
  bool ignore_eos = false;   // a vLLM / llama.cpp extension: generate exactly max_tokens
  double temperature = 0.0;
  std::optional<int64_t> seed;
  nlohmann::json extra_body = nlohmann::json::object();  // merged in last, overriding
};

// A streamed request with usage reported in the final chunk. Fails when the
// prompt's kind does not suit the endpoint (token ids or text for
// completions, a conversation for chat).
Result<nlohmann::json> make_request_body(ApiKind kind, const SampleRequest& request,
                                         const RequestOptions& options);

struct TokenUsage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  // prompt_tokens_details.cached_tokens: prompt tokens served from a cache
};

struct StreamChunk {
  bool done = false;         // the `data: [DONE]` sentinel
  std::string text;          // new output text (may be empty)
  bool has_choice = false;   // the chunk carried a choice (a usage-only chunk does not)
  std::optional<TokenUsage> usage;
  std::string finish_reason;  // "" until the last choice chunk
  std::string error;          // the server reported an error in the stream
};

// Interprets the data of one event. Fails on data that is neither "[DONE]"
// nor a JSON object.
Result<StreamChunk> parse_stream_chunk(ApiKind kind, std::string_view data);

}  // namespace inferd::bench
