// Anthropic's Messages API as a protocol, without a model: request bodies
// turned into chat requests (blocks, tools, thinking), the errors' shape, the
// whole message and the streamed events. (Through the real server with the
// official client: tests/e2e/test_messages_api.py.)
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "server/messages_protocol.h"

namespace inferd::server {
namespace {

using json = nlohmann::json;
const ProtocolLimits kLimits;

MessagesRequest parse_ok(const std::string& body, bool count_tokens = false) {
  auto r = parse_messages_request(body, kLimits, count_tokens);
  if (auto* e = std::get_if<ApiError>(&r)) ADD_FAILURE() << body << " -> " << e->message;
  return std::holds_alternative<MessagesRequest>(r) ? std::get<MessagesRequest>(r) : MessagesRequest{};
}

ApiError parse_error(const std::string& body) {
  auto r = parse_messages_request(body, kLimits);
  EXPECT_TRUE(std::holds_alternative<ApiError>(r)) << body;
  return std::holds_alternative<ApiError>(r) ? std::get<ApiError>(r) : ApiError{};
}

// The server-sent events of a stream as (event line, data) pairs.
std::vector<std::pair<std::string, json>> events_of(const std::string& text) {
  std::vector<std::pair<std::string, json>> out;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t end = text.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos) << text;
    if (end == std::string::npos) break;
    const std::string event = text.substr(pos, end - pos);
    const size_t nl = event.find('\n');
    EXPECT_EQ(event.rfind("event: ", 0), 0u) << event;
    EXPECT_EQ(event.compare(nl + 1, 6, "data: "), 0) << event;
    out.emplace_back(event.substr(7, nl - 7), json::parse(event.substr(nl + 7)));
    pos = end + 2;
  }
  return out;
}

TEST(MessagesProtocol, SystemTextAndSampling) {
  MessagesRequest m = parse_ok(R"({"model": "m", "max_tokens": 32,
      "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
      "messages": [{"role": "user", "content": "hi"}],
      "temperature": 0.5, "top_p": 0.9, "top_k": 40, "stop_sequences": ["END", "\n\n"],
      "metadata": {"user_id": "u"}, "stream": true})");
  const GenerationRequest& r = m.req;
  EXPECT_TRUE(r.chat);
  EXPECT_EQ(r.model, "m");
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[0].content, "Be brief.\n\nBe kind.");
  EXPECT_EQ(r.messages[1].role, "user");
  EXPECT_EQ(r.messages[1].content, "hi");
  EXPECT_EQ(r.max_tokens, 32);
  EXPECT_TRUE(r.stream);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.9f);
  EXPECT_EQ(r.sampling.top_k, 40);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"END", "\n\n"}));
  EXPECT_FALSE(m.thinking);
  EXPECT_EQ(json::parse(r.chat_template_kwargs), json({{"enable_thinking", false}}));
  EXPECT_FALSE(r.tools.has_value());
}

TEST(MessagesProtocol, ToolUseAndToolResultBecomeChatToolMessages) {
  MessagesRequest m = parse_ok(R"({"model": "m", "max_tokens": 8, "messages": [
      {"role": "user", "content": "weather?"},
      {"role": "assistant", "content": [
          {"type": "thinking", "thinking": "look it up", "signature": "s"},
          {"type": "text", "text": "Checking."},
          {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris", "a": 1}},
          {"type": "tool_use", "id": "toolu_2", "name": "get_time", "input": {}}]},
      {"role": "user", "content": [
          {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C"},
          {"type": "tool_result", "tool_use_id": "toolu_2", "content": [{"type": "text", "text": "noon"}], "is_error": false},
          {"type": "text", "text": "thanks"}]}]})");
  const std::vector<ChatMessage>& ms = m.req.messages;
  ASSERT_EQ(ms.size(), 5u);
  EXPECT_EQ(ms[1].role, "assistant");
  EXPECT_EQ(ms[1].content, "Checking.");
  EXPECT_EQ(ms[1].reasoning_content, "look it up");
  // OpenAI's tool_calls with the arguments as the object (templates write `arguments | tojson`), key order kept.
  EXPECT_EQ(ms[1].tool_calls_json,
            R"([{"id":"toolu_1","type":"function","function":{"name":"get_weather","arguments":{"city":"Paris","a":1}}},)"
            R"({"id":"toolu_2","type":"function","function":{"name":"get_time","arguments":{}}}])");
  EXPECT_EQ(ms[2].role, "tool");
  EXPECT_EQ(ms[2].tool_call_id, "toolu_1");
  EXPECT_EQ(ms[2].content, "18 C");
  EXPECT_EQ(ms[3].role, "tool");
  EXPECT_EQ(ms[3].tool_call_id, "toolu_2");
  EXPECT_EQ(ms[3].content, "noon");
  EXPECT_EQ(ms[4].role, "user");
  EXPECT_EQ(ms[4].content, "thanks");
}

TEST(MessagesProtocol, ToolsAndToolChoice) {
  const std::string tools = R"("tools": [{"name": "get_weather", "description": "Weather.",
      "input_schema": {"type": "object", "properties": {"z": {"type": "string"}, "a": {"type": "integer"}}}}])";
  MessagesRequest m = parse_ok(R"({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}], )" +
                               tools + "}");
  ASSERT_TRUE(m.req.tools.has_value());
  const ToolsRequest& t = *m.req.tools;
  EXPECT_EQ(t.choice, ToolChoice::kAuto);
  ASSERT_EQ(t.tools.size(), 1u);
  EXPECT_EQ(t.tools[0].name, "get_weather");
  EXPECT_EQ(t.tools[0].parameters, R"({"type":"object","properties":{"z":{"type":"string"},"a":{"type":"integer"}}})");
  EXPECT_EQ(t.tools_json, R"([{"type":"function","function":{"name":"get_weather","description":"Weather.",)"
                          R"("parameters":{"type":"object","properties":{"z":{"type":"string"},"a":{"type":"integer"}}}}}])");
  struct Case {
    std::string choice;
    ToolChoice want;
    bool parallel;
  };
  for (const Case& c : {Case{R"({"type": "any"})", ToolChoice::kRequired, true},
                        Case{R"({"type": "any", "disable_parallel_tool_use": true})", ToolChoice::kRequired, false},
                        Case{R"({"type": "none"})", ToolChoice::kNone, true},
                        Case{R"({"type": "tool", "name": "get_weather"})", ToolChoice::kNamed, true}}) {
    MessagesRequest mc = parse_ok(R"({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}], )" +
                                  tools + R"(, "tool_choice": )" + c.choice + "}");
    ASSERT_TRUE(mc.req.tools.has_value()) << c.choice;
    EXPECT_EQ(mc.req.tools->choice, c.want) << c.choice;
    EXPECT_EQ(mc.req.tools->parallel, c.parallel) << c.choice;
    if (c.want == ToolChoice::kNamed) EXPECT_EQ(mc.req.tools->named, "get_weather");
  }
}

TEST(MessagesProtocol, Thinking) {
  MessagesRequest m = parse_ok(R"({"model": "m", "max_tokens": 2048, "messages": [{"role": "user", "content": "x"}],
      "thinking": {"type": "enabled", "budget_tokens": 1024}})");
  EXPECT_TRUE(m.thinking);
  EXPECT_EQ(json::parse(m.req.chat_template_kwargs), json({{"enable_thinking", true}}));
  EXPECT_FALSE(parse_ok(R"({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}],
      "thinking": {"type": "disabled"}})").thinking);
  EXPECT_TRUE(parse_ok(R"({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}],
      "thinking": {"type": "adaptive"}})").thinking);
}

TEST(MessagesProtocol, CountTokensNeedsNoMaxTokens) {
  MessagesRequest m = parse_ok(R"({"model": "m", "messages": [{"role": "user", "content": "x"}]})", true);
  EXPECT_FALSE(m.req.max_tokens.has_value());
  EXPECT_EQ(m.req.messages.size(), 1u);
}

TEST(MessagesProtocol, BadRequestsNameTheProblem) {
  const std::string ok_messages = R"("messages": [{"role": "user", "content": "x"}])";
  struct Case {
    std::string body;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"[1]", "JSON object"},
      {"{nope", "not valid JSON"},
      {R"({"max_tokens": 8, )" + ok_messages + "}", "'model' is required"},
      {R"({"model": "m", )" + ok_messages + "}", "'max_tokens' is required"},
      {R"({"model": "m", "max_tokens": 0, )" + ok_messages + "}", "at least 1"},
      {R"({"model": "m", "max_tokens": 8, "messages": []})", "non-empty"},
      {R"({"model": "m", "max_tokens": 8, "messages": [{"role": "system", "content": "x"}]})", "top-level 'system'"},
      {R"({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "image",
          "source": {"type": "url", "url": "http://x"}}]}]})", "image content blocks are not supported"},
      {R"({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "tool_result",
          "tool_use_id": "toolu_x", "content": "r"}]}]})", "no matching tool_use"},
      // A tool_result answers the previous assistant message's calls, not older ones.
      {R"({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x"},
          {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}]},
          {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1"}]},
          {"role": "assistant", "content": "ok"},
          {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1"}]}]})", "no matching tool_use"},
      {R"({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x"},
          {"role": "assistant", "content": "prefill"}]})", "prefilled assistant turn"},
      {R"({"model": "m", "max_tokens": 8, "temperature": 1.5, )" + ok_messages + "}", "'temperature'"},
      {R"({"model": "m", "max_tokens": 8, "stop_sequences": [""], )" + ok_messages + "}", "'stop_sequences'"},
      {R"({"model": "m", "max_tokens": 8, "tools": [{"name": "f"}], )" + ok_messages + "}", "input_schema"},
      {R"({"model": "m", "max_tokens": 8, "tools": [{"name": "a b", "input_schema": {}}], )" + ok_messages + "}", "name"},
      {R"({"model": "m", "max_tokens": 8, "tools": [{"type": "bash_20250124", "name": "bash"}], )" + ok_messages + "}",
       "server tools"},
      {R"({"model": "m", "max_tokens": 8, "tool_choice": {"type": "any"}, )" + ok_messages + "}", "needs 'tools'"},
      {R"({"model": "m", "max_tokens": 8, "tools": [{"name": "f", "input_schema": {}}],
          "tool_choice": {"type": "tool", "name": "g"}, )" + ok_messages + "}", "not in 'tools'"},
      {R"({"model": "m", "max_tokens": 8, "tools": [{"name": "f", "input_schema": {}}],
          "tool_choice": {"type": "sometimes"}, )" + ok_messages + "}", "'tool_choice.type'"},
      {R"({"model": "m", "max_tokens": 2000, "thinking": {"type": "enabled"}, )" + ok_messages + "}", "budget_tokens"},
      {R"({"model": "m", "max_tokens": 1024, "thinking": {"type": "enabled", "budget_tokens": 1024}, )" + ok_messages + "}",
       "greater than"},
  };
  for (const Case& c : cases) {
    const ApiError e = parse_error(c.body);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_NE(e.message.find(c.says), std::string::npos) << c.body << " -> " << e.message;
  }
}

TEST(MessagesProtocol, ErrorShapeByStatus) {
  EXPECT_EQ(json::parse(anthropic_error_json(bad_request("bad"))),
            json::parse(R"({"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}})"));
  EXPECT_STREQ(anthropic_error_type(401), "authentication_error");
  EXPECT_STREQ(anthropic_error_type(404), "not_found_error");
  EXPECT_STREQ(anthropic_error_type(429), "rate_limit_error");
  EXPECT_STREQ(anthropic_error_type(500), "api_error");
  EXPECT_STREQ(anthropic_error_type(503), "overloaded_error");
  EXPECT_STREQ(anthropic_error_type(529), "overloaded_error");
}

TEST(MessagesProtocol, WholeMessage) {
  MessageResult r;
  r.thinking = "hmm";
  r.text = "Calling.";
  r.tool_uses.push_back({"get_weather", R"({"city":"Paris"})"});
  r.finish_reason = "stop";
  r.input_tokens = 12;
  r.output_tokens = 7;
  json m = message_json("msg_1", "model", r);
  EXPECT_EQ(m["type"], "message");
  EXPECT_EQ(m["role"], "assistant");
  EXPECT_EQ(m["stop_reason"], "tool_use");
  EXPECT_TRUE(m["stop_sequence"].is_null());
  EXPECT_EQ(m["usage"], json::parse(R"({"input_tokens": 12, "output_tokens": 7})"));
  ASSERT_EQ(m["content"].size(), 3u);
  EXPECT_EQ(m["content"][0], json::parse(R"({"type": "thinking", "thinking": "hmm", "signature": ""})"));
  EXPECT_EQ(m["content"][1], json::parse(R"({"type": "text", "text": "Calling."})"));
  EXPECT_EQ(m["content"][2]["type"], "tool_use");
  EXPECT_EQ(m["content"][2]["input"], json::parse(R"({"city": "Paris"})"));
  EXPECT_EQ(m["content"][2]["id"].get<std::string>().rfind("toolu_", 0), 0u);

  MessageResult stopped;
  stopped.text = "a";
  stopped.finish_reason = "stop";
  stopped.stop_string = "END";
  m = message_json("msg_2", "model", stopped);
  EXPECT_EQ(m["stop_reason"], "stop_sequence");
  EXPECT_EQ(m["stop_sequence"], "END");
  stopped.stop_string.clear();
  EXPECT_EQ(message_json("msg_3", "model", stopped)["stop_reason"], "end_turn");
  stopped.finish_reason = "length";
  EXPECT_EQ(message_json("msg_4", "model", stopped)["stop_reason"], "max_tokens");
}

TEST(MessagesProtocol, StreamedEventsInAnthropicsOrder) {
  MessagesEventWriter w("msg_1", "model", 5);
  std::string text = w.start();
  text += w.thinking("let me");
  text += w.thinking(" see");
  text += w.text("");  // nothing to say: no event
  text += w.text("Hello");
  text += w.tool_use("get_weather", R"({"city":"Oslo"})");
  text += w.finish("stop", "", 9);
  const auto events = events_of(text);
  std::vector<std::string> names;
  for (const auto& [name, data] : events) {
    names.push_back(name);
    EXPECT_EQ(data["type"], name);  // the event line names its data's type
  }
  EXPECT_EQ(names, (std::vector<std::string>{"message_start", "ping", "content_block_start", "content_block_delta",
                                             "content_block_delta", "content_block_stop", "content_block_start",
                                             "content_block_delta", "content_block_stop", "content_block_start",
                                             "content_block_delta", "content_block_stop", "message_delta",
                                             "message_stop"}));
  EXPECT_EQ(events[0].second["message"]["usage"]["input_tokens"], 5);
  EXPECT_TRUE(events[0].second["message"]["stop_reason"].is_null());
  EXPECT_EQ(events[2].second["content_block"]["type"], "thinking");
  EXPECT_EQ(events[3].second["delta"], json::parse(R"({"type": "thinking_delta", "thinking": "let me"})"));
  EXPECT_EQ(events[6].second["index"], 1);
  EXPECT_EQ(events[7].second["delta"], json::parse(R"({"type": "text_delta", "text": "Hello"})"));
  EXPECT_EQ(events[9].second["index"], 2);
  EXPECT_EQ(events[9].second["content_block"]["input"], json::object());
  EXPECT_EQ(events[10].second["delta"]["type"], "input_json_delta");
  EXPECT_EQ(json::parse(events[10].second["delta"]["partial_json"].get<std::string>()), json::parse(R"({"city":"Oslo"})"));
  EXPECT_EQ(events[12].second["delta"]["stop_reason"], "tool_use");
  EXPECT_EQ(events[12].second["usage"]["output_tokens"], 9);

  MessagesEventWriter stopped("msg_2", "model", 1);
  const auto tail = events_of(stopped.text("a") + stopped.finish("stop", "END", 2));
  EXPECT_EQ(tail.back().first, "message_stop");
  EXPECT_EQ(tail[tail.size() - 2].second["delta"]["stop_reason"], "stop_sequence");
  EXPECT_EQ(tail[tail.size() - 2].second["delta"]["stop_sequence"], "END");
}

}  // namespace
}  // namespace inferd::server
