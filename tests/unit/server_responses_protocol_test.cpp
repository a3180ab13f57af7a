// The Responses API's protocol without a model: requests turned into the Chat
// Completions request they mean (and that request parsed by the chat parser),
// results turned into output items and the Response object, the stream's
// events in their order, and the bounded, expiring store of responses.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "server/openai_protocol.h"
#include "server/response_store.h"
#include "server/responses_protocol.h"

namespace inferd::server {
namespace {

using json = nlohmann::json;

ResponsesRequest request_ok(const std::string& body) {
  auto r = parse_responses_request(body);
  if (auto* e = std::get_if<ApiError>(&r)) {
    ADD_FAILURE() << body << " -> " << e->message;
    return {};
  }
  return std::get<ResponsesRequest>(r);
}

// The chat body the request means, as JSON.
json chat_of(const std::string& body, const std::vector<ordered_json>& history = {}) {
  auto chat = responses_chat_body(request_ok(body), history);
  if (auto* e = std::get_if<ApiError>(&chat)) {
    ADD_FAILURE() << body << " -> " << e->message;
    return json::object();
  }
  return json::parse(std::get<std::string>(chat));
}

// The error of a request refused by the parser or by the conversion.
ApiError error_of(const std::string& body) {
  auto r = parse_responses_request(body);
  if (auto* e = std::get_if<ApiError>(&r)) return *e;
  auto chat = responses_chat_body(std::get<ResponsesRequest>(r), {});
  EXPECT_TRUE(std::holds_alternative<ApiError>(chat)) << body;
  return std::holds_alternative<ApiError>(chat) ? std::get<ApiError>(chat) : ApiError{};
}

GenerationRequest chat_request(const json& chat) {
  auto r = parse_chat_request(chat.dump(), ProtocolLimits{});
  if (auto* e = std::get_if<ApiError>(&r)) {
    ADD_FAILURE() << chat.dump() << " -> " << e->message;
    return {};
  }
  return std::get<GenerationRequest>(r);
}

TEST(ResponsesProtocol, StringInputAndInstructions) {
  const json chat = chat_of(R"({"model": "m", "input": "Hello", "instructions": "Be brief.",
                                "max_output_tokens": 20, "temperature": 0.5, "top_p": 0.9})");
  EXPECT_EQ(chat["messages"], json::parse(R"([{"role": "system", "content": "Be brief."},
                                               {"role": "user", "content": "Hello"}])"));
  const GenerationRequest r = chat_request(chat);
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.max_tokens, 20);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.9f);
  EXPECT_FALSE(r.stream);
  EXPECT_TRUE(request_ok(R"({"input": "x"})").store);  // stored by default
}

TEST(ResponsesProtocol, ItemsBecomeChatTurns) {
  const json chat = chat_of(R"({"input": [
      {"role": "user", "content": [{"type": "input_text", "text": "Weather in "}, {"type": "input_text", "text": "Paris?"}]},
      {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Use the tool."}]},
      {"type": "function_call", "call_id": "call_a", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
      {"type": "function_call", "call_id": "call_b", "name": "get_time", "arguments": "{}"},
      {"type": "function_call_output", "call_id": "call_a", "output": "sunny"},
      {"type": "function_call_output", "call_id": "call_b", "output": [{"type": "input_text", "text": "noon"}]},
      {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Sunny at noon."}]},
      {"role": "developer", "content": "Answer in French."}]})");
  const json& m = chat["messages"];
  ASSERT_EQ(m.size(), 6u) << m.dump();
  EXPECT_EQ(m[0], json::parse(R"({"role": "user", "content": "Weather in Paris?"})"));
  EXPECT_EQ(m[1]["role"], "assistant");
  EXPECT_EQ(m[1]["reasoning_content"], "Use the tool.");
  ASSERT_EQ(m[1]["tool_calls"].size(), 2u);
  EXPECT_EQ(m[1]["tool_calls"][0], json::parse(R"({"id": "call_a", "type": "function",
      "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}})"));
  EXPECT_EQ(m[2], json::parse(R"({"role": "tool", "tool_call_id": "call_a", "content": "sunny"})"));
  EXPECT_EQ(m[3], json::parse(R"({"role": "tool", "tool_call_id": "call_b", "content": "noon"})"));
  EXPECT_EQ(m[4], json::parse(R"({"role": "assistant", "content": "Sunny at noon."})"));
  // As a system message: templates that predate the developer role drop it.
  EXPECT_EQ(m[5], json::parse(R"({"role": "system", "content": "Answer in French."})"));
  // The chat parser takes them: the calls reach the template with their ids.
  const GenerationRequest r = chat_request(chat);
  ASSERT_EQ(r.messages.size(), 6u);
  EXPECT_NE(r.messages[1].tool_calls_json.find("call_a"), std::string::npos);
  EXPECT_EQ(r.messages[2].tool_call_id, "call_a");
}

TEST(ResponsesProtocol, HistoryComesFirst) {
  const std::vector<ordered_json> history = {
      ordered_json::parse(R"({"type": "message", "role": "user", "content": "Hi"})"),
      ordered_json::parse(R"({"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
                              "content": [{"type": "output_text", "text": "Hello!", "annotations": []}]})")};
  const json chat = chat_of(R"({"input": "And again?", "instructions": "Be kind."})", history);
  EXPECT_EQ(chat["messages"], json::parse(R"([{"role": "system", "content": "Be kind."},
      {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
      {"role": "user", "content": "And again?"}])"));
}

TEST(ResponsesProtocol, ToolsFormatAndReasoning) {
  const json chat = chat_of(R"({"input": "x",
      "tools": [{"type": "function", "name": "f", "description": "d",
                 "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}, "strict": true}],
      "tool_choice": {"type": "function", "name": "f"}, "parallel_tool_calls": false,
      "text": {"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}, "strict": true}},
      "reasoning": {"effort": "high"}})");
  EXPECT_EQ(chat["tools"], json::parse(R"([{"type": "function", "function": {"name": "f", "description": "d",
      "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}, "strict": true}}])"));
  EXPECT_EQ(chat["tool_choice"], json::parse(R"({"type": "function", "function": {"name": "f"}})"));
  EXPECT_EQ(chat["response_format"], json::parse(R"({"type": "json_schema",
      "json_schema": {"name": "out", "schema": {"type": "object"}, "strict": true}})"));
  EXPECT_EQ(chat["reasoning_effort"], "high");
  // The chat parser takes them (a named call and a schema each; not both at once).
  json tools_only = chat;
  tools_only.erase("response_format");
  const GenerationRequest r = chat_request(tools_only);
  ASSERT_TRUE(r.tools.has_value());
  EXPECT_EQ(r.tools->choice, ToolChoice::kNamed);
  EXPECT_EQ(r.tools->named, "f");
  EXPECT_FALSE(r.tools->parallel);
  EXPECT_EQ(r.reasoning_effort, "high");
  json format_only = chat;
  format_only.erase("tools");
  format_only.erase("tool_choice");
  const GenerationRequest f = chat_request(format_only);
  ASSERT_TRUE(f.structured.has_value());
  EXPECT_EQ(f.structured->kind, GrammarKind::kJsonSchema);

  EXPECT_EQ(chat_of(R"({"input": "x", "text": {"format": {"type": "json_object"}}})")["response_format"],
            json::parse(R"({"type": "json_object"})"));
  EXPECT_FALSE(chat_of(R"({"input": "x", "text": {"format": {"type": "text"}}})").contains("response_format"));
  EXPECT_EQ(chat_of(R"({"input": "x", "tool_choice": "required", "tools": []})")["tool_choice"], "required");
}

TEST(ResponsesProtocol, BadRequestsNameTheField) {
  struct Case {
    const char* body;
    const char* param;
    const char* words;
  };
  const Case cases[] = {
      {R"({"model": "m"})", "input", "'input' is required"},
      {R"({"input": []})", "input", "must not be an empty array"},
      {R"({"input": 3})", "input", "must be a string or an array"},
      {R"({"input": [{"type": "web_search_call", "id": "x"}]})", "input", "'web_search_call'"},
      {R"({"input": [{"type": "item_reference", "id": "x"}]})", "input", "item_reference"},
      {R"({"input": [{"role": "robot", "content": "x"}]})", "input", "'robot'"},
      {R"({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]})", "input",
       "text only"},
      {R"({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]})", "input", "call_id"},
      {R"({"input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]})", "input",
       "No tool call found"},
      {R"({"input": "x", "background": true})", "background", "not supported"},
      {R"({"input": "x", "store": "yes"})", "store", "boolean"},
      {R"({"input": "x", "tools": [{"type": "teleport"}]})", "tools", "'teleport'"},
      {R"({"input": "x", "tools": [{"type": "namespace", "name": "ns"}]})", "tools", "'tools[0].tools'"},
      {R"({"input": "x", "tools": [{"type": "namespace", "name": "ns", "tools": [{"type": "web_search"}]}]})",
       "tools", "function tools only"},
      {R"({"input": "x", "tool_choice": "sometimes"})", "tool_choice", "'sometimes'"},
      {R"({"input": "x", "tool_choice": {"type": "file_search"}})", "tool_choice", "only function"},
      {R"({"input": "x", "text": {"format": {"type": "yaml"}}})", "text.format", "'yaml'"},
      {R"({"input": "x", "text": {"format": {"type": "json_schema", "name": "s"}}})", "text.format", "schema"},
      {R"({"input": "x", "reasoning": {"effort": "extreme"}})", "reasoning.effort", "'extreme'"},
      {R"({"input": "x", "max_output_tokens": 0})", "max_output_tokens", "positive"},
      {R"({"input": "x", "previous_response_id": ""})", "previous_response_id", "non-empty"},
      {R"([1, 2])", "", "JSON object"},
      {R"({"input": )", "", "not valid JSON"},
  };
  for (const Case& c : cases) {
    const ApiError e = error_of(c.body);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.type, "invalid_request_error") << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << " -> " << e.message;
    EXPECT_NE(e.message.find(c.words), std::string::npos) << c.body << " -> " << e.message;
  }
}

TEST(ResponsesProtocol, OutputItems) {
  ResponseResult result;
  result.reasoning = "thinking";
  result.content = "";
  result.tool_calls = json::parse(R"([{"id": "call_x", "type": "function",
                                       "function": {"name": "f", "arguments": "{\"a\": 1}"}}])");
  const ordered_json items = response_output_items(result, ResponsesRequest{});
  ASSERT_EQ(items.size(), 2u) << items.dump();  // no message beside the call
  EXPECT_EQ(items[0]["type"], "reasoning");
  EXPECT_EQ(items[0]["id"].get<std::string>().rfind("rs_", 0), 0u);
  EXPECT_EQ(items[0]["content"], ordered_json::parse(R"([{"type": "reasoning_text", "text": "thinking"}])"));
  EXPECT_EQ(items[1]["type"], "function_call");
  EXPECT_EQ(items[1]["call_id"], "call_x");
  EXPECT_EQ(items[1]["name"], "f");
  EXPECT_EQ(items[1]["arguments"], "{\"a\": 1}");
  EXPECT_EQ(items[1]["id"].get<std::string>().rfind("fc_", 0), 0u);

  ResponseResult text;
  text.content = "Hello";
  text.incomplete = true;
  const ordered_json one = response_output_items(text, ResponsesRequest{});
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0]["type"], "message");
  EXPECT_EQ(one[0]["role"], "assistant");
  EXPECT_EQ(one[0]["status"], "incomplete");
  EXPECT_EQ(one[0]["content"][0]["type"], "output_text");
  EXPECT_EQ(one[0]["content"][0]["text"], "Hello");

  const ResponsesRequest req = request_ok(R"({"input": "x", "instructions": "i", "temperature": 0.2,
                                              "metadata": {"k": "v"}, "store": false})");
  const ResponseUsage usage{10, 4, 5, 2};
  const ordered_json r = response_object(req, "resp_1", 123, "model", "incomplete", one, &usage);
  EXPECT_EQ(r["object"], "response");
  EXPECT_EQ(r["status"], "incomplete");
  EXPECT_EQ(r["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ(r["instructions"], "i");
  EXPECT_EQ(r["temperature"], 0.2);
  EXPECT_EQ(r["metadata"]["k"], "v");
  EXPECT_EQ(r["store"], false);
  EXPECT_EQ(r["usage"], ordered_json::parse(R"({"input_tokens": 10, "input_tokens_details": {"cached_tokens": 4},
      "output_tokens": 5, "output_tokens_details": {"reasoning_tokens": 2}, "total_tokens": 15})"));
}

// The events of an SSE text: their types and data.
std::vector<json> events_of(const std::string& sse) {
  std::vector<json> out;
  size_t at = 0;
  while ((at = sse.find("data: ", at)) != std::string::npos) {
    const size_t end = sse.find("\n\n", at);
    out.push_back(json::parse(sse.substr(at + 6, end - at - 6)));
    at = end;
  }
  return out;
}

// Codex's tools, in the shapes Codex 0.169 sends them: flat function tools,
// a namespace of function tools, and a hosted web_search tool.
constexpr const char* kCodexTools = R"([
    {"type": "function", "name": "exec_command", "strict": false,
     "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}},
    {"type": "namespace", "name": "multi_agent_v1", "description": "Tools for sub-agents.",
     "tools": [{"type": "function", "name": "spawn_agent", "description": "Spawn one.",
                "parameters": {"type": "object", "properties": {}}},
               {"type": "function", "name": "close_agent", "parameters": {"type": "object", "properties": {}}}]},
    {"type": "web_search", "external_web_access": false}])";

TEST(ResponsesProtocol, NamespacesAreFlattenedAndHostedToolsLeftOut) {
  EXPECT_EQ(flat_tool_name("multi_agent_v1", "spawn_agent"), "multi_agent_v1__spawn_agent");
  EXPECT_EQ(flat_tool_name("mcp__calendar__", "__create_event"), "mcp__calendar__create_event");

  const std::string body = std::string(R"({"input": "x", "tools": )") + kCodexTools + "}";
  const ResponsesRequest req = request_ok(body);
  EXPECT_EQ(req.ignored_tool_types, std::vector<std::string>{"web_search"});
  const json chat = chat_of(body);
  ASSERT_EQ(chat["tools"].size(), 3u) << chat.dump();
  EXPECT_EQ(chat["tools"][0]["function"]["name"], "exec_command");
  EXPECT_EQ(chat["tools"][1]["function"]["name"], "multi_agent_v1__spawn_agent");
  EXPECT_EQ(chat["tools"][1]["function"]["description"], "Spawn one.");
  EXPECT_EQ(chat["tools"][2]["function"]["name"], "multi_agent_v1__close_agent");
  const GenerationRequest r = chat_request(chat);
  ASSERT_TRUE(r.tools.has_value());

  // The model's call of a flat name goes back as the namespace and the inner name.
  ResponseResult result;
  result.tool_calls = json::parse(R"([
      {"id": "call_a", "type": "function", "function": {"name": "multi_agent_v1__spawn_agent", "arguments": "{}"}},
      {"id": "call_b", "type": "function", "function": {"name": "exec_command", "arguments": "{\"cmd\": \"ls\"}"}}])");
  const ordered_json items = response_output_items(result, req);
  ASSERT_EQ(items.size(), 2u) << items.dump();
  EXPECT_EQ(items[0]["name"], "spawn_agent");
  EXPECT_EQ(items[0]["namespace"], "multi_agent_v1");
  EXPECT_EQ(items[1]["name"], "exec_command");
  EXPECT_FALSE(items[1].contains("namespace"));

  // Streamed, the same.
  ResponseEventStream stream(req, "resp_1", 1, "m");
  const std::vector<json> events = events_of(stream.function_call("call_a", "multi_agent_v1__spawn_agent", "{}"));
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back()["type"], "response.output_item.done");
  EXPECT_EQ(events.back()["item"]["name"], "spawn_agent");
  EXPECT_EQ(events.back()["item"]["namespace"], "multi_agent_v1");

  // Given back as history, the call is the flat name again, and its output answers it.
  const json turn = chat_of(std::string(R"({"tools": )") + kCodexTools + R"(, "input": [
      {"type": "function_call", "call_id": "call_a", "name": "spawn_agent", "namespace": "multi_agent_v1",
       "arguments": "{}"},
      {"type": "function_call_output", "call_id": "call_a", "output": "spawned"}]})");
  ASSERT_EQ(turn["messages"].size(), 2u) << turn.dump();
  EXPECT_EQ(turn["messages"][0]["tool_calls"][0]["function"]["name"], "multi_agent_v1__spawn_agent");
  EXPECT_EQ(turn["messages"][1]["role"], "tool");

  // A named tool_choice may name a namespaced tool.
  EXPECT_EQ(chat_of(std::string(R"({"input": "x", "tools": )") + kCodexTools +
                    R"(, "tool_choice": {"type": "function", "namespace": "multi_agent_v1", "name": "close_agent"}})")
                ["tool_choice"]["function"]["name"],
            "multi_agent_v1__close_agent");
  // Only hosted tools: no tools reach the chat request.
  EXPECT_FALSE(chat_of(R"({"input": "x", "tools": [{"type": "web_search"}, {"type": "file_search"}]})")
                   .contains("tools"));
}

TEST(ResponsesProtocol, StreamEventsInOrder) {
  ResponseEventStream s(request_ok(R"({"input": "x", "stream": true})"), "resp_1", 7, "model");
  std::string sse = s.begin();
  sse += s.reasoning_delta("Let me ");
  sse += s.reasoning_delta("think.");
  sse += s.text_delta("\n\n");  // whitespace alone waits...
  sse += s.function_call("call_1", "f", "{\"a\": 1}");  // ...and is dropped before a call
  sse += s.text_delta("Done");
  sse += s.text_delta(".");
  sse += s.finish(false, ResponseUsage{3, 0, 9, 4});
  const std::vector<json> events = events_of(sse);
  std::vector<std::string> types;
  for (const json& e : events) types.push_back(e["type"]);
  const std::vector<std::string> expected = {
      "response.created", "response.in_progress",
      "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
      "response.reasoning_text.delta", "response.reasoning_text.done", "response.content_part.done",
      "response.output_item.done",
      "response.output_item.added", "response.function_call_arguments.delta",
      "response.function_call_arguments.done", "response.output_item.done",
      "response.output_item.added", "response.content_part.added", "response.output_text.delta",
      "response.output_text.delta", "response.output_text.done", "response.content_part.done",
      "response.output_item.done", "response.completed"};
  EXPECT_EQ(types, expected);
  for (size_t i = 0; i < events.size(); ++i) EXPECT_EQ(events[i]["sequence_number"], i) << events[i].dump();
  // Every SSE event names its type in the event: line too.
  EXPECT_NE(sse.find("event: response.output_text.delta\ndata: "), std::string::npos);
  EXPECT_EQ(events[0]["response"]["status"], "in_progress");
  EXPECT_EQ(events[6]["text"], "Let me think.");
  EXPECT_EQ(events[8]["output_index"], 0);
  EXPECT_EQ(events[11]["arguments"], "{\"a\": 1}");
  EXPECT_EQ(events[12]["output_index"], 1);
  EXPECT_EQ(events[17]["text"], "Done.");
  EXPECT_EQ(events[19]["output_index"], 2);
  const json& done = events.back()["response"];
  EXPECT_EQ(done["status"], "completed");
  ASSERT_EQ(done["output"].size(), 3u);
  EXPECT_EQ(done["output"][0]["type"], "reasoning");
  EXPECT_EQ(done["output"][1]["type"], "function_call");
  EXPECT_EQ(done["output"][2]["content"][0]["text"], "Done.");
  EXPECT_EQ(done["usage"]["total_tokens"], 12);
  EXPECT_EQ(s.response()["id"], "resp_1");
}

TEST(ResponsesProtocol, StreamOfWhitespaceAloneAndIncomplete) {
  ResponseEventStream s(request_ok(R"({"input": "x"})"), "resp_2", 7, "model");
  std::string sse = s.begin();
  sse += s.text_delta(" ");
  sse += s.finish(true, ResponseUsage{});
  const std::vector<json> events = events_of(sse);
  EXPECT_EQ(events.back().at("type"), "response.incomplete");
  const json& output = events.back().at("response").at("output");
  ASSERT_EQ(output.size(), 1u) << sse;
  EXPECT_EQ(output.at(0).at("content").at(0).at("text"), " ");
}

TEST(ResponseStore, BoundedAndExpiring) {
  using namespace std::chrono_literals;
  ResponseStore store(2, 60s);
  const auto t0 = ResponseStore::Clock::time_point{} + 1000s;
  auto stored = [](const char* id) {
    StoredResponse s;
    s.response = {{"id", id}};
    return s;
  };
  store.put("a", stored("a"), t0);
  store.put("b", stored("b"), t0 + 1s);
  ASSERT_TRUE(store.get("a", t0 + 2s).has_value());
  EXPECT_EQ(store.get("a", t0 + 2s)->response["id"], "a");
  store.put("c", stored("c"), t0 + 2s);  // over the bound: the oldest goes
  EXPECT_FALSE(store.get("a", t0 + 3s).has_value());
  EXPECT_TRUE(store.get("b", t0 + 3s).has_value());
  EXPECT_TRUE(store.erase("b", t0 + 3s));
  EXPECT_FALSE(store.erase("b", t0 + 3s));
  EXPECT_TRUE(store.get("c", t0 + 61s).has_value());
  EXPECT_FALSE(store.get("c", t0 + 62s).has_value());  // expired
  EXPECT_EQ(store.size(), 0u);
}

}  // namespace
}  // namespace inferd::server
