// The server-sent events parser: framing across arbitrary piece boundaries,
// the three line endings, comments, multi-line data, and a bounded line.
#include <gtest/gtest.h>

#include "bench/sse.h"

namespace inferd::bench {
namespace {

std::vector<SseEvent> parse_in_pieces(const std::string& stream, size_t piece) {
  SseParser parser;
  std::vector<SseEvent> events;
  auto on = [&](const SseEvent& e) { events.push_back(e); };
  for (size_t i = 0; i < stream.size(); i += piece)
    EXPECT_TRUE(parser.feed(std::string_view(stream).substr(i, piece), on));
  parser.finish(on);
  return events;
}

TEST(BenchSse, OpenAiStreamInAnyPieceSize) {
  const std::string stream =
      "data: {\"choices\":[{\"text\":\"a\"}]}\n\n"
      ": keep-alive\n\n"
      "data: {\"choices\":[{\"text\":\"b\"}]}\n\n"
      "data: [DONE]\n\n";
  for (size_t piece : {1, 2, 3, 7, 64, 4096}) {
    const auto events = parse_in_pieces(stream, piece);
    ASSERT_EQ(events.size(), 3u) << "piece " << piece;
    EXPECT_EQ(events[0].data, "{\"choices\":[{\"text\":\"a\"}]}");
    EXPECT_EQ(events[1].data, "{\"choices\":[{\"text\":\"b\"}]}");
    EXPECT_EQ(events[2].data, "[DONE]");
  }
}

TEST(BenchSse, CrLfAndBareCrEndLines) {
  for (size_t piece : {1, 2, 100}) {
    const auto crlf = parse_in_pieces("data: x\r\n\r\ndata: y\r\n\r\n", piece);
    ASSERT_EQ(crlf.size(), 2u);
    EXPECT_EQ(crlf[0].data, "x");
    EXPECT_EQ(crlf[1].data, "y");
    const auto cr = parse_in_pieces("data: x\r\rdata: y\r\r", piece);
    ASSERT_EQ(cr.size(), 2u);
    EXPECT_EQ(cr[1].data, "y");
  }
}

TEST(BenchSse, FieldsCommentsAndMultiLineData) {
  const auto events = parse_in_pieces(
      ":comment only\n\n"                    // no data: nothing dispatched
      "event: update\nid: 7\ndata: one\ndata:two\ndata\n\n"
      "data:  two spaces\n\n"
      "retry: 100\nunknown: z\ndata: after unknown fields\n\n",
      5);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].event, "update");
  EXPECT_EQ(events[0].id, "7");
  EXPECT_EQ(events[0].data, "one\ntwo\n");  // "data" with no colon adds an empty line
  EXPECT_EQ(events[1].data, " two spaces");  // only one space is dropped
  EXPECT_EQ(events[1].event, "");           // fields do not leak into the next event
  EXPECT_EQ(events[2].data, "after unknown fields");
}

TEST(BenchSse, ByteOrderMarkAndUnterminatedLastEvent) {
  const auto events = parse_in_pieces("\xEF\xBB\xBF" "data: first\n\ndata: last", 1);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].data, "first");
  EXPECT_EQ(events[1].data, "last");
}

TEST(BenchSse, RefusesAnEndlessLine) {
  SseParser parser(16);
  auto on = [](const SseEvent&) {};
  EXPECT_TRUE(parser.feed("data: 0123456789", on));
  EXPECT_FALSE(parser.feed("abcdef", on));
  EXPECT_FALSE(parser.feed("\n\n", on));  // stays failed
}

}  // namespace
}  // namespace inferd::bench
