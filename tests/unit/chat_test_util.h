// Shared pieces of the stream-parser tests (chat_harmony_test,
// chat_tool_calls_test): the ways a text is split into a stream, feeding a
// parser those pieces, and comparing the calls with the whole-text parse's.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "chat/tool_calls.h"

namespace inferd::test {

// Without leading and trailing white space.
inline std::string trimmed(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  return b == std::string::npos ? "" : s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

// The cuts of a stream: byte by byte, whole, and twenty random splits
// (seeded by the text's length).
inline std::vector<std::vector<size_t>> stream_splits(const std::string& text) {
  std::vector<size_t> every;
  for (size_t i = 1; i < text.size(); ++i) every.push_back(i);
  std::vector<std::vector<size_t>> splits = {every, {}};
  std::mt19937 rng(static_cast<uint32_t>(text.size()));
  for (int k = 0; k < 20; ++k) {
    std::vector<size_t> cuts;
    for (size_t i = 1; i < text.size(); ++i)
      if (rng() % 5 == 0) cuts.push_back(i);
    splits.push_back(cuts);
  }
  return splits;
}

// The parser's deltas for the text fed in the pieces the cuts make, and then
// finished.
template <class Parser>
auto feed_in_pieces(Parser& parser, const std::string& text, const std::vector<size_t>& cuts) {
  decltype(parser.finish()) deltas;
  size_t at = 0;
  for (size_t cut : cuts) {
    for (auto& d : parser.feed(std::string_view(text).substr(at, cut - at))) deltas.push_back(std::move(d));
    at = cut;
  }
  for (auto& d : parser.feed(std::string_view(text).substr(at))) deltas.push_back(std::move(d));
  for (auto& d : parser.finish()) deltas.push_back(std::move(d));
  return deltas;
}

// A stream's calls against the whole-text parse's, for `text`.
inline void expect_same_calls(const std::vector<ParsedToolCall>& got, const std::vector<ParsedToolCall>& whole,
                              const std::string& text) {
  EXPECT_EQ(got.size(), whole.size()) << text;
  for (size_t i = 0; i < got.size() && i < whole.size(); ++i) {
    EXPECT_EQ(got[i].name, whole[i].name);
    EXPECT_EQ(got[i].arguments, whole[i].arguments);
  }
}

}  // namespace inferd::test
