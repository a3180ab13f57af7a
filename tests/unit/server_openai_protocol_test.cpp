// Request parsing and validation of the OpenAI API, and the metrics text,
// without a model. (The same cases through the real server: tests/e2e.)
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "server/metrics.h"
#include "server/openai_protocol.h"

namespace inferd::server {
namespace {

const ProtocolLimits kLimits;

GenerationRequest completion_ok(const std::string& body) {
  auto r = parse_completion_request(body, kLimits);
  if (auto* e = std::get_if<ApiError>(&r)) ADD_FAILURE() << body << " -> " << e->message;
  return std::get<GenerationRequest>(r);
}

ApiError completion_error(const std::string& body) {
  auto r = parse_completion_request(body, kLimits);
  EXPECT_TRUE(std::holds_alternative<ApiError>(r)) << body;
  return std::holds_alternative<ApiError>(r) ? std::get<ApiError>(r) : ApiError{};
}

ApiError chat_error(const std::string& body) {
  auto r = parse_chat_request(body, kLimits);
  EXPECT_TRUE(std::holds_alternative<ApiError>(r)) << body;
  return std::holds_alternative<ApiError>(r) ? std::get<ApiError>(r) : ApiError{};
}

TEST(OpenAIProtocol, CompletionDefaultsAndFields) {
  GenerationRequest r = completion_ok(R"({"prompt": "hi"})");
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0].text, "hi");
  EXPECT_FALSE(r.max_tokens.has_value());
  EXPECT_EQ(r.n, 1);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 1.0f);
  EXPECT_EQ(r.logprobs, -1);
  EXPECT_TRUE(r.skip_special_tokens);

  r = completion_ok(R"({"prompt": [1, 2, 3], "max_tokens": 16.0, "temperature": 0, "top_p": 0.5, "top_k": 5,
      "min_p": 0.1, "seed": 7, "stop": "x", "n": 2, "stream": true, "stream_options": {"include_usage": true},
      "logprobs": 2, "ignore_eos": true, "repetition_penalty": 1.1, "stop_token_ids": [4],
      "skip_special_tokens": false})");
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_TRUE(r.prompts[0].is_tokens);
  EXPECT_EQ(r.prompts[0].token_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(*r.max_tokens, 16);
  EXPECT_EQ(r.sampling.top_k, 5);
  EXPECT_EQ(*r.sampling.seed, 7u);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"x"}));
  EXPECT_EQ(r.n, 2);
  EXPECT_TRUE(r.stream && r.include_usage && r.ignore_eos);
  EXPECT_EQ(r.logprobs, 2);
  EXPECT_EQ(r.stop_token_ids, (std::vector<int32_t>{4}));
  EXPECT_FALSE(r.skip_special_tokens);

  r = completion_ok(R"({"prompt": ["a", [5, 6]], "max_tokens": null})");
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_FALSE(r.prompts[0].is_tokens);
  EXPECT_TRUE(r.prompts[1].is_tokens);
}

TEST(OpenAIProtocol, CompletionErrorsNameTheField) {
  EXPECT_EQ(completion_error(R"({"prompt": "x", "max_tokens": -1})").param, "max_tokens");
  EXPECT_EQ(completion_error(R"({"prompt": "x", "max_tokens": "ten"})").param, "max_tokens");
  EXPECT_EQ(completion_error(R"({"prompt": "x", "max_tokens": 1.5})").param, "max_tokens");
  EXPECT_EQ(completion_error(R"({"prompt": "x", "top_p": 0})").param, "top_p");
  EXPECT_EQ(completion_error(R"({"prompt": "x", "top_p": 1.5})").param, "top_p");
  EXPECT_EQ(completion_error(R"({"prompt": "x", "temperature": 3})").param, "temperature");
  EXPECT_EQ(completion_error(R"({"prompt": "x", "n": 17})").param, "n");
  EXPECT_EQ(completion_error(R"({"prompt": "x", "n": true})").param, "n");
  EXPECT_EQ(completion_error(R"({"prompt": "x", "logprobs": 21})").param, "logprobs");
  EXPECT_EQ(completion_error(R"({"prompt": "x", "stop": [1]})").param, "stop");
  EXPECT_EQ(completion_error(R"({"prompt": "x", "stream_options": {}})").param, "stream_options");
  EXPECT_EQ(completion_error(R"({"prompt": "x", "skip_special_tokens": "false"})").param, "skip_special_tokens");
  EXPECT_EQ(chat_error(R"({"messages": [{"role": "user", "content": "x"}], "skip_special_tokens": 0})").param,
            "skip_special_tokens");
  EXPECT_EQ(completion_error(R"({"prompt": [1, -1]})").param, "prompt");
  EXPECT_EQ(completion_error(R"({"prompt": ""})").param, "prompt");
  EXPECT_EQ(completion_error(R"({"max_tokens": 3})").param, "prompt");
  EXPECT_EQ(completion_error(R"({"prompt": "x", "max_tokens": 99999999999999999999})").param, "max_tokens");
  for (const ApiError& e : {completion_error("{"), completion_error("[]"), completion_error(""),
                            completion_error("{\"prompt\": \"\xff\"}")}) {
    EXPECT_EQ(e.status, 400);
    EXPECT_FALSE(e.message.empty());
  }
  EXPECT_NE(completion_error("{\"prompt\": \"\xc3\x28\"}").message.find("UTF-8"), std::string::npos);
  // A number past a double's range is a 400 naming the problem (the parser throws out_of_range).
  for (const ApiError& e : {completion_error(R"({"prompt": "x", "temperature": 1e999})"),
                            chat_error(R"({"messages": [{"role": "user", "content": "x"}], "top_p": -1e400})")}) {
    EXPECT_EQ(e.status, 400);
    EXPECT_NE(e.message.find("outside the range of a double"), std::string::npos) << e.message;
  }
}

TEST(OpenAIProtocol, BeamSearchFieldsAndWhatTheyCannotBeCombinedWith) {
  GenerationRequest r = completion_ok(R"({"prompt": "x"})");
  EXPECT_FALSE(r.use_beam_search);
  EXPECT_FLOAT_EQ(r.length_penalty, 1.0f);
  EXPECT_EQ(r.early_stopping, EarlyStopping::kFalse);
  r = completion_ok(R"({"prompt": "x", "use_beam_search": true, "n": 4, "length_penalty": 0.5,
      "early_stopping": "never", "best_of": 4})");
  EXPECT_TRUE(r.use_beam_search);
  EXPECT_EQ(r.n, 4);
  EXPECT_FLOAT_EQ(r.length_penalty, 0.5f);
  EXPECT_EQ(r.early_stopping, EarlyStopping::kNever);
  EXPECT_EQ(completion_ok(R"({"prompt": "x", "use_beam_search": true, "early_stopping": true})").early_stopping,
            EarlyStopping::kTrue);
  // Sampling parameters are accepted and unused, as vLLM's beam search does.
  EXPECT_TRUE(completion_ok(R"({"prompt": "x", "use_beam_search": true, "temperature": 0.7, "top_p": 0.9})")
                  .use_beam_search);

  EXPECT_EQ(completion_error(R"({"prompt": "x", "use_beam_search": 1})").param, "use_beam_search");
  EXPECT_EQ(completion_error(R"({"prompt": "x", "use_beam_search": true, "early_stopping": "always"})").param,
            "early_stopping");
  EXPECT_EQ(completion_error(R"({"prompt": "x", "use_beam_search": true, "length_penalty": "1"})").param,
            "length_penalty");
  EXPECT_EQ(completion_error(R"({"prompt": "x", "use_beam_search": true, "length_penalty": 1e300})").param,
            "length_penalty");
  // Only with beam search (vLLM v0 refused them without).
  EXPECT_EQ(completion_error(R"({"prompt": "x", "length_penalty": 2})").param, "length_penalty");
  EXPECT_EQ(completion_error(R"({"prompt": "x", "early_stopping": "never"})").param, "early_stopping");
  EXPECT_TRUE(completion_ok(R"({"prompt": "x", "length_penalty": 1.0, "early_stopping": false})").n == 1);
  // What beam search cannot do.
  EXPECT_EQ(completion_error(R"({"prompt": "x", "use_beam_search": true, "stream": true})").param, "stream");
  EXPECT_EQ(completion_error(R"({"prompt": "x", "use_beam_search": true, "logprobs": 1})").param, "logprobs");
  EXPECT_EQ(completion_error(R"({"prompt": "x", "use_beam_search": true, "guided_choice": ["a", "b"]})").param,
            "guided_choice");
  EXPECT_EQ(chat_error(R"({"messages": [{"role": "user", "content": "x"}], "use_beam_search": true,
      "logprobs": true})").param, "logprobs");
  EXPECT_EQ(chat_error(R"({"messages": [{"role": "user", "content": "x"}], "use_beam_search": true,
      "response_format": {"type": "json_object"}})").param, "response_format");
  EXPECT_EQ(chat_error(R"({"messages": [{"role": "user", "content": "x"}], "use_beam_search": true,
      "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required"})").param,
            "tool_choice");
  auto chat = parse_chat_request(R"({"messages": [{"role": "user", "content": "x"}], "use_beam_search": true,
      "n": 2, "tools": [{"type": "function", "function": {"name": "f"}}]})", kLimits);
  ASSERT_TRUE(std::holds_alternative<GenerationRequest>(chat));  // tool_choice auto: parsed from each beam
}

TEST(OpenAIProtocol, EchoAndPromptLogprobsScoreThePrompt) {
  GenerationRequest r = completion_ok(R"({"prompt": "x", "echo": true, "logprobs": 3, "max_tokens": 0})");
  EXPECT_TRUE(r.echo);
  EXPECT_EQ(r.logprobs, 3);
  EXPECT_EQ(r.max_tokens, 0);
  EXPECT_EQ(r.prompt_logprobs, -1);
  r = completion_ok(R"({"prompt": "x", "prompt_logprobs": 2, "max_tokens": 1})");
  EXPECT_FALSE(r.echo);
  EXPECT_EQ(r.prompt_logprobs, 2);
  EXPECT_EQ(completion_ok(R"({"prompt": "x", "prompt_logprobs": null})").prompt_logprobs, -1);
  auto chat = parse_chat_request(R"({"messages": [{"role": "user", "content": "x"}], "prompt_logprobs": 0})", kLimits);
  ASSERT_TRUE(std::holds_alternative<GenerationRequest>(chat));
  EXPECT_EQ(std::get<GenerationRequest>(chat).prompt_logprobs, 0);

  // max_tokens 0 generates nothing: only echo makes that an answer.
  ApiError e = completion_error(R"({"prompt": "x", "max_tokens": 0})");
  EXPECT_EQ(e.param, "max_tokens");
  EXPECT_NE(e.message.find("echo"), std::string::npos) << e.message;
  EXPECT_EQ(completion_error(R"({"prompt": "x", "echo": true, "max_tokens": -1})").param, "max_tokens");
  EXPECT_EQ(completion_error(R"({"prompt": "x", "echo": true, "stream": true})").param, "echo");
  EXPECT_EQ(completion_error(R"({"prompt": "x", "echo": 1})").param, "echo");
  EXPECT_EQ(completion_error(R"({"prompt": "x", "echo": true, "logprobs": 21})").param, "logprobs");
  EXPECT_EQ(completion_error(R"({"prompt": "x", "prompt_logprobs": 21})").param, "prompt_logprobs");
  EXPECT_EQ(completion_error(R"({"prompt": "x", "prompt_logprobs": -1})").param, "prompt_logprobs");
  EXPECT_EQ(completion_error(R"({"prompt": "x", "prompt_logprobs": 1, "stream": true})").param, "prompt_logprobs");
  EXPECT_EQ(completion_error(R"({"prompt": "x", "use_beam_search": true, "echo": true})").param, "echo");
  EXPECT_EQ(completion_error(R"({"prompt": "x", "use_beam_search": true, "prompt_logprobs": 1})").param,
            "prompt_logprobs");
  EXPECT_EQ(chat_error(R"({"messages": [{"role": "user", "content": "x"}], "prompt_logprobs": 21})").param,
            "prompt_logprobs");
  EXPECT_EQ(chat_error(R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0})").param, "max_tokens");
}

TEST(OpenAIProtocol, ChatMessages) {
  auto r = parse_chat_request(R"({"messages": [{"role": "system", "content": "s"},
      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
      {"role": "assistant", "content": null}], "max_tokens": 5, "max_completion_tokens": 7,
      "logprobs": true, "top_logprobs": 3})",
                              kLimits);
  ASSERT_TRUE(std::holds_alternative<GenerationRequest>(r)) << std::get<ApiError>(r).message;
  const GenerationRequest& g = std::get<GenerationRequest>(r);
  ASSERT_EQ(g.messages.size(), 3u);
  EXPECT_EQ(g.messages[1].content, "ab");
  EXPECT_EQ(g.messages[2].content, "");
  EXPECT_EQ(*g.max_tokens, 7);
  EXPECT_EQ(g.logprobs, 3);

  EXPECT_EQ(chat_error(R"({"messages": []})").param, "messages");
  EXPECT_NE(chat_error(R"({"messages": [{"role": "wizard", "content": "x"}]})").message.find("wizard"),
            std::string::npos);
  EXPECT_EQ(chat_error(R"({"messages": [{"role": "user"}]})").param, "messages");
  EXPECT_EQ(chat_error(R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})").param,
            "messages");
  EXPECT_EQ(chat_error(R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})").param,
            "top_logprobs");
}

TEST(OpenAIProtocol, ContextLengthMessageUsesVllmWords) {
  ApiError e = context_length_error(2048, 2000, 100);
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.message.rfind("This model's maximum context length is 2048 tokens. However, you requested 2100 "
                            "tokens (2000 in the messages, 100 in the completion).",
                            0),
            0u);
  EXPECT_NE(context_length_error(2048, 3000, std::nullopt).message.find("3000 input tokens"), std::string::npos);
}

TEST(OpenAIProtocol, ContextLengthByBytesSaysAtLeast) {
  // Refused before tokenizing: the same words, with a lower bound.
  ApiError e = context_length_error_by_bytes(2048, 98766, 16000000, std::nullopt);
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, "messages");
  EXPECT_EQ(e.message, "This model's maximum context length is 2048 tokens. However, your request has at least "
                       "98766 input tokens (the prompt is 16000000 bytes long). Please reduce the length of the "
                       "input messages.");
  // The prompt fits alone but not with max_tokens.
  ApiError m = context_length_error_by_bytes(2048, 2000, 300000, 100);
  EXPECT_EQ(m.param, "max_tokens");
  EXPECT_EQ(m.message.rfind("This model's maximum context length is 2048 tokens. However, you requested at least "
                            "2100 tokens (at least 2000 in the messages (the prompt is 300000 bytes long), 100 in "
                            "the completion).",
                            0),
            0u);
  // A prompt over the context alone is reported as such, max_tokens or not.
  EXPECT_EQ(context_length_error_by_bytes(2048, 5000, 900000, 10).param, "messages");
}

TEST(OpenAIProtocol, ErrorJsonShape) {
  auto j = nlohmann::json::parse(error_json(bad_request("bad \xff thing", "n")));
  EXPECT_EQ(j["error"]["param"], "n");
  EXPECT_TRUE(j["error"]["code"].is_null());
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_TRUE(j["error"]["message"].is_string());
}

TEST(ServingMetrics, HistogramIsCumulative) {
  Histogram h({0.1, 1.0});
  h.observe(0.05);
  h.observe(0.5);
  h.observe(5.0);
  std::string out;
  h.render(out, "m", "a=\"b\"");
  EXPECT_NE(out.find("m_bucket{a=\"b\",le=\"0.10000000000000001\"} 1\n"), std::string::npos) << out;
  EXPECT_NE(out.find("m_bucket{a=\"b\",le=\"1\"} 2\n"), std::string::npos) << out;
  EXPECT_NE(out.find("m_bucket{a=\"b\",le=\"+Inf\"} 3\n"), std::string::npos) << out;
  EXPECT_NE(out.find("m_count{a=\"b\"} 3\n"), std::string::npos) << out;
  EXPECT_EQ(escape_label_value("a\"b\\c\n"), "a\\\"b\\\\c\\n");
}

TEST(ServingMetrics, TheKVCapacityGaugeCarriesTheDType) {
  ServingMetrics metrics("tiny");
  EngineStats stats;
  stats.kv_cache_dtype = DType::Q8_0;
  stats.kv_capacity_tokens = 30112;
  const std::string out = metrics.render(stats, 0, nullptr);
  EXPECT_NE(out.find("# TYPE inferd:kv_cache_capacity_tokens gauge\n"), std::string::npos) << out;
  EXPECT_NE(out.find("inferd:kv_cache_capacity_tokens{model_name=\"tiny\",kv_cache_dtype=\"q8_0\"} 30112\n"),
            std::string::npos)
      << out;
  stats.kv_cache_dtype = DType::F16;
  EXPECT_NE(metrics.render(stats, 0, nullptr).find("kv_cache_dtype=\"f16\"}"), std::string::npos);
}

TEST(ServingMetrics, AHybridModelsStateSlotsAreGaugesOfTheirOwn) {
  ServingMetrics metrics("tiny");
  EngineStats stats;
  EXPECT_EQ(metrics.render(stats, 0, nullptr).find("recurrent_state"), std::string::npos);  // none without slots
  stats.kv_state_slots = 8;
  stats.kv_state_bytes = 9 * 58368;
  const std::string out = metrics.render(stats, 0, nullptr);
  EXPECT_NE(out.find("# TYPE inferd:recurrent_state_slots gauge\n"), std::string::npos) << out;
  EXPECT_NE(out.find("inferd:recurrent_state_slots{model_name=\"tiny\"} 8\n"), std::string::npos) << out;
  EXPECT_NE(out.find("inferd:recurrent_state_bytes{model_name=\"tiny\"} 525312\n"), std::string::npos) << out;
}

}  // namespace
}  // namespace inferd::server
