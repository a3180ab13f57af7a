#include "bench/sse.h"

namespace inferd::bench {

Status SseParser::feed(std::string_view bytes, const Handler& on_event) {
  if (failed_) return make_error("event stream: parser already failed");
  for (size_t i = 0; i < bytes.size(); ++i) {
    const char c = bytes[i];
    if (after_cr_) {
      after_cr_ = false;
      if (c == '\n') continue;
    }
    if (c == '\r' || c == '\n') {
      after_cr_ = c == '\r';
      process_line(line_, on_event);
      line_.clear();
      continue;
    }
    // Copy the run of ordinary bytes up to the next line end at once.
    size_t end = bytes.find_first_of("\r\n", i);
    if (end == std::string_view::npos) end = bytes.size();
    line_.append(bytes.substr(i, end - i));
    i = end - 1;
    if (line_.size() > max_line_bytes_) {
      failed_ = true;
      return make_error("event stream: a line is longer than " + std::to_string(max_line_bytes_) +
                        " bytes");
    }
  }
  return {};
}

void SseParser::finish(const Handler& on_event) {
  if (failed_) return;
  if (!line_.empty()) process_line(line_, on_event);
  line_.clear();
  dispatch(on_event);
}

void SseParser::process_line(std::string_view line, const Handler& on_event) {
  if (first_line_) {
    // A UTF-8 byte order mark may open the stream; it is not part of the line.
    first_line_ = false;
    if (line.starts_with("\xEF\xBB\xBF")) line.remove_prefix(3);
  }
  if (line.empty()) {
    dispatch(on_event);
    return;
  }
  if (line.front() == ':') return;  // comment (keep-alive pings)
  std::string_view field = line, value;
  if (const size_t colon = line.find(':'); colon != std::string_view::npos) {
    field = line.substr(0, colon);
    value = line.substr(colon + 1);
    if (value.starts_with(' ')) value.remove_prefix(1);
  }
  if (field == "data") {
    if (has_data_) pending_.data += '\n';
    pending_.data += value;
    has_data_ = true;
  } else if (field == "event") {
    pending_.event = value;
  } else if (field == "id") {
    pending_.id = value;
  }
  // "retry" and unknown fields do not concern a client that never reconnects.
}

void SseParser::dispatch(const Handler& on_event) {
  if (has_data_) on_event(pending_);
  pending_ = SseEvent{};
  has_data_ = false;
}

}  // namespace inferd::bench
