// UTF-8 helpers shared by the tokenizer internals (not part of the public
// contract). Two flavours of decoding on purpose:
//  - lenient_*: decodes the way llama.cpp does before pre-tokenizing (length
//    from the lead byte, only continuation bytes checked, a bad byte becomes
//    U+FFFD), because token ids must follow llama.cpp even on odd input;
//  - strict validation for output (IncrementalDecoder), where we promise
//    well-formed UTF-8.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace inferd::tok {

// Byte length of a UTF-8 sequence from its first byte, as llama.cpp counts it
// (continuation and invalid lead bytes count as 1).
inline size_t utf8_seq_len(uint8_t lead) {
  static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[lead >> 4];
}

void append_utf8(std::string& out, uint32_t cp);

// Lenient decode of one code point at `pos` (advanced past it). Invalid input
// yields U+FFFD and consumes one byte.
uint32_t lenient_decode(std::string_view s, size_t& pos);

// The text as llama.cpp's BPE pre-tokenizer sees it: decoded leniently and
// encoded again, so an invalid byte becomes U+FFFD and an overlong form its
// shortest encoding. A lenient decode can also yield a surrogate, which is kept
// as its 3 bytes (llama.cpp tokenizes those bytes); if `subject` is given it
// receives the same text with surrogates shown as U+FFFD (also 3 bytes, so
// offsets agree), which a UTF-8 regex engine accepts. Code points past
// U+10FFFF, which llama.cpp cannot encode back, become U+FFFD.
std::string lenient_recode(std::string_view text, std::string* subject);

// Length of the longest prefix of `s` that is settled: complete sequences and
// ill-formed bytes; the rest is the start of a sequence more bytes could
// complete (at most 3 bytes).
size_t utf8_complete_prefix(std::string_view s);

// Appends `s` with each maximal ill-formed subpart replaced by one U+FFFD
// (the Unicode "best practice" also used by WHATWG decoders).
void append_valid_utf8(std::string& out, std::string_view s);

bool is_valid_utf8(std::string_view s);

// GPT-2 byte-level mapping: every byte is shown as a printable code point.
// byte_to_cp[b] is that code point; cp_to_byte returns -1 for code points that
// are not images of a byte.
struct ByteLevelMap {
  uint32_t byte_to_cp[256];
  std::string byte_to_utf8[256];
  ByteLevelMap();
  int cp_to_byte(uint32_t cp) const;

 private:
  static constexpr uint32_t kImageLimit = 256 + 68;  // 68 bytes are remapped
  int16_t cp_rev[kImageLimit];
};
const ByteLevelMap& byte_level_map();

}  // namespace inferd::tok
