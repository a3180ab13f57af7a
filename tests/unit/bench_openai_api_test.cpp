// Request bodies and streamed chunks of the OpenAI completions and chat
// completions APIs, and base URLs, as the serving benchmark uses them.
#include <gtest/gtest.h>

#include "bench/base_url.h"
#include "bench/openai_api.h"

namespace inferd::bench {
namespace {

TEST(BenchOpenAi, EndpointKind) {
  EXPECT_EQ(api_kind_of_endpoint("/v1/completions"), ApiKind::kCompletions);
  EXPECT_EQ(api_kind_of_endpoint("/v1/chat/completions"), ApiKind::kChatCompletions);
  EXPECT_EQ(api_kind_of_endpoint("/v1/chat/completions/"), ApiKind::kChatCompletions);
}

TEST(BenchOpenAi, CompletionBodyWithTokenIds) {
  SampleRequest r;
  r.prompt = std::vector<int32_t>{5, 6, 7};
  r.expected_output_len = 8;
  RequestOptions o;
  o.model = std::string("m");
  o.ignore_eos = true;
  o.extra_body = {{"temperature", 0.5}, {"top_k", 1}};
  auto body = make_request_body(ApiKind::kCompletions, r, o);
  ASSERT_TRUE(body);
  const nlohmann::json& b = *body;
  EXPECT_EQ(b["model"], "m");
  EXPECT_EQ(b["prompt"], nlohmann::json({5, 6, 7}));
  EXPECT_EQ(b["max_tokens"], 8);
  EXPECT_EQ(b["stream"], true);
  EXPECT_EQ(b["stream_options"]["include_usage"], true);
  EXPECT_EQ(b["ignore_eos"], true);
  EXPECT_EQ(b["temperature"], 0.5);  // extra body wins
  EXPECT_EQ(b["top_k"], 1);
  EXPECT_FALSE(b.contains("seed"));
}

TEST(BenchOpenAi, ChatBodyNeedsAConversation) {
  SampleRequest text;
  text.prompt = std::string("hi");
  EXPECT_FALSE(make_request_body(ApiKind::kChatCompletions, text, {}));
  SampleRequest chat;
  chat.prompt = ChatMessages{nlohmann::json::array({{{"role", "user"}, {"content", "hi"}}})};
  chat.expected_output_len = 3;
  EXPECT_FALSE(make_request_body(ApiKind::kCompletions, chat, {}));
  auto body = make_request_body(ApiKind::kChatCompletions, chat, {});
  ASSERT_TRUE(body);
  EXPECT_EQ((*body)["messages"][0]["content"], "hi");
  EXPECT_EQ((*body)["max_completion_tokens"], 3);
  EXPECT_FALSE(body->contains("ignore_eos"));
}

TEST(BenchOpenAi, CompletionChunks) {
  auto text = parse_stream_chunk(ApiKind::kCompletions,
                                 R"({"choices":[{"text":" a","index":0,"finish_reason":null}]})");
  ASSERT_TRUE(text);
  EXPECT_TRUE(text->has_choice);
  EXPECT_EQ(text->text, " a");
  EXPECT_FALSE(text->usage);
  auto last = parse_stream_chunk(ApiKind::kCompletions,
                                 R"({"choices":[{"text":"","finish_reason":"length"}],)"
                                 R"("usage":{"prompt_tokens":5,"completion_tokens":4,"total_tokens":9,)"
                                 R"("prompt_tokens_details":{"cached_tokens":3}}})");
  ASSERT_TRUE(last);
  EXPECT_EQ(last->finish_reason, "length");
  ASSERT_TRUE(last->usage);
  EXPECT_EQ(last->usage->prompt_tokens, 5);
  EXPECT_EQ(last->usage->completion_tokens, 4);
  EXPECT_EQ(last->usage->cached_tokens, 3);
  auto usage_only = parse_stream_chunk(ApiKind::kCompletions, R"({"choices":[],"usage":{"completion_tokens":2}})");
  ASSERT_TRUE(usage_only);
  EXPECT_FALSE(usage_only->has_choice);
  EXPECT_EQ(usage_only->usage->completion_tokens, 2);
  auto null_usage = parse_stream_chunk(ApiKind::kCompletions, R"({"choices":[{"text":"x"}],"usage":null})");
  ASSERT_TRUE(null_usage);
  EXPECT_FALSE(null_usage->usage);
}

TEST(BenchOpenAi, ChatChunksDoneAndErrors) {
  auto role = parse_stream_chunk(ApiKind::kChatCompletions,
                                 R"({"choices":[{"delta":{"role":"assistant","content":null}}]})");
  ASSERT_TRUE(role);
  EXPECT_EQ(role->text, "");
  auto content = parse_stream_chunk(ApiKind::kChatCompletions, R"({"choices":[{"delta":{"content":"Hi"}}]})");
  ASSERT_TRUE(content);
  EXPECT_EQ(content->text, "Hi");
  auto done = parse_stream_chunk(ApiKind::kChatCompletions, " [DONE] ");
  ASSERT_TRUE(done);
  EXPECT_TRUE(done->done);
  auto err = parse_stream_chunk(ApiKind::kCompletions, R"({"error":{"message":"too long","code":400}})");
  ASSERT_TRUE(err);
  EXPECT_EQ(err->error, "too long");
  EXPECT_FALSE(parse_stream_chunk(ApiKind::kCompletions, "{not json"));
  EXPECT_FALSE(parse_stream_chunk(ApiKind::kCompletions, "[1,2]"));
}

TEST(BenchBaseUrl, ParsesHostPortAndPrefix) {
  auto a = parse_base_url("http://127.0.0.1:8000");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, "8000");
  EXPECT_EQ(a->target("/v1/completions"), "/v1/completions");
  EXPECT_EQ(a->host_header(), "127.0.0.1:8000");
  auto b = parse_base_url("http://example.org/proxy/");
  ASSERT_TRUE(b);
  EXPECT_EQ(b->port, "80");
  EXPECT_EQ(b->target("/v1/models"), "/proxy/v1/models");
  EXPECT_EQ(b->host_header(), "example.org");
  auto c = parse_base_url("http://[::1]:9000");
  ASSERT_TRUE(c);
  EXPECT_EQ(c->host, "::1");
  EXPECT_EQ(c->host_header(), "[::1]:9000");
  EXPECT_FALSE(parse_base_url("https://x"));
  EXPECT_FALSE(parse_base_url("127.0.0.1:8000"));
  EXPECT_FALSE(parse_base_url("http://h:0"));
  EXPECT_FALSE(parse_base_url("http://h:99999"));
  EXPECT_FALSE(parse_base_url("http://h:8a"));
  EXPECT_FALSE(parse_base_url("http://:80"));
}

}  // namespace
}  // namespace inferd::bench
