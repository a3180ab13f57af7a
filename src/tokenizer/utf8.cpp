#include "tokenizer/utf8.h"

namespace inferd::tok {

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | ((cp >> 18) & 0x07)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

uint32_t lenient_decode(std::string_view s, size_t& pos) {
  auto byte = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  auto cont = [&](size_t i) { return i < s.size() && (byte(i) & 0xC0) == 0x80; };
  const uint8_t b0 = byte(pos);
  if (b0 < 0x80) {
    pos += 1;
    return b0;
  }
  if ((b0 & 0xE0) == 0xC0 && cont(pos + 1)) {
    const uint32_t cp = ((b0 & 0x1Fu) << 6) | (byte(pos + 1) & 0x3Fu);
    pos += 2;
    return cp;
  }
  if ((b0 & 0xF0) == 0xE0 && cont(pos + 1) && cont(pos + 2)) {
    const uint32_t cp = ((b0 & 0x0Fu) << 12) | ((byte(pos + 1) & 0x3Fu) << 6) | (byte(pos + 2) & 0x3Fu);
    pos += 3;
    return cp;
  }
  if ((b0 & 0xF8) == 0xF0 && cont(pos + 1) && cont(pos + 2) && cont(pos + 3)) {
    const uint32_t cp = ((b0 & 0x07u) << 18) | ((byte(pos + 1) & 0x3Fu) << 12) |
                        ((byte(pos + 2) & 0x3Fu) << 6) | (byte(pos + 3) & 0x3Fu);
    pos += 4;
    return cp;
  }
  pos += 1;
  return 0xFFFD;
}

std::string sanitize_for_split(std::string_view text) {
  if (is_valid_utf8(text)) return std::string(text);
  std::string out;
  out.reserve(text.size() + 8);
  size_t pos = 0;
  while (pos < text.size()) {
    uint32_t cp = lenient_decode(text, pos);
    if ((cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) cp = 0xFFFD;
    append_utf8(out, cp);
  }
  return out;
}

namespace {

// Length of the well-formed sequence starting at s[i], 0 if ill-formed there,
// or -k if the bytes from i to the end are a valid but incomplete prefix.
int sequence_at(std::string_view s, size_t i) {
  const uint8_t b0 = static_cast<uint8_t>(s[i]);
  if (b0 < 0x80) return 1;
  int need;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (int k = 1; k < need; ++k) {
    if (i + k >= s.size()) return -k;
    const uint8_t b = static_cast<uint8_t>(s[i + k]);
    if (k == 1 ? (b < lo || b > hi) : (b & 0xC0) != 0x80) return 0;
  }
  return need;
}

}  // namespace

size_t utf8_complete_prefix(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const int n = sequence_at(s, i);
    if (n < 0) return i;  // incomplete tail
    i += n > 0 ? static_cast<size_t>(n) : 1;
  }
  return i;
}

void append_valid_utf8(std::string& out, std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const int n = sequence_at(s, i);
    if (n > 0) {
      out.append(s.substr(i, static_cast<size_t>(n)));
      i += static_cast<size_t>(n);
    } else {
      // Maximal ill-formed subpart: the lead byte plus any continuation bytes
      // that were still acceptable (-n of them for an incomplete tail).
      out.append("\xEF\xBF\xBD");
      i += n < 0 ? static_cast<size_t>(-n) : 1;
    }
  }
}

bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const int n = sequence_at(s, i);
    if (n <= 0) return false;
    i += static_cast<size_t>(n);
  }
  return true;
}

ByteLevelMap::ByteLevelMap() {
  // Printable Latin-1 bytes stand for themselves; the rest are shifted to
  // U+0100 and up, in byte order.
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    byte_to_cp[b] = printable ? static_cast<uint32_t>(b) : next++;
    byte_to_utf8[b].clear();
    append_utf8(byte_to_utf8[b], byte_to_cp[b]);
  }
  for (auto& r : cp_rev) r = -1;
  for (int b = 0; b < 256; ++b) cp_rev[byte_to_cp[b]] = static_cast<int16_t>(b);
}

int ByteLevelMap::cp_to_byte(uint32_t cp) const {
  return cp < kImageLimit ? cp_rev[cp] : -1;
}

const ByteLevelMap& byte_level_map() {
  static const ByteLevelMap map;
  return map;
}

}  // namespace inferd::tok
