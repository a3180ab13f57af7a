// Reasoning parsing (chat/reasoning.h) on outputs written the way thinking
// models write them: Qwen3 (the output opens <think>), DeepSeek-R1 (the prompt
// opened it), thinking cut by max_tokens, no thinking at all, text before
// <think>; and every way of splitting a stream.
#include "chat/reasoning.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace inferd {
namespace {

struct Split {
  std::string reasoning, content;
  bool content_before_reasoning_ended = false;  // a content piece came while reasoning was still arriving
};

// Fed in pieces cut at `cuts`: the deltas joined, and whether the stream ever
// gave reasoning after content (it must not).
Split parse_in_pieces(bool starts_inside, const std::string& text, const std::vector<size_t>& cuts) {
  ReasoningStreamParser parser(starts_inside);
  Split s;
  auto take = [&](const ReasoningDelta& d) {
    if (!d.reasoning.empty() && !s.content.empty()) s.content_before_reasoning_ended = true;
    s.reasoning += d.reasoning;
    s.content += d.content;
  };
  size_t at = 0;
  for (size_t cut : cuts) {
    take(parser.feed(std::string_view(text).substr(at, cut - at)));
    at = cut;
  }
  take(parser.feed(std::string_view(text).substr(at)));
  take(parser.finish());
  return s;
}

// The whole parse gives (reasoning, content); so does every split into two
// and three pieces, and one byte at a time.
void expect_parse(bool starts_inside, const std::string& text, const std::string& reasoning,
                  const std::string& content) {
  const ReasoningDelta whole = parse_reasoning(starts_inside, text);
  EXPECT_EQ(whole.reasoning, reasoning) << text;
  EXPECT_EQ(whole.content, content) << text;
  std::vector<std::vector<size_t>> splits;
  std::vector<size_t> every;
  for (size_t i = 1; i < text.size(); ++i) {
    every.push_back(i);
    splits.push_back({i});
    for (size_t j = i + 1; j < text.size(); ++j) splits.push_back({i, j});
  }
  splits.push_back(every);
  for (const std::vector<size_t>& cuts : splits) {
    const Split s = parse_in_pieces(starts_inside, text, cuts);
    std::string where;
    for (size_t c : cuts) where += std::to_string(c) + " ";
    ASSERT_EQ(s.reasoning, reasoning) << text << " cut at " << where;
    ASSERT_EQ(s.content, content) << text << " cut at " << where;
    ASSERT_FALSE(s.content_before_reasoning_ended) << text << " cut at " << where;
  }
}

TEST(ReasoningParser, Qwen3ThinksThenAnswers) {
  // As Qwen3 writes it: <think> is the first token, a newline after it, two before the answer.
  expect_parse(false, "<think>\nThe user wants a city. Paris.\n</think>\n\nThe capital is Paris.",
               "The user wants a city. Paris.", "The capital is Paris.");
  // JSON after the thinking (a structured answer).
  expect_parse(false, "<think>\nname and population\n</think>\n\n{\"name\": \"Paris\", \"population\": 2100000}",
               "name and population", "{\"name\": \"Paris\", \"population\": 2100000}");
}

TEST(ReasoningParser, EmptyThinking) {
  // Qwen3 with enable_thinking=false writes an empty block when the prompt did not.
  expect_parse(false, "<think>\n\n</think>\n\nHello!", "", "Hello!");
  expect_parse(false, "<think></think>Hi", "", "Hi");
}

TEST(ReasoningParser, NoThinkingIsAllContent) {
  expect_parse(false, "Hello there, how can I help?", "", "Hello there, how can I help?");
  expect_parse(false, "{\"a\": 1}", "", "{\"a\": 1}");
  // A start that looks like the marker but is not: content as written.
  expect_parse(false, "<thin crust> pizza", "", "<thin crust> pizza");
  expect_parse(false, "<", "", "<");
  expect_parse(false, "", "", "");
}

TEST(ReasoningParser, TextBeforeThinkIsContent) {
  // qwen3: only an output that opens <think> thinks; a later <think> is text.
  expect_parse(false, "Sure. <think>hmm</think> Done.", "", "Sure. <think>hmm</think> Done.");
}

TEST(ReasoningParser, LeadingWhitespaceBeforeThink) {
  expect_parse(false, "\n\n<think>a</think>b", "a", "b");
}

TEST(ReasoningParser, CutThinkingIsAllReasoning) {
  // max_tokens ended the output inside the thinking: no content at all.
  expect_parse(false, "<think>\nLet me count: one, two, thr", "Let me count: one, two, thr", "");
  // ... also when the cut falls inside the end marker.
  expect_parse(false, "<think>\nAlmost done </thin", "Almost done </thin", "");
  expect_parse(false, "<think>", "", "");
  expect_parse(false, "<thi", "", "<thi");  // not even the marker: the answer, as written
}

TEST(ReasoningParser, DeepSeekR1StartsInside) {
  // The template ended the prompt with "<think>\n": the output starts thinking.
  expect_parse(true, "Okay, 2 + 2 = 4.\n</think>\n\nThe answer is 4.", "Okay, 2 + 2 = 4.", "The answer is 4.");
  // A model that repeats <think> anyway.
  expect_parse(true, "<think>\nOkay.\n</think>\n\n4", "Okay.", "4");
  // Cut before </think>: all reasoning.
  expect_parse(true, "Okay, so the user", "Okay, so the user", "");
  // Nothing after the thinking.
  expect_parse(true, "hmm</think>", "hmm", "");
}

TEST(ReasoningParser, MarkersInsideThinkingAndAnswer) {
  // Only the first </think> ends the thinking; later markers are answer text.
  expect_parse(false, "<think>a <b> c</think>x </think> y", "a <b> c", "x </think> y");
  // Reasoning keeps inner whitespace and a '<' that is not the marker.
  expect_parse(false, "<think>x <  y\n\n z</think>", "x <  y\n\n z", "");
}

TEST(ReasoningParser, ContentWhitespaceKeptAfterItStarts) {
  expect_parse(false, "<think>r</think>\n\nline one\n\nline two\n", "r", "line one\n\nline two\n");
}

TEST(ReasoningParser, StreamsReasoningBeforeTheEnd) {
  // Reasoning is released as it comes, not held to the end marker.
  ReasoningStreamParser p(false);
  EXPECT_EQ(p.feed("<th").reasoning, "");
  EXPECT_EQ(p.feed("ink>\nStep one").reasoning, "Step one");
  EXPECT_FALSE(p.in_content());
  ReasoningDelta d = p.feed(". </");
  EXPECT_EQ(d.reasoning, ".");  // " </" held: whitespace and a possible marker
  d = p.feed("think>\n\n{\"a\"");
  EXPECT_EQ(d.reasoning, "");
  EXPECT_EQ(d.content, "{\"a\"");
  EXPECT_TRUE(p.in_content());
  EXPECT_EQ(p.feed(": 1}").content, ": 1}");
}

TEST(ReasoningParser, Names) {
  EXPECT_EQ(reasoning_parser_from_name("qwen3"), ReasoningParser::kQwen3);
  EXPECT_EQ(reasoning_parser_from_name("deepseek_r1"), ReasoningParser::kDeepSeekR1);
  EXPECT_EQ(reasoning_parser_from_name("deepseek"), ReasoningParser::kDeepSeekR1);
  EXPECT_EQ(reasoning_parser_from_name("none"), ReasoningParser::kNone);
  EXPECT_EQ(reasoning_parser_from_name("auto"), ReasoningParser::kAuto);
  EXPECT_EQ(reasoning_parser_from_name("granite"), std::nullopt);
}

TEST(ReasoningParser, PromptThinking) {
  EXPECT_EQ(prompt_thinking("<|im_start|>assistant\n<think>\n"), PromptThinking::kOpen);
  EXPECT_EQ(prompt_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n"), PromptThinking::kClosed);
  EXPECT_EQ(prompt_thinking("<|im_start|>assistant\n"), PromptThinking::kNone);
  EXPECT_TRUE(template_thinks("{{ '<think>' + reasoning + '</think>' }}"));
  EXPECT_FALSE(template_thinks("{{ '<|im_start|>assistant\\n' }}"));
}

}  // namespace
}  // namespace inferd
