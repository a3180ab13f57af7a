// Incremental parser of a `text/event-stream` body (the EventSource format
// OpenAI-compatible servers stream with): bytes arrive in arbitrary pieces,
// complete events come out.
//
// Lines end with LF, CRLF or CR (a CR at the end of one piece and an LF at the
// start of the next are one line end). `field: value` lines set a field (one
// space after the colon is dropped); several `data` lines join with "\n"; a
// line starting with ':' is a comment; a blank line ends the event, which is
// dispatched if it carried data.
#pragma once
#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

#include "core/result.h"

namespace inferd::bench {

struct SseEvent {
  std::string event;  // "event:" field; empty means "message"
  std::string data;
  std::string id;
};

class SseParser {
 public:
  using Handler = std::function<void(const SseEvent&)>;

  // A line longer than this is refused: a stream that never ends a line
  // must not grow the buffer without bound.
  explicit SseParser(size_t max_line_bytes = size_t{16} << 20) : max_line_bytes_(max_line_bytes) {}

  // Parses `bytes`, calling `on_event` for each event completed by them.
  // After an error the parser stays failed.
  Status feed(std::string_view bytes, const Handler& on_event);

  // End of the stream: dispatches an event whose closing blank line never came
  // (the format says to drop it; servers that close right after their last
  // `data:` line are common enough that a client should not lose it).
  void finish(const Handler& on_event);

 private:
  void process_line(std::string_view line, const Handler& on_event);
  void dispatch(const Handler& on_event);

  size_t max_line_bytes_;
  std::string line_;
  bool after_cr_ = false;  // the previous byte was a CR: a following LF is part of that line end
  bool first_line_ = true;
  bool failed_ = false;
  SseEvent pending_;
  bool has_data_ = false;
};

}  // namespace inferd::bench
