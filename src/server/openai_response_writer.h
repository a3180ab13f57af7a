// The JSON of Chat Completions and Completions responses and stream chunks:
// the two APIs share their choices, usage and logprobs, and differ in the
// object names, `message`/`delta` against `text`, and the logprobs' shape.
// Built outside the coroutines: GCC 12 mishandles brace-initialised JSON
// temporaries in a coroutine frame.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "chat/tool_calls.h"
#include "server/serving_core.h"
#include "tokenizer/tokenizer.h"

namespace inferd::server {

class ResponseWriter {
 public:
  using json = nlohmann::json;
  ResponseWriter(const Tokenizer& tok, bool chat, bool include_usage, std::string id, std::string model)
      : tok_(tok), chat_(chat), include_usage_(include_usage), id_(std::move(id)), model_(std::move(model)),
        created_(unix_now()) {}

  // Whole responses that score the prompt: the alternatives asked for by
  // `logprobs` (echo's prompt tokens) and `prompt_logprobs` (-1: none).
  void set_prompt_scores(int32_t echo_top, int32_t prompt_logprobs) {
    echo_top_ = echo_top;
    prompt_logprobs_ = prompt_logprobs;
  }

  // completions with echo: the prompt's tokens in the `logprobs` object (the
  // first with a null logprob, as OpenAI and vLLM give it), then the
  // completion's, text offsets running on from the prompt's.
  json echo_logprobs(Choice& c) const;
  // vLLM's `prompt_logprobs`: null for the first token, then per token
  // {token id: {logprob, rank, decoded_token}}: the prompt's token and the
  // most likely ones.
  json vllm_prompt_logprobs(const Choice& c) const;
  json logprobs(Choice& c, const std::vector<SampledLogprobs>& lps) const;
  // The SSE event for one engine output of a choice; "" when there is nothing to say.
  std::string chunk(Choice& c, const RequestOutput& out, bool want_logprobs) const;
  // Chat with reasoning: a delta of thinking (with the logprobs of its
  // tokens); "" when there is nothing to say.
  std::string reasoning_chunk(Choice& c, const std::string& text, const std::vector<SampledLogprobs>& lps,
                              bool want_logprobs) const;
  // Chat with tool parsing: the SSE events for what the parser made of one
  // engine output. Content as usual (whitespace alone is held back until
  // more text follows, and dropped after calls); each call as OpenAI streams
  // it, its id, type and name first, then its arguments; finish_reason
  // "tool_calls" once there was a call.
  std::string tool_events(Choice& c, const std::vector<ToolCallDelta>& deltas, const RequestOutput& out,
                          bool want_logprobs) const;
  // The stream's last chunk before [DONE] (stream_options.include_usage).
  std::string usage_chunk(const json& usage) const;
  std::string error_event(const std::string& message) const;
  // The whole response; kv_transfer_params null: none.
  std::string body(std::vector<Choice>& choices, bool want_logprobs, const json& usage,
                   const json& kv_transfer_params = nullptr) const;
  // Usage of the choices: each prompt counted once (its cached tokens too).
  static json usage(const std::vector<std::vector<int32_t>>& prompts, const std::vector<Choice>& choices, int32_t n);

 private:
  json base() const;

  const Tokenizer& tok_;
  const bool chat_, include_usage_;
  const std::string id_, model_;
  const int64_t created_;
  int32_t echo_top_ = 0, prompt_logprobs_ = -1;
};

// The output of a Chat Completions or Completions generation: chunks of
// choices while streaming (usage and [DONE] at the end), the response with
// its choices when whole. Chat's parsers (tools, reasoning, harmony) stream
// through ChatOutput (serving_chat.cpp).
class ChoicesOutput : public GenerationOutput {
 public:
  ChoicesOutput(const ServingCore& core, const PreparedGeneration& pg, bool chat, const std::string& api_id);
  std::string stream_output(Choice& c, const RequestOutput& out) override;
  std::string stream_error(const std::string& message) override;
  std::string stream_tail(std::vector<Choice>& choices) override;
  std::string body(std::vector<Choice>& choices) override;

 protected:
  const ServingCore& core_;
  const PreparedGeneration& pg_;
  const std::string api_id_;
  ResponseWriter writer_;
  const bool want_logprobs_;
};

}  // namespace inferd::server
