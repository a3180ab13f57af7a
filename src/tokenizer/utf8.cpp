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

std::string lenient_recode(std::string_view text, std::string* subject) {
  std::string out;
  out.reserve(text.size() + 8);
  bool has_surrogate = false;
  size_t pos = 0;
  while (pos < text.size()) {
    uint32_t cp = lenient_decode(text, pos);
    if (cp > 0x10FFFF) cp = 0xFFFD;
    has_surrogate |= cp >= 0xD800 && cp <= 0xDFFF;
    append_utf8(out, cp);
  }
  if (subject) {
    *subject = out;
    if (has_surrogate) {
      // ED A0..BF xx -> EF BF BD: same length, so offsets carry over.
      for (size_t i = 0; i + 2 < subject->size(); ++i) {
        if (static_cast<uint8_t>((*subject)[i]) == 0xED && (static_cast<uint8_t>((*subject)[i + 1]) & 0xE0) == 0xA0) {
          subject->replace(i, 3, "\xEF\xBF\xBD");
          i += 2;
        }
      }
    }
  }
  return out;
}

namespace {

enum class Seq { kValid, kTruncated, kInvalid };

// Classifies the bytes at s[i]: a well-formed sequence of `len` bytes, a valid
// but incomplete one running to the end of `s` (`len` bytes so far), or an
// ill-formed one whose maximal subpart (the bytes that still looked valid) is
// `len` >= 1 bytes long and becomes one U+FFFD.
Seq sequence_at(std::string_view s, size_t i, size_t& len) {
  const uint8_t b0 = static_cast<uint8_t>(s[i]);
  len = 1;
  if (b0 < 0x80) return Seq::kValid;
  size_t need;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;  // no overlong forms
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;  // no overlong forms
    if (b0 == 0xF4) hi = 0x8F;  // nothing past U+10FFFF
  } else {
    return Seq::kInvalid;
  }
  for (size_t k = 1; k < need; ++k) {
    if (i + k >= s.size()) {
      len = k;
      return Seq::kTruncated;
    }
    const uint8_t b = static_cast<uint8_t>(s[i + k]);
    if (k == 1 ? (b < lo || b > hi) : (b & 0xC0) != 0x80) {
      len = k;
      return Seq::kInvalid;
    }
  }
  len = need;
  return Seq::kValid;
}

}  // namespace

size_t utf8_complete_prefix(std::string_view s) {
  size_t i = 0, len = 0;
  while (i < s.size()) {
    if (sequence_at(s, i, len) == Seq::kTruncated) return i;
    i += len;
  }
  return i;
}

void append_valid_utf8(std::string& out, std::string_view s) {
  size_t i = 0, len = 0;
  while (i < s.size()) {
    if (sequence_at(s, i, len) == Seq::kValid) {
      out.append(s.substr(i, len));
    } else {
      out.append("\xEF\xBF\xBD");
    }
    i += len;
  }
}

bool is_valid_utf8(std::string_view s) {
  size_t i = 0, len = 0;
  while (i < s.size()) {
    if (sequence_at(s, i, len) != Seq::kValid) return false;
    i += len;
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
