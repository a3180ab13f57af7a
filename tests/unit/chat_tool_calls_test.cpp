// Tool-call parsing (chat/tool_calls.h) on outputs written the way each model
// family writes them: whole calls, several calls, text around them, calls cut
// by max_tokens, malformed JSON, and every way of splitting a stream.
#include "chat/tool_calls.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <functional>
#include <string>
#include <vector>

#include "chat_test_util.h"

namespace inferd {
namespace {

using nlohmann::json;

ParsedAssistantMessage parse(ToolCallFormat f, const std::string& text) { return parse_tool_calls(f, text); }

void expect_call(const ParsedToolCall& call, const std::string& name, const json& args) {
  EXPECT_EQ(call.name, name);
  EXPECT_EQ(json::parse(call.arguments), args) << call.arguments;
}

// The message a stream of pieces gives, deltas joined.
ParsedAssistantMessage parse_in_pieces(ToolCallStreamParser parser, const std::string& text,
                                       const std::vector<size_t>& cuts) {
  ParsedAssistantMessage m;
  int next_index = 0;
  for (ToolCallDelta& d : test::feed_in_pieces(parser, text, cuts)) {
    m.content += d.content;
    if (d.call) {
      EXPECT_EQ(d.call_index, next_index++);
      m.tool_calls.push_back(std::move(*d.call));
    }
  }
  m.content = test::trimmed(m.content);
  return m;
}

// Fed one byte at a time, whole, and in random pieces, the parser gives what
// the whole-text parse gives.
void expect_stream_agrees(const ParsedAssistantMessage& whole, const std::string& text,
                          const std::function<ToolCallStreamParser()>& make_parser) {
  for (const std::vector<size_t>& cuts : test::stream_splits(text)) {
    const ParsedAssistantMessage m = parse_in_pieces(make_parser(), text, cuts);
    EXPECT_EQ(m.content, whole.content) << text;
    test::expect_same_calls(m.tool_calls, whole.tool_calls, text);
  }
}

void expect_stream_agrees(ToolCallFormat f, const std::string& text) {
  expect_stream_agrees(parse(f, text), text, [f] { return ToolCallStreamParser(f); });
}

// ---- hermes (Qwen2.5's template asks for exactly this) -----------------------

TEST(ToolCallsHermes, OneCallAsQwenWritesIt) {
  const std::string out = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
  const ParsedAssistantMessage m = parse(ToolCallFormat::kHermes, out);
  EXPECT_EQ(m.content, "");
  ASSERT_EQ(m.tool_calls.size(), 1u);
  expect_call(m.tool_calls[0], "get_weather", {{"city", "Paris"}});
  EXPECT_EQ(m.tool_calls[0].arguments, R"({"city":"Paris"})");  // compact, as OpenAI sends it
  expect_stream_agrees(ToolCallFormat::kHermes, out);
}

TEST(ToolCallsHermes, ParallelCallsWithTextAround) {
  const std::string out =
      "I will look both up.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
      "</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"CET\", \"h24\": true}}\n"
      "</tool_call>";
  const ParsedAssistantMessage m = parse(ToolCallFormat::kHermes, out);
  EXPECT_EQ(m.content, "I will look both up.");
  ASSERT_EQ(m.tool_calls.size(), 2u);
  expect_call(m.tool_calls[0], "get_weather", {{"city", "Paris"}});
  expect_call(m.tool_calls[1], "get_time", {{"zone", "CET"}, {"h24", true}});
  expect_stream_agrees(ToolCallFormat::kHermes, out);
}

TEST(ToolCallsHermes, PlainAnswerIsContent) {
  const std::string out = "The weather tool is not needed: 2 + 2 = 4. Tags like <tool or <b> stay text.";
  const ParsedAssistantMessage m = parse(ToolCallFormat::kHermes, out);
  EXPECT_EQ(m.content, out);
  EXPECT_TRUE(m.tool_calls.empty());
  expect_stream_agrees(ToolCallFormat::kHermes, out);
}

TEST(ToolCallsHermes, MissingClosingTagAtTheEndStillCounts) {
  const std::string out = "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n";
  const ParsedAssistantMessage m = parse(ToolCallFormat::kHermes, out);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  expect_call(m.tool_calls[0], "f", json::object());
  expect_stream_agrees(ToolCallFormat::kHermes, out);
}

TEST(ToolCallsHermes, CallCutByMaxTokensIsContent) {
  const std::string out = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par";
  const ParsedAssistantMessage m = parse(ToolCallFormat::kHermes, out);
  EXPECT_TRUE(m.tool_calls.empty());
  EXPECT_EQ(m.content, out);
  expect_stream_agrees(ToolCallFormat::kHermes, out);
}

TEST(ToolCallsHermes, MalformedCallStaysTextAndTheNextOneParses) {
  const std::string bad = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1,}}\n</tool_call>";
  const std::string no_name = "<tool_call>{\"arguments\": {}}</tool_call>";
  const std::string array_args = "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>";
  const std::string good = "<tool_call>{\"name\": \"g\", \"arguments\": \"{\\\"y\\\": [1, 2]}\"}</tool_call>";
  const std::string out = bad + "\n" + no_name + array_args + good;
  const ParsedAssistantMessage m = parse(ToolCallFormat::kHermes, out);
  EXPECT_EQ(m.content, bad + "\n" + no_name + array_args);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  expect_call(m.tool_calls[0], "g", {{"y", {1, 2}}});  // arguments given as a string of JSON
  expect_stream_agrees(ToolCallFormat::kHermes, out);
}

TEST(ToolCallsHermes, HostileNestingIsTextNotACrash) {
  const std::string out = "<tool_call>" + std::string(100000, '[') + "</tool_call>";
  const ParsedAssistantMessage m = parse(ToolCallFormat::kHermes, out);
  EXPECT_TRUE(m.tool_calls.empty());
  EXPECT_EQ(m.content.size(), out.size());
}

TEST(ToolCallsHermes, StreamHoldsBackOnlyWhatMayBeAMarker) {
  ToolCallStreamParser p(ToolCallFormat::kHermes);
  std::vector<ToolCallDelta> d = p.feed("Checking <tool_");
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].content, "Checking ");  // "<tool_" may open a call
  d = p.feed("call>{\"name\": \"f\", \"arguments\": {\"a\": \"</tool\"}}");
  EXPECT_TRUE(d.empty());  // inside a call: nothing until it closes
  d = p.feed("</tool_call> done");
  ASSERT_EQ(d.size(), 2u);
  ASSERT_TRUE(d[0].call.has_value());
  EXPECT_EQ(d[0].call_index, 0);
  expect_call(*d[0].call, "f", {{"a", "</tool"}});
  EXPECT_EQ(d[1].content, " done");
  EXPECT_TRUE(p.finish().empty());
}

// ---- llama3_json ----------------------------------------------------------

// A hermes output streamed in two pieces cut at `cut`: how many calls it
// gave, and its content.
std::pair<int, std::string> hermes_in_two_pieces(std::string_view out, size_t cut,
                                                 const std::vector<std::string>& bare_call_names) {
  ToolCallStreamParser parser(ToolCallFormat::kHermes, bare_call_names);
  std::vector<ToolCallDelta> deltas = parser.feed(out.substr(0, cut));
  for (ToolCallDelta& d : parser.feed(out.substr(cut))) deltas.push_back(std::move(d));
  for (ToolCallDelta& d : parser.finish()) deltas.push_back(std::move(d));
  std::pair<int, std::string> result{0, ""};
  for (const ToolCallDelta& d : deltas) {
    result.first += d.call ? 1 : 0;
    result.second += d.content;
  }
  return result;
}

TEST(ToolCallsHermes, UntaggedCallOfAKnownFunction) {
  // Qwen2.5-Coder-0.5B answers "auto" requests so, without the tags.
  const std::string bare = "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}";
  const std::vector<std::string> names = {"get_time", "get_weather"};
  ParsedAssistantMessage m = parse_tool_calls(ToolCallFormat::kHermes, "\n" + bare + "\n", names);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  expect_call(m.tool_calls[0], "get_weather", {{"city", "Paris"}});
  EXPECT_EQ(m.content, "");
  // Without the names (the default), or naming another function, it is content.
  EXPECT_TRUE(parse_tool_calls(ToolCallFormat::kHermes, bare).tool_calls.empty());
  m = parse_tool_calls(ToolCallFormat::kHermes, bare, {"get_time"});
  EXPECT_TRUE(m.tool_calls.empty());
  EXPECT_EQ(m.content, bare);
  // JSON that is not a call, or a call cut short, is content too.
  m = parse_tool_calls(ToolCallFormat::kHermes, "{\"city\": \"Paris\"} is the answer", names);
  EXPECT_TRUE(m.tool_calls.empty());
  EXPECT_EQ(m.content, "{\"city\": \"Paris\"} is the answer");
  m = parse_tool_calls(ToolCallFormat::kHermes, bare.substr(0, 30), names);
  EXPECT_TRUE(m.tool_calls.empty());
  EXPECT_EQ(m.content, bare.substr(0, 30));
  // A tagged call may follow; in pieces the result is the same.
  const std::string two = bare + "\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
  m = parse_tool_calls(ToolCallFormat::kHermes, two, names);
  ASSERT_EQ(m.tool_calls.size(), 2u);
  EXPECT_EQ(m.tool_calls[1].name, "get_time");
  for (size_t cut = 1; cut < two.size(); cut += 7) {
    const auto [calls, content] = hermes_in_two_pieces(two, cut, names);
    EXPECT_EQ(calls, 2) << cut;
    EXPECT_EQ(content.find_first_not_of(" \n"), std::string::npos) << cut << ": " << content;
  }
}

TEST(ToolCallsHermes, CallInACodeFenceOrAnotherTagOfAKnownFunction) {
  // Qwen2.5-Coder-1.5B, driven by Codex CLI, answers so instead of <tool_call>.
  const std::string call = "{\"name\": \"exec_command\", \"arguments\": {\"cmd\": \"echo hi > hello.txt\"}}";
  const std::vector<std::string> names = {"exec_command"};
  for (const std::string& out : {"```json\n" + call + "\n```", "```\n" + call + "\n```\n",
                                 "<tools>\n" + call + "\n</tools>", "\n<function_call>" + call + "</function_call>",
                                 "```xml\n<tools>\n" + call + "\n</tools>\n```", "<tools>" + call}) {
    const ParsedAssistantMessage m = parse_tool_calls(ToolCallFormat::kHermes, out, names);
    ASSERT_EQ(m.tool_calls.size(), 1u) << out;
    expect_call(m.tool_calls[0], "exec_command", {{"cmd", "echo hi > hello.txt"}});
    EXPECT_EQ(m.content.find_first_not_of(" \n"), std::string::npos) << out << ": " << m.content;
    for (size_t cut = 1; cut < out.size(); ++cut) {  // in two pieces, cut anywhere: the same
      const auto [calls, content] = hermes_in_two_pieces(out, cut, names);
      EXPECT_EQ(calls, 1) << out << " cut at " << cut;
      EXPECT_EQ(content.find_first_not_of(" \n"), std::string::npos) << out << " cut at " << cut << ": " << content;
    }
  }
  // Text after the call stays content.
  ParsedAssistantMessage m = parse_tool_calls(ToolCallFormat::kHermes, "```json\n" + call + "\n```\nDone.", names);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(test::trimmed(m.content), "Done.");
  // Other fences, other tags, unknown functions and JSON that is no call are content, whole.
  for (const std::string& out : {std::string("```python\nprint(1)\n```"), std::string("```json\n{\"city\": \"Paris\"}\n```"),
                                 "<answer>" + call + "</answer>", "```json\n" + call + "\n```"}) {
    m = parse_tool_calls(ToolCallFormat::kHermes, out, out.find("answer") != std::string::npos ||
                                                              out.find("exec_command") == std::string::npos
                                                          ? names
                                                          : std::vector<std::string>{"get_time"});
    EXPECT_TRUE(m.tool_calls.empty()) << out;
    EXPECT_EQ(m.content, out);
  }
}

TEST(ToolCallsLlama3, JsonAnswerIsACall) {
  for (const std::string& out : {std::string("{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}"),
                                std::string("<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": "
                                            "\"Paris\"}}"),
                                std::string("\n {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n")}) {
    const ParsedAssistantMessage m = parse(ToolCallFormat::kLlama3Json, out);
    EXPECT_EQ(m.content, "") << out;
    ASSERT_EQ(m.tool_calls.size(), 1u) << out;
    expect_call(m.tool_calls[0], "get_weather", {{"city", "Paris"}});
    expect_stream_agrees(ToolCallFormat::kLlama3Json, out);
  }
}

TEST(ToolCallsLlama3, SeveralCallsSeparatedBySemicolons) {
  const std::string out = "{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"k\": \"v;}\"}}";
  const ParsedAssistantMessage m = parse(ToolCallFormat::kLlama3Json, out);
  ASSERT_EQ(m.tool_calls.size(), 2u);
  expect_call(m.tool_calls[0], "a", json::object());
  expect_call(m.tool_calls[1], "b", {{"k", "v;}"}});
  EXPECT_EQ(m.content, "");
  expect_stream_agrees(ToolCallFormat::kLlama3Json, out);
}

TEST(ToolCallsLlama3, TextAndNonCallJsonAreContent) {
  for (const std::string& out :
       {std::string("The answer is {\"name\": \"x\"}."), std::string("{\"city\": \"Paris\"}"),
        std::string("{\"name\": \"f\", \"parameters\": {\"a\": 1"), std::string("<|python_tag|>print(1)")}) {
    const ParsedAssistantMessage m = parse(ToolCallFormat::kLlama3Json, out);
    EXPECT_TRUE(m.tool_calls.empty()) << out;
    EXPECT_EQ(m.content, out);
    expect_stream_agrees(ToolCallFormat::kLlama3Json, out);
  }
}

TEST(ToolCallsLlama3, TextAfterTheCallsIsContent) {
  const std::string out = "{\"name\": \"a\", \"parameters\": {}}\nThat is all.";
  const ParsedAssistantMessage m = parse(ToolCallFormat::kLlama3Json, out);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.content, "That is all.");
  expect_stream_agrees(ToolCallFormat::kLlama3Json, out);
}

// ---- mistral ----------------------------------------------------------------

TEST(ToolCallsMistral, ArrayOfCalls) {
  const std::string out =
      "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, "
      "{\"name\": \"get_time\", \"arguments\": {}}]";
  const ParsedAssistantMessage m = parse(ToolCallFormat::kMistral, out);
  EXPECT_EQ(m.content, "");
  ASSERT_EQ(m.tool_calls.size(), 2u);
  expect_call(m.tool_calls[0], "get_weather", {{"city", "Paris"}});
  expect_call(m.tool_calls[1], "get_time", json::object());
  expect_stream_agrees(ToolCallFormat::kMistral, out);
}

TEST(ToolCallsMistral, NameThenArgsPerCall) {
  const std::string out = "Sure.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]get_time[ARGS]{}";
  const ParsedAssistantMessage m = parse(ToolCallFormat::kMistral, out);
  EXPECT_EQ(m.content, "Sure.");
  ASSERT_EQ(m.tool_calls.size(), 2u);
  expect_call(m.tool_calls[0], "get_weather", {{"city", "Paris"}});
  expect_call(m.tool_calls[1], "get_time", json::object());
  expect_stream_agrees(ToolCallFormat::kMistral, out);
}

TEST(ToolCallsMistral, BrokenCallsAreContent) {
  for (const std::string& out : {std::string("[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {}}, {\"arguments\": {}}]"),
                                std::string("[TOOL_CALLS] [{\"name\": \"f\""),
                                std::string("[TOOL_CALLS] I cannot call tools here."),
                                std::string("[TOOL_CALLS]f[ARGS]{\"a\":")}) {
    const ParsedAssistantMessage m = parse(ToolCallFormat::kMistral, out);
    EXPECT_TRUE(m.tool_calls.empty()) << out;
    EXPECT_EQ(m.content, out);
    expect_stream_agrees(ToolCallFormat::kMistral, out);
  }
}

// ---- qwen3_coder (Qwen3-Coder's template asks for exactly this) -----------------

const std::vector<ToolSignature> kCoderTools = {
    {"get_weather",
     R"({"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},)"
     R"( "metric": {"type": "boolean"}, "ratio": {"type": "number"}, "tags": {"type": "array"},)"
     R"( "opts": {"type": "object"}, "note": {"type": ["string", "null"]}, "n": {"type": ["integer", "string"]}}})"},
    {"run", R"({"type": "object", "properties": {"code": {"type": "string"}}})"}};

ParsedAssistantMessage parse_coder(const std::string& text) {
  return parse_tool_calls(ToolCallFormat::kQwen3Coder, text, {}, kCoderTools);
}

// Whole, byte by byte and in random pieces, with the signatures.
void expect_coder_stream_agrees(const std::string& text) {
  expect_stream_agrees(parse_coder(text), text,
                       [] { return ToolCallStreamParser(ToolCallFormat::kQwen3Coder, {}, kCoderTools); });
}

TEST(ToolCallsQwen3Coder, OneCallAsTheTemplateWritesIt) {
  const std::string out =
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n"
      "</parameter>\n</function>\n</tool_call>";
  const ParsedAssistantMessage m = parse_coder(out);
  EXPECT_EQ(m.content, "");
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].name, "get_weather");
  EXPECT_EQ(m.tool_calls[0].arguments, R"({"city":"Paris","days":3})");
  expect_coder_stream_agrees(out);
  // The arguments keep the order the model wrote them in (llama.cpp's too).
  const ParsedAssistantMessage r = parse_coder(
      "<tool_call>\n<function=get_weather>\n<parameter=days>\n3\n</parameter>\n<parameter=city>\nParis\n</parameter>\n"
      "</function>\n</tool_call>");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"days":3,"city":"Paris"})");
}

TEST(ToolCallsQwen3Coder, ValuesTypedByTheSchema) {
  // As vLLM's qwen3_coder parser: a string stays text (even one that looks
  // like a number or JSON), other types are parsed, Python's True/False too,
  // text that does not parse stays a string, unknown parameters are strings.
  const std::string out =
      "<tool_call>\n<function=get_weather>\n<parameter=city>\n42\n</parameter>\n<parameter=metric>\nTrue\n"
      "</parameter>\n<parameter=ratio>\n0.5\n</parameter>\n<parameter=tags>\n[\"a\", \"b\"]\n</parameter>\n"
      "<parameter=opts>\n{\"x\": {\"y\": null}}\n</parameter>\n<parameter=note>\nnull\n</parameter>\n"
      "<parameter=n>\nseven\n</parameter>\n<parameter=days>\nmany\n</parameter>\n<parameter=extra>\n12\n"
      "</parameter>\n</function>\n</tool_call>";
  const ParsedAssistantMessage m = parse_coder(out);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(json::parse(m.tool_calls[0].arguments),
            json::parse(R"({"city": "42", "metric": true, "ratio": 0.5, "tags": ["a", "b"], "opts": {"x": {"y": null}},)"
                        R"( "note": null, "n": "seven", "days": "many", "extra": "12"})"));
  expect_coder_stream_agrees(out);
}

TEST(ToolCallsQwen3Coder, MultilineStringKeepsItsInnerNewlines) {
  const std::string out =
      "Running it.\n<tool_call>\n<function=run>\n<parameter=code>\ndef f():\n    return 1\n\n</parameter>\n"
      "</function>\n</tool_call>";
  const ParsedAssistantMessage m = parse_coder(out);
  EXPECT_EQ(m.content, "Running it.");
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(json::parse(m.tool_calls[0].arguments).at("code"), "def f():\n    return 1\n");
  expect_coder_stream_agrees(out);
}

TEST(ToolCallsQwen3Coder, ParallelCallsAndMissingClosingTags) {
  const std::string out =
      "<tool_call>\n<function=run>\n<parameter=code>\na\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n"
      "<function=get_weather>\n<parameter=city>\nRome\n</function>\n";
  const ParsedAssistantMessage m = parse_coder(out);
  ASSERT_EQ(m.tool_calls.size(), 2u);
  EXPECT_EQ(m.tool_calls[0].arguments, R"({"code":"a"})");
  EXPECT_EQ(m.tool_calls[1].name, "get_weather");
  EXPECT_EQ(m.tool_calls[1].arguments, R"({"city":"Rome"})");
  EXPECT_EQ(m.content, "");
  expect_coder_stream_agrees(out);
}

TEST(ToolCallsQwen3Coder, CutOrMalformedCallsAreContent) {
  for (const std::string& out : {
           std::string("<tool_call>\n<function=get_weather>\n<parameter=city>\nPar"),
           std::string("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"),
           std::string("<tool_call>\n{\"name\": \"run\", \"arguments\": {}}\n</tool_call>"),
           std::string("<tool_call>\n<function=>\n</function>\n</tool_call>"),
           std::string("<tool_call>\n<function=run>\ncode = 1\n</function>\n</tool_call>"),
       }) {
    const ParsedAssistantMessage m = parse_coder(out);
    EXPECT_TRUE(m.tool_calls.empty()) << out;
    EXPECT_EQ(m.content, std::string(out.substr(0, out.find_last_not_of(" \n") + 1))) << out;
    expect_coder_stream_agrees(out);
  }
  // A malformed call stays text and the next one parses.
  const std::string out =
      "<tool_call>\nnot a call\n</tool_call>\n<tool_call>\n<function=run>\n<parameter=code>\nx\n</parameter>\n"
      "</function>\n</tool_call>";
  const ParsedAssistantMessage m = parse_coder(out);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.content, "<tool_call>\nnot a call\n</tool_call>");
  expect_coder_stream_agrees(out);
}

TEST(ToolCallsQwen3Coder, WithoutSignaturesValuesAreJsonOrText) {
  const ParsedAssistantMessage m = parse_tool_calls(
      ToolCallFormat::kQwen3Coder,
      "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n<parameter=b>\nhi\n</parameter>\n</function>\n"
      "</tool_call>");
  ASSERT_EQ(m.tool_calls.size(), 1u);
  // A function the request does not declare: its values are text (vLLM).
  EXPECT_EQ(m.tool_calls[0].arguments, R"({"a":"1","b":"hi"})");
}

// ---- formats and the JSON scanner ---------------------------------------------

TEST(ToolCallFormats, NamesAndDetectionFromTemplates) {
  for (ToolCallFormat f : {ToolCallFormat::kHermes, ToolCallFormat::kLlama3Json, ToolCallFormat::kMistral,
                           ToolCallFormat::kQwen3Coder, ToolCallFormat::kHarmony}) {
    EXPECT_EQ(tool_call_format_from_name(tool_call_format_name(f)), f);
  }
  EXPECT_FALSE(tool_call_format_from_name("pythonic").has_value());
  // Excerpts of the tool sections of Qwen2.5's, Llama 3.1's and Mistral's templates.
  EXPECT_EQ(detect_tool_call_format("return a json object with function name and arguments within "
                                    "<tool_call></tool_call> XML tags"),
            ToolCallFormat::kHermes);
  EXPECT_EQ(detect_tool_call_format("{{- \"Environment: ipython\\n\" }} ... {{- \"<|python_tag|>\" + "
                                    "tool_call.name }}"),
            ToolCallFormat::kLlama3Json);
  EXPECT_EQ(detect_tool_call_format("{{- \"[TOOL_CALLS] [\" }}"), ToolCallFormat::kMistral);
  // Qwen3-Coder's template shows <tool_call> too: its <function= wins.
  EXPECT_EQ(detect_tool_call_format("<tool_call>\\n<function=example_function_name>\\n<parameter=example_parameter_1>"),
            ToolCallFormat::kQwen3Coder);
  EXPECT_FALSE(detect_tool_call_format("{% for message in messages %}{{ message.content }}{% endfor %}"));
}

TEST(ToolCallFormats, JsonScanFollowsStringsAndNesting) {
  EXPECT_EQ(scan_json_value(R"(  {"a": "}{\"", "b": [1, {"c": "]"}]} tail)", 0).end, 37u);
  EXPECT_EQ(scan_json_value(R"({"a": [1, 2)", 0).status, JsonScan::kIncomplete);
  EXPECT_EQ(scan_json_value(R"({"a": [1, 2}])", 0).status, JsonScan::kInvalid);
  EXPECT_EQ(scan_json_value("x{}", 0).status, JsonScan::kInvalid);
  EXPECT_EQ(scan_json_value("   ", 0).status, JsonScan::kIncomplete);
  EXPECT_EQ(scan_json_value("[[[]]]", 0, 3).status, JsonScan::kComplete);
  EXPECT_EQ(scan_json_value("[[[[]]]]", 0, 3).status, JsonScan::kInvalid);
}

}  // namespace
}  // namespace inferd
