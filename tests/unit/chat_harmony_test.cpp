// gpt-oss's harmony output (chat/harmony.h): analysis -> reasoning, final ->
// content, messages to functions.NAME -> tool calls (the recipient in the
// channel or in the role, with or without <|constrain|>), preambles, calls cut
// or malformed kept as content, and every way of splitting a stream giving
// what the whole-text parse gives. Cases written after the outputs vLLM's
// openai_harmony and llama-server's gpt-oss parser take (their tests).
#include "chat/harmony.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "chat_test_util.h"
#include "test_data.h"

namespace inferd {
namespace {

using nlohmann::json;

using test::trimmed;

HarmonyMessage parse_in_pieces(const std::string& text, const std::vector<size_t>& cuts, bool calls = true) {
  HarmonyStreamParser parser(calls);
  HarmonyMessage m;
  int next_index = 0;
  for (HarmonyDelta& d : test::feed_in_pieces(parser, text, cuts)) {
    // Each delta is one thing: reasoning, content or a call.
    EXPECT_LE(int(!d.reasoning.empty()) + int(!d.content.empty()) + int(d.call.has_value()), 1);
    m.reasoning += d.reasoning;
    m.content += d.content;
    if (d.call) {
      EXPECT_EQ(d.call_index, next_index++);
      m.tool_calls.push_back(std::move(*d.call));
    }
  }
  m.content = trimmed(m.content);
  m.reasoning = trimmed(m.reasoning);
  return m;
}

// Byte by byte, whole, and in random pieces: the same message.
HarmonyMessage parse_checked(const std::string& text, bool calls = true) {
  const HarmonyMessage whole = parse_harmony(text, calls);
  for (const auto& cuts : test::stream_splits(text)) {
    const HarmonyMessage m = parse_in_pieces(text, cuts, calls);
    EXPECT_EQ(m.reasoning, whole.reasoning) << text;
    EXPECT_EQ(m.content, whole.content) << text;
    test::expect_same_calls(m.tool_calls, whole.tool_calls, text);
  }
  return whole;
}

TEST(Harmony, AnalysisThenFinal) {
  const HarmonyMessage m = parse_checked(
      "<|channel|>analysis<|message|>User says hi. Reply.<|end|><|start|>assistant<|channel|>final<|message|>"
      "Hello! How can I help?<|return|>");
  EXPECT_EQ(m.reasoning, "User says hi. Reply.");
  EXPECT_EQ(m.content, "Hello! How can I help?");
  EXPECT_TRUE(m.tool_calls.empty());
}

TEST(Harmony, EndTokenLeftOutOfTheText) {
  // The engine stops on <|return|> and does not put it in the text.
  const HarmonyMessage m = parse_checked(
      "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Answer.");
  EXPECT_EQ(m.reasoning, "Think.");
  EXPECT_EQ(m.content, "Answer.");
}

TEST(Harmony, FinalOnlyAndFinalWithConstraint) {
  EXPECT_EQ(parse_checked("<|channel|>final<|message|>Just the answer.").content, "Just the answer.");
  const HarmonyMessage m = parse_checked("<|channel|>final <|constrain|>json<|message|>{\"a\": 1}");
  EXPECT_EQ(m.content, "{\"a\": 1}");
  EXPECT_EQ(m.reasoning, "");
}

TEST(Harmony, CutInTheAnalysisIsAllReasoning) {
  const HarmonyMessage m = parse_checked("<|channel|>analysis<|message|>We need to think about");
  EXPECT_EQ(m.reasoning, "We need to think about");
  EXPECT_EQ(m.content, "");
}

TEST(Harmony, SeveralAnalysisMessagesJoinWithANewline) {
  const HarmonyMessage m = parse_checked(
      "<|channel|>analysis<|message|>First.<|end|><|start|>assistant<|channel|>analysis<|message|>Second.<|end|>"
      "<|start|>assistant<|channel|>final<|message|>Done.");
  EXPECT_EQ(m.reasoning, "First.\nSecond.");
  EXPECT_EQ(m.content, "Done.");
}

TEST(Harmony, ToolCallRecipientInTheChannel) {
  const HarmonyMessage m = parse_checked(
      "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
      "to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>");
  EXPECT_EQ(m.reasoning, "Need weather.");
  EXPECT_EQ(m.content, "");
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].name, "get_weather");
  EXPECT_EQ(json::parse(m.tool_calls[0].arguments), json::parse(R"({"city":"Paris"})"));
}

TEST(Harmony, ToolCallRecipientInTheRole) {
  // As the template renders earlier calls (and gpt-oss often writes them).
  for (const std::string& text :
       {std::string("<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Oslo\"}"),
        std::string(" to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>{\"city\": \"Oslo\"}<|call|>"),
        std::string("<|channel|>analysis<|message|>x<|end|><|start|>assistant to=functions.get_weather<|channel|>"
                    "commentary<|message|>{\"city\": \"Oslo\"}")}) {
    const HarmonyMessage m = parse_checked(text);
    ASSERT_EQ(m.tool_calls.size(), 1u) << text;
    EXPECT_EQ(m.tool_calls[0].name, "get_weather");
    EXPECT_EQ(m.tool_calls[0].arguments, R"({"city":"Oslo"})");
    EXPECT_EQ(m.content, "");
  }
}

TEST(Harmony, ArgumentsKeepTheModelsKeyOrder) {
  const HarmonyMessage m = parse_checked("<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"b\": 1, \"a\": [2]}");
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].arguments, R"({"b":1,"a":[2]})");
}

TEST(Harmony, CallInTheAnalysisChannel) {
  // llama-server takes a recipient in the analysis channel as a call too.
  const HarmonyMessage m =
      parse_checked("<|channel|>analysis to=functions.f <|constrain|>json<|message|>{}<|call|>");
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].name, "f");
  EXPECT_EQ(m.tool_calls[0].arguments, "{}");
}

TEST(Harmony, PreambleIsContent) {
  // commentary without a recipient: content, as llama-server has it.
  const HarmonyMessage m = parse_checked(
      "<|channel|>analysis<|message|>Plan.<|end|><|start|>assistant<|channel|>commentary<|message|>Let me check."
      "<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
      "{\"city\":\"Rome\"}<|call|>");
  EXPECT_EQ(m.reasoning, "Plan.");
  EXPECT_EQ(m.content, "Let me check.");
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].name, "get_weather");
}

TEST(Harmony, CutOrMalformedCallIsContent) {
  HarmonyMessage m = parse_checked(
      "<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather "
      "<|constrain|>json<|message|>{\"city\": \"Par");
  EXPECT_TRUE(m.tool_calls.empty());
  EXPECT_EQ(m.content, "{\"city\": \"Par");
  EXPECT_EQ(m.reasoning, "x");
  m = parse_checked("<|channel|>commentary to=functions.f<|message|>[1, 2]<|call|>");
  EXPECT_TRUE(m.tool_calls.empty());
  EXPECT_EQ(m.content, "[1, 2]");
  m = parse_checked("<|channel|>commentary to=functions.f<|message|>{\"a\": 1} trailing<|call|>");
  EXPECT_TRUE(m.tool_calls.empty());
  EXPECT_EQ(m.content, "{\"a\": 1} trailing");
  // Hostile nesting: text, not a crash.
  const std::string deep(100000, '[');
  m = parse_harmony("<|channel|>commentary to=functions.f<|message|>" + deep);
  EXPECT_TRUE(m.tool_calls.empty());
}

TEST(Harmony, CallsNotParsedAreContent) {
  // tool_choice "none" (or no tools): a call's JSON is content.
  const HarmonyMessage m = parse_checked(
      "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\":1}<|call|>", /*calls=*/false);
  EXPECT_TRUE(m.tool_calls.empty());
  EXPECT_EQ(m.content, "{\"a\":1}");
  // A recipient other than a function (a built-in tool): its body as content.
  EXPECT_EQ(parse_checked("<|channel|>commentary to=browser.search<|message|>{\"q\":\"x\"}").content, "{\"q\":\"x\"}");
}

TEST(Harmony, TextWithoutHeadersIsContent) {
  EXPECT_EQ(parse_checked("Hello there, no channels.").content, "Hello there, no channels.");
  EXPECT_EQ(parse_checked("").content, "");
  // A header cut before <|message|> says nothing.
  const HarmonyMessage m = parse_checked("<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>fin");
  EXPECT_EQ(m.reasoning, "a");
  EXPECT_EQ(m.content, "");
}

TEST(Harmony, StreamHoldsBackOnlyWhatMayBeAMarker) {
  HarmonyStreamParser p;
  std::vector<HarmonyDelta> d = p.feed("<|channel|>analysis<|message|>abc<|e");
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].reasoning, "abc");
  d = p.feed("nd|><|start|>assistant<|channel|>final<|message|>Hi");
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].content, "Hi");
  d = p.feed(" there");
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].content, " there");
  EXPECT_TRUE(p.finish().empty());
}

// llama.cpp's own parsers (tools/reference/chat_parsers_llamacpp.cpp) on the
// same outputs: equal reasoning, content and calls, except the cases marked
// with why inferd differs (those are checked to still differ, so the notes
// stay true).
TEST(Harmony, AgreesWithLlamaCpp) {
  std::ifstream f(inferd::test::test_data_root() + "/chat/output_parsers_llamacpp.json");
  std::stringstream ss;
  ss << f.rdbuf();
  const json file = json::parse(ss.str());
  std::vector<ToolSignature> sigs;
  for (const json& t : file.at("tools")) sigs.push_back({t["function"]["name"], t["function"]["parameters"].dump()});
  size_t agreed = 0;
  for (const json& c : file.at("cases")) {
    const std::string output = c.at("output");
    json ours = {{"reasoning", ""}, {"content", ""}, {"calls", json::array()}};
    if (c.at("format") == "harmony") {
      const HarmonyMessage m = parse_harmony(output);
      ours["reasoning"] = m.reasoning;
      ours["content"] = m.content;
      for (const ParsedToolCall& call : m.tool_calls) ours["calls"].push_back({call.name, json::parse(call.arguments)});
    } else {
      const ParsedAssistantMessage m = parse_tool_calls(ToolCallFormat::kQwen3Coder, output, {}, sigs);
      ours["content"] = m.content;
      for (const ParsedToolCall& call : m.tool_calls) ours["calls"].push_back({call.name, json::parse(call.arguments)});
    }
    const json& ref = c.at("llamacpp");
    json theirs = {{"reasoning", trimmed(ref.value("reasoning", ""))},
                   {"content", trimmed(ref.value("content", ""))},
                   {"calls", json::array()}};
    for (const json& call : ref.value("calls", json::array())) {
      const json args = json::parse(call[1].get<std::string>(), nullptr, /*allow_exceptions=*/false);
      theirs["calls"].push_back({call[0], args.is_discarded() ? json(call[1]) : args});
    }
    if (ref.contains("error")) theirs = {{"error", ref["error"]}};
    if (c.contains("why")) {
      EXPECT_NE(ours, theirs) << "no longer differs: " << c.at("why") << "\n" << output;
    } else {
      EXPECT_EQ(ours, theirs) << output;
      ++agreed;
    }
  }
  EXPECT_GE(agreed, 12u);
}

TEST(Harmony, DetectionFromTemplates) {
  EXPECT_TRUE(template_uses_harmony("{{ '<|start|>assistant<|channel|>final<|message|>' }}"));
  EXPECT_FALSE(template_uses_harmony("{{ '<|im_start|>assistant' }}"));
  EXPECT_EQ(detect_tool_call_format("... <|channel|>commentary ... <tool_call> ..."), ToolCallFormat::kHarmony);
  EXPECT_EQ(tool_call_format_from_name("openai"), ToolCallFormat::kHarmony);
  EXPECT_EQ(tool_call_format_from_name("harmony"), ToolCallFormat::kHarmony);
}

}  // namespace
}  // namespace inferd
