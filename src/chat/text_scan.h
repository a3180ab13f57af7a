// Small text scans shared by the output parsers (tool calls, reasoning), which
// read a model's output piece by piece and hold back what may become a marker.
#pragma once
#include <algorithm>
#include <cstddef>
#include <string_view>

namespace inferd::text_scan {

inline bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// The first index at or after i that is not whitespace (s.size() if none).
inline size_t skip_space(std::string_view s, size_t i = 0) {
  while (i < s.size() && is_space(s[i])) ++i;
  return i;
}

inline std::string_view trim_right(std::string_view s) {
  size_t e = s.size();
  while (e > 0 && is_space(s[e - 1])) --e;
  return s.substr(0, e);
}

inline std::string_view trim(std::string_view s) { return trim_right(s.substr(skip_space(s))); }

// The length of the longest end of `text` that begins `marker` (but is not all
// of it): text that may turn out to be a marker once more arrives.
inline size_t partial_marker_at_end(std::string_view text, std::string_view marker) {
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n)
    if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
  return 0;
}

}  // namespace inferd::text_scan
