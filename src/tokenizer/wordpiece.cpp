// WordPiece (see tokenizer/wordpiece.h). The steps are those of Hugging Face
// tokenizers' BertNormalizer, BertPreTokenizer and WordPiece model; the Unicode
// data (general categories, White_Space, NFD, full lowercasing) comes from ICU.
#include "tokenizer/wordpiece.h"

#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>
#include <unicode/utf16.h>

#include <string>
#include <vector>

#include "tokenizer/utf8.h"
#include "tokenizer/vocab.h"

namespace inferd::tok {

namespace {

constexpr std::string_view kWordStart = "\xE2\x96\x81";  // U+2581: the vocabulary's word-initial mark
// tokenizers' WordPiece default: a longer word is one [UNK].
constexpr size_t kMaxCharsPerWord = 100;

// Rust's char::is_whitespace (the White_Space property), which tokenizers uses.
bool is_whitespace(UChar32 c) { return u_hasBinaryProperty(c, UCHAR_WHITE_SPACE); }

// tokenizers' is_control: any "Other" category (Cc, Cf, Cs, Co, Cn) except
// tab, newline and carriage return.
bool is_other_char(UChar32 c) {
  if (c == '\t' || c == '\n' || c == '\r') return false;
  switch (u_charType(c)) {
    case U_CONTROL_CHAR: case U_FORMAT_CHAR: case U_SURROGATE: case U_PRIVATE_USE_CHAR: case U_UNASSIGNED:
      return true;
    default:
      return false;
  }
}

// The CJK ideograph blocks BertNormalizer surrounds with spaces.
bool is_chinese_char(UChar32 c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

// BertPreTokenizer's punctuation: ASCII punctuation or a Unicode P* category.
bool is_punctuation(UChar32 c) {
  if ((c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) || (c >= 0x7B && c <= 0x7E))
    return true;
  switch (u_charType(c)) {
    case U_CONNECTOR_PUNCTUATION: case U_DASH_PUNCTUATION: case U_START_PUNCTUATION: case U_END_PUNCTUATION:
    case U_INITIAL_PUNCTUATION: case U_FINAL_PUNCTUATION: case U_OTHER_PUNCTUATION:
      return true;
    default:
      return false;
  }
}

class WordPieceTokenizer final : public Tokenizer {
 public:
  explicit WordPieceTokenizer(Vocab vocab, int32_t sep) : vocab_(std::move(vocab)), sep_(sep) {
    UErrorCode err = U_ZERO_ERROR;
    nfd_ = unorm2_getNFDInstance(&err);
    if (U_FAILURE(err)) nfd_ = nullptr;
  }

  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const override {
    std::vector<int32_t> out;
    if (add_special && vocab_.bos >= 0) out.push_back(vocab_.bos);  // [CLS]
    for (const Fragment& f : vocab_.partition(text, parse_special)) {
      if (f.token >= 0) {
        out.push_back(f.token);
      } else {
        encode_text(text.substr(f.offset, f.length), out);
      }
    }
    if (add_special && sep_ >= 0) out.push_back(sep_);  // [SEP]
    return out;
  }

  std::string token_to_piece(int32_t id, bool render_special) const override {
    if (id < 0 || id >= vocab_.n_tokens()) return {};
    if (vocab_.has(id, kAttrControl | kAttrUnknown)) return render_special ? vocab_.text[id] : std::string();
    const std::string& t = vocab_.text[id];
    if (t.starts_with(kWordStart)) return " " + t.substr(kWordStart.size());
    return t;
  }

  int32_t n_vocab() const override { return vocab_.n_tokens(); }
  int32_t bos_id() const override { return vocab_.bos; }
  int32_t eos_id() const override { return sep_; }
  bool add_bos() const override { return true; }
  bool is_eog(int32_t) const override { return false; }
  bool is_control(int32_t id) const override {
    return id >= 0 && id < vocab_.n_tokens() && vocab_.has(id, kAttrControl);
  }
  const std::string& token_text(int32_t id) const override { return vocab_.text.at(static_cast<size_t>(id)); }
  std::string model_name() const override { return "bert (wordpiece)"; }

 protected:
  std::string detokenize(const std::vector<int32_t>& ids, bool render_special) const override {
    std::string text;
    for (int32_t id : ids) text += token_to_piece(id, render_special);
    if (!text.empty() && text.front() == ' ') text.erase(0, 1);
    return text;
  }

 private:
  // BertNormalizer (clean text, CJK spacing, NFD with nonspacing marks
  // removed, lowercase), then the words of BertPreTokenizer, each WordPiece'd.
  void encode_text(std::string_view text, std::vector<int32_t>& out) const {
    std::u16string cleaned;
    for (size_t pos = 0; pos < text.size();) {
      const UChar32 c = static_cast<UChar32>(lenient_decode(text, pos));
      if (c == 0 || c == 0xFFFD || is_other_char(c)) continue;
      const UChar32 kept = is_whitespace(c) ? ' ' : c;
      const bool cjk = is_chinese_char(kept);
      if (cjk) cleaned.push_back(u' ');
      append_utf16(cleaned, kept);
      if (cjk) cleaned.push_back(u' ');
    }
    const std::u16string normalized = lowercase(strip_accents(cleaned));

    std::string word;  // UTF-8
    std::vector<size_t> char_ends;
    auto flush = [&] {
      if (!word.empty()) wordpiece(word, char_ends, out);
      word.clear();
      char_ends.clear();
    };
    for (size_t i = 0; i < normalized.size();) {
      UChar32 c;
      U16_NEXT(normalized.data(), i, normalized.size(), c);
      if (is_whitespace(c)) {
        flush();
        continue;
      }
      const bool punct = is_punctuation(c);
      if (punct) flush();
      append_utf8(word, static_cast<uint32_t>(c));
      char_ends.push_back(word.size());
      if (punct) flush();
    }
    flush();
  }

  // Greedy longest match first over the word's characters; a word with a
  // character that no piece covers becomes a single [UNK].
  void wordpiece(const std::string& word, const std::vector<size_t>& char_ends, std::vector<int32_t>& out) const {
    if (char_ends.size() > kMaxCharsPerWord) {
      out.push_back(vocab_.unk);
      return;
    }
    const size_t first_out = out.size();
    std::string key;
    size_t start_char = 0, start = 0;
    while (start < word.size()) {
      int32_t found = -1;
      size_t end_char = char_ends.size();
      for (; end_char > start_char; --end_char) {
        const size_t end = char_ends[end_char - 1];
        key.assign(start == 0 ? kWordStart : std::string_view{});
        key.append(word, start, end - start);
        found = vocab_.find(key);
        if (found >= 0 && !vocab_.has(found, kAttrControl)) break;
        found = -1;
      }
      if (found < 0) {
        out.resize(first_out);
        out.push_back(vocab_.unk);
        return;
      }
      out.push_back(found);
      start_char = end_char;
      start = char_ends[end_char - 1];
    }
  }

  std::u16string strip_accents(const std::u16string& s) const {
    if (!nfd_) return s;
    UErrorCode err = U_ZERO_ERROR;
    std::u16string nfd(s.size() * 3 + 8, u'\0');
    int32_t n = unorm2_normalize(nfd_, s.data(), static_cast<int32_t>(s.size()), nfd.data(),
                                 static_cast<int32_t>(nfd.size()), &err);
    if (err == U_BUFFER_OVERFLOW_ERROR) {
      err = U_ZERO_ERROR;
      nfd.resize(static_cast<size_t>(n));
      n = unorm2_normalize(nfd_, s.data(), static_cast<int32_t>(s.size()), nfd.data(), n, &err);
    }
    if (U_FAILURE(err)) return s;
    nfd.resize(static_cast<size_t>(n));
    std::u16string out;
    for (int32_t i = 0; i < n;) {
      UChar32 c;
      U16_NEXT(nfd.data(), i, n, c);
      if (u_charType(c) != U_NON_SPACING_MARK) append_utf16(out, c);
    }
    return out;
  }

  // Each character lowercased alone, with its full mapping (as tokenizers'
  // NormalizedString::lowercase: no context, so a final sigma stays σ).
  static std::u16string lowercase(const std::u16string& s) {
    std::u16string out;
    out.reserve(s.size());
    char16_t one[2], lower[8];
    for (size_t i = 0; i < s.size();) {
      UChar32 c;
      U16_NEXT(s.data(), i, s.size(), c);
      int32_t len = 0;
      U16_APPEND_UNSAFE(one, len, c);
      UErrorCode err = U_ZERO_ERROR;
      const int32_t n = u_strToLower(lower, 8, one, len, "", &err);
      if (U_FAILURE(err)) {
        out.append(one, static_cast<size_t>(len));
      } else {
        out.append(lower, static_cast<size_t>(n));
      }
    }
    return out;
  }

  static void append_utf16(std::u16string& s, UChar32 c) {
    if (c <= 0xFFFF) {
      s.push_back(static_cast<char16_t>(c));
    } else {
      s.push_back(static_cast<char16_t>(U16_LEAD(c)));
      s.push_back(static_cast<char16_t>(U16_TRAIL(c)));
    }
  }

  Vocab vocab_;
  int32_t sep_;
  const UNormalizer2* nfd_ = nullptr;  // ICU's, owned by ICU
};

}  // namespace

Result<std::unique_ptr<Tokenizer>> make_wordpiece_tokenizer(const gguf::File& file) {
  auto vocab = Vocab::load(file, VocabType::kBpe, /*add_bos_default=*/true, false, false);
  if (!vocab.ok()) return vocab.error();
  // llama.cpp's defaults for a "bert" vocabulary, then the file's keys.
  int32_t sep = vocab->n_tokens() > 102 ? 102 : -1;
  if (file.find("tokenizer.ggml.seperator_token_id")) {
    auto id = file.get_i64("tokenizer.ggml.seperator_token_id");
    if (!id.ok()) return id.error();
    sep = static_cast<int32_t>(*id);
  }
  if (!file.find("tokenizer.ggml.bos_token_id")) vocab->bos = vocab->n_tokens() > 101 ? 101 : -1;
  if (!file.find("tokenizer.ggml.unknown_token_id")) vocab->unk = vocab->n_tokens() > 100 ? 100 : -1;
  vocab->eos = -1;
  vocab->eog.clear();
  const int32_t n = vocab->n_tokens();
  for (int32_t id : {vocab->bos, sep, vocab->unk})
    if (id < 0 || id >= n) return make_error("bert vocabulary: [CLS], [SEP] or [UNK] token id out of range");
  return std::unique_ptr<Tokenizer>(new WordPieceTokenizer(std::move(*vocab), sep));
}

}  // namespace inferd::tok
