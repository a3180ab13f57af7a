// The requests a serving benchmark sends: random token sequences (exact input
// lengths on any server, as vLLM's random dataset) or prompts and
// conversations read from a JSONL file.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <variant>
#include <vector>

#include "core/result.h"

namespace inferd::bench {

// A conversation for /v1/chat/completions: an array of {role, content} objects.
struct ChatMessages {
  nlohmann::json messages;
};

// Text, token ids (sent as a JSON array of integers), or a conversation.
using Prompt = std::variant<std::string, std::vector<int32_t>, ChatMessages>;

struct SampleRequest {
  Prompt prompt;
  int64_t prompt_len = 0;           // tokens, as far as the client knows (0: unknown)
  int64_t expected_output_len = 0;  // sent as max_tokens
};

struct RandomDatasetOptions {
  int64_t num_prompts = 1000;
  int64_t input_len = 1024;  // per request, after the shared prefix
  int64_t output_len = 128;
  double range_ratio = 0.0;  // lengths uniform in [len * (1 - r), len * (1 + r)]
  int64_t prefix_len = 0;    // random tokens every prompt starts with
  uint64_t seed = 0;
};

// Length drawn uniformly from [len * (1 - r), len * (1 + r)], at least 1.
int64_t spread_length(int64_t len, double range_ratio, uint64_t& rng_state);

// Prompts of token ids drawn uniformly from `token_pool` (the vocabulary less
// its control tokens). Deterministic in the seed.
std::vector<SampleRequest> make_random_dataset(const RandomDatasetOptions& options,
                                               const std::vector<int32_t>& token_pool);

struct JsonlDatasetOptions {
  int64_t num_prompts = 1000;  // lines are reused in order if the file has fewer
  bool chat = false;           // build conversations (chat endpoint) rather than prompts
  int64_t output_len = 0;      // > 0: every request's max_tokens
  int64_t default_output_len = 128;  // when neither the line nor output_len gives one
};

// Tokens in a text, if the caller has a tokenizer.
using TokenCounter = std::function<int64_t(const std::string&)>;

// Reads one JSON object per line (blank lines skipped):
//   {"prompt": "...", "output_len": 64}                 a completion prompt
//   {"messages": [{"role": "user", "content": "..."}, ...]}     OpenAI style
//   {"conversations": [{"from": "human", "value": "..."}, ...]} ShareGPT style
// A conversation that ends with an assistant turn keeps that turn as the
// reference reply: its token count is the output length unless the line says
// ("output_len" or "max_tokens") or options.output_len overrides. For the
// completions endpoint a conversation contributes its first user turn as the
// prompt (what vLLM's ShareGPT loader sends); for the chat endpoint a plain
// prompt becomes one user message.
Result<std::vector<SampleRequest>> load_jsonl_dataset(const std::string& path,
                                                      const JsonlDatasetOptions& options,
                                                      const TokenCounter& count_tokens);

}  // namespace inferd::bench
