// Tokenizer::from_gguf and the one concrete tokenizer behind it. The
// algorithms follow llama.cpp's llama-vocab.cpp step for step (including its
// tie-breaking), because token ids must be identical to llama.cpp's:
//  - BPE ("gpt2"): special-token partition, regex pre-tokenization, GPT-2
//    byte-level mapping, merges by rank (lowest rank, then leftmost, first);
//  - SPM ("llama"): special-token partition, spaces to U+2581, optional space
//    prefix, greedy merges of adjacent pieces by token score (highest score,
//    then leftmost, first), byte fallback through <0xXX> tokens.
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <cstdlib>
#include <queue>
#include <unordered_map>

#include "tokenizer/pretokenize.h"
#include "tokenizer/utf8.h"
#include "tokenizer/vocab.h"
#include "tokenizer/wordpiece.h"

namespace inferd {

namespace {

using tok::Vocab;
using tok::VocabType;

constexpr std::string_view kSpmSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's space

struct Symbol {
  int prev;
  int next;
  size_t start;  // byte offset in the word
  size_t n;      // byte length; 0 once merged into its left neighbour
};

// Splits a string into one symbol per UTF-8 character, the way llama.cpp does
// (length from the lead byte only, clipped at the end).
void split_chars(std::string_view s, std::vector<Symbol>& syms) {
  syms.clear();
  size_t off = 0;
  int index = 0;
  while (off < s.size()) {
    const size_t len = std::min(tok::utf8_seq_len(static_cast<uint8_t>(s[off])), s.size() - off);
    syms.push_back(Symbol{index - 1, off + len == s.size() ? -1 : index + 1, off, len});
    off += len;
    ++index;
  }
}

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (true) {
    const size_t m = s.find(from, pos);
    if (m == std::string::npos) break;
    out.append(s, pos, m - pos);
    out.append(to);
    pos = m + from.size();
  }
  out.append(s, pos, std::string::npos);
  s.swap(out);
}

// Byte of a byte token such as "<0xAB>": llama.cpp parses the two characters
// after "<0x" with strtol, so we do too (odd texts then agree as well).
uint8_t byte_token_value(const std::string& t) {
  const std::string digits = t.size() > 3 ? t.substr(3, 2) : std::string();
  return static_cast<uint8_t>(std::strtol(digits.c_str(), nullptr, 16));
}

class GgufTokenizer final : public Tokenizer {
 public:
  static Result<std::unique_ptr<Tokenizer>> create(const gguf::File& file) {
    auto model = file.get_string("tokenizer.ggml.model");
    if (!model.ok()) return make_error("no tokenizer in model file: " + model.error().message);

    std::unique_ptr<GgufTokenizer> t(new GgufTokenizer());
    if (*model == "gpt2") {
      std::string pre;
      if (auto p = file.get_string("tokenizer.ggml.pre"); p.ok()) pre = *p;
      auto spec = tok::pre_tokenizer_spec(pre);
      if (!spec.ok()) return spec.error();
      t->pre_ = std::move(*spec);
      auto vocab = Vocab::load(file, VocabType::kBpe, t->pre_.add_bos_default, t->pre_.clean_spaces,
                               t->pre_.bos_disabled);
      if (!vocab.ok()) return vocab.error();
      t->vocab_ = std::move(*vocab);
      auto splitter = tok::RegexSplitter::create(t->pre_.regexes);
      if (!splitter.ok()) return splitter.error();
      t->splitter_ = std::move(*splitter);
      if (Status s = t->load_merges(file); !s.ok()) return s.error();
      t->name_ = "gpt2 (" + t->pre_.name + ")";
    } else if (*model == "llama") {
      auto vocab = Vocab::load(file, VocabType::kSpm, true, false, false);
      if (!vocab.ok()) return vocab.error();
      t->vocab_ = std::move(*vocab);
      t->name_ = "llama";
    } else if (*model == "bert") {
      return tok::make_wordpiece_tokenizer(file);
    } else {
      return make_error("unsupported tokenizer.ggml.model \"" + *model + "\" (supported: gpt2, llama, bert)");
    }
    t->build_byte_tokens();
    t->build_pieces();
    t->measure_tokens();
    return std::unique_ptr<Tokenizer>(std::move(t));
  }

  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const override {
    return encode_fragments(text, add_special, vocab_.partition(text, parse_special));
  }

  std::vector<int32_t> encode_with_literals(std::string_view text, bool add_special,
                                            std::span<const TextSpan> literal) const override {
    return encode_fragments(text, add_special, vocab_.partition(text, /*parse_special=*/true, literal));
  }

  std::vector<int32_t> encode_continuation(std::string_view text) const override {
    return encode_fragments(text, /*add_special=*/false, vocab_.partition(text, /*parse_special=*/false),
                            /*space_prefix=*/false);
  }

  std::vector<TextSpan> find_special(std::string_view text) const override {
    std::vector<TextSpan> spans;
    for (const tok::Fragment& f : vocab_.partition(text, /*parse_special=*/true))
      if (f.token >= 0 && vocab_.has(f.token, tok::kAttrControl | tok::kAttrUnknown))
        spans.push_back(TextSpan{f.offset, f.length});
    return spans;
  }

  size_t min_tokens(std::string_view text) const override {
    // Invalid UTF-8 is re-encoded before BPE (an overlong form shrinks, a bad
    // byte becomes U+FFFD); the server only ever has valid text.
    if (max_token_bytes_ == 0 || !tok::is_valid_utf8(text)) return 0;
    size_t kept = text.size();
    if (any_droppable_byte_)
      for (char c : text) kept -= droppable_byte_[static_cast<uint8_t>(c)] ? 1 : 0;
    return (kept + max_token_bytes_ - 1) / max_token_bytes_;
  }

  std::vector<int32_t> encode_fragments(std::string_view text, bool add_special,
                                        const std::vector<tok::Fragment>& frags, bool space_prefix = true) const {
    std::vector<int32_t> out;
    if (add_special && vocab_.add_bos) out.push_back(vocab_.bos);
    bool prev_special = space_prefix;  // SPM: a space prefix goes before the first text, unless it continues one
    for (const tok::Fragment& f : frags) {
      if (f.token >= 0) {
        out.push_back(f.token);
        prev_special = true;
        continue;
      }
      const std::string_view raw = text.substr(f.offset, f.length);
      if (vocab_.type == VocabType::kBpe) {
        encode_bpe(raw, out);
      } else {
        std::string s;
        if (vocab_.add_space_prefix && prev_special) s = " ";
        s.append(raw);
        replace_all(s, " ", kSpmSpace);
        encode_spm(s, out);
      }
      prev_special = false;
    }
    if (add_special && vocab_.add_eos) out.push_back(vocab_.eos);
    return out;
  }

  std::string token_to_piece(int32_t id, bool render_special) const override {
    if (id < 0 || id >= vocab_.n_tokens()) return {};
    if (!render_special && vocab_.has(id, tok::kAttrControl | tok::kAttrUnknown)) return {};
    return pieces_[static_cast<size_t>(id)];
  }

  int32_t n_vocab() const override { return vocab_.n_tokens(); }
  int32_t bos_id() const override { return vocab_.bos; }
  int32_t eos_id() const override { return vocab_.eos; }
  bool add_bos() const override { return vocab_.add_bos; }
  bool is_eog(int32_t id) const override { return id >= 0 && vocab_.eog.count(id) > 0; }
  bool is_control(int32_t id) const override {
    return id >= 0 && id < vocab_.n_tokens() && vocab_.has(id, tok::kAttrControl);
  }
  const std::string& token_text(int32_t id) const override {
    static const std::string kEmpty;
    if (id < 0 || id >= vocab_.n_tokens()) return kEmpty;
    return vocab_.text[static_cast<size_t>(id)];
  }
  std::string model_name() const override { return name_; }

 protected:
  std::string detokenize(const std::vector<int32_t>& ids, bool render_special) const override {
    std::string text;
    for (size_t i = 0; i < ids.size(); ++i) {
      std::string piece = token_to_piece(ids[i], render_special);
      // The space prefix added when encoding is taken off the first piece.
      if (i == 0 && vocab_.add_space_prefix && !piece.empty() && piece[0] == ' ') piece.erase(0, 1);
      text += piece;
    }
    if (vocab_.clean_spaces) clean_up_spaces(text);
    return text;
  }

 private:
  GgufTokenizer() = default;

  Status load_merges(const gguf::File& file) {
    const gguf::Value* m = file.find("tokenizer.ggml.merges");
    if (!m) return make_error("byte-level BPE model has no tokenizer.ggml.merges");
    if (!m->is_array() || m->elem_type != gguf::ValueType::STRING) {
      return make_error("tokenizer.ggml.merges is not an array of strings");
    }
    ranks_.reserve(m->strings.size() * 2);
    for (size_t i = 0; i < m->strings.size(); ++i) {
      const std::string& line = m->strings[i];
      // "left right", split at the first space after the first byte. The rank
      // key is the same "left right" text; the first of duplicate rules wins.
      const size_t sp = line.find(' ', 1);
      if (sp == std::string::npos) continue;
      const int32_t rank = static_cast<int32_t>(i);
      if (!ranks_.emplace(line, rank).second) continue;
      const std::string_view first = std::string_view(line).substr(0, sp);
      const std::string_view second = std::string_view(line).substr(sp + 1);
      const int32_t a = vocab_.find(first), b = vocab_.find(second);
      every_merge_is_token_ = every_merge_is_token_ && a >= 0 && b >= 0;
      if (a >= 0 && b >= 0) {
        std::string merged(first);
        merged += second;
        const int32_t merged_id = vocab_.find(merged);
        every_merge_is_token_ = every_merge_is_token_ && merged_id >= 0;
        pair_merges_.emplace(pair_key(a, b), Merge{rank, merged_id});
      }
    }
    const auto& map = tok::byte_level_map();
    for (int b = 0; b < 256; ++b) byte_symbol_id_[b] = vocab_.find(map.byte_to_utf8[b]);
    return {};
  }

  void build_byte_tokens() {
    // SPM byte fallback: "<0xAB>", else the byte itself as a token.
    for (int b = 0; b < 256; ++b) {
      static const char* kHex = "0123456789ABCDEF";
      const char buf[7] = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>', 0};
      int32_t id = vocab_.find(buf);
      if (id < 0) id = vocab_.find(std::string(1, static_cast<char>(b)));
      byte_token_[b] = id;
    }
  }

  // For min_tokens(): a token never covers more input bytes than its text
  // (byte-level BPE text is at least as long as the bytes it stands for;
  // SentencePiece text matches the input with spaces widened to 3 bytes), so
  // the bytes that end up in tokens need at least (bytes / longest text)
  // tokens. Bytes can also vanish: llama.cpp drops a BPE byte whose byte-level
  // symbol is no token (SmolLM2 lacks 21 of them, control characters among
  // them), and a SentencePiece byte with neither a byte token nor an unknown
  // token; those are not counted. BPE bytes merged into a symbol that is no
  // token vanish too, so the bound needs every merge to join tokens into a
  // token (then such a symbol never forms).
  void measure_tokens() {
    for (int b = 0; b < 256; ++b) {
      droppable_byte_[b] = vocab_.type == VocabType::kBpe ? byte_symbol_id_[b] < 0
                                                          : byte_token_[b] < 0 && vocab_.unk < 0;
      any_droppable_byte_ = any_droppable_byte_ || droppable_byte_[b];
    }
    max_token_bytes_ = 0;
    if (vocab_.type == VocabType::kBpe && !every_merge_is_token_) return;
    for (const std::string& t : vocab_.text) max_token_bytes_ = std::max(max_token_bytes_, t.size());
  }

  // Pieces with render_special = true; token_to_piece blanks control tokens.
  void build_pieces() {
    const auto& map = tok::byte_level_map();
    pieces_.resize(vocab_.text.size());
    for (int32_t id = 0; id < vocab_.n_tokens(); ++id) {
      const std::string& t = vocab_.text[static_cast<size_t>(id)];
      std::string& p = pieces_[static_cast<size_t>(id)];
      if (vocab_.has(id, tok::kAttrControl | tok::kAttrUnknown | tok::kAttrUserDefined)) {
        p = t;
      } else if (vocab_.has(id, tok::kAttrNormal)) {
        if (vocab_.type == VocabType::kSpm) {
          p = t;
          replace_all(p, kSpmSpace, " ");
        } else {
          // Byte-level: every code point stands for one byte.
          size_t pos = 0;
          while (pos < t.size()) {
            const uint32_t cp = tok::lenient_decode(t, pos);
            const int b = map.cp_to_byte(cp);
            if (b >= 0) {
              p.push_back(static_cast<char>(b));
            } else {
              // llama.cpp writes such code points out as a marker.
              std::string enc;
              tok::append_utf8(enc, cp);
              p += "[UNK_BYTE_0x";
              static const char* kHex = "0123456789abcdef";
              for (char c : enc) {
                p.push_back(kHex[static_cast<uint8_t>(c) >> 4]);
                p.push_back(kHex[static_cast<uint8_t>(c) & 15]);
              }
              p += t;
              p += "]";
            }
          }
        }
      } else if (vocab_.has(id, tok::kAttrByte)) {
        p.assign(1, static_cast<char>(byte_token_value(t)));
      }
      // UNUSED / UNDEFINED tokens render as nothing.
    }
  }

  // ---- byte-level BPE -----------------------------------------------------
  //
  // A word's symbols are its bytes; symbol text is the byte-level encoding of
  // those bytes, and the symbol also carries the id of that text (-1 if it is
  // not a token). Merge ranks are looked up by id pair; the text-keyed table
  // is only needed for symbols that are not tokens (never, in sane vocabularies).

  void encode_bpe(std::string_view raw, std::vector<int32_t>& out) const {
    // llama.cpp decodes the text to code points first (bad bytes -> U+FFFD).
    // The regexes run on `subject`; the words are cut from `text` at the same
    // offsets (the two differ only where a surrogate slipped through).
    std::string subject;
    const std::string text = tok::lenient_recode(raw, &subject);
    const std::vector<std::string_view> words = splitter_->split(subject);
    BpeScratch scratch;
    for (std::string_view w : words) {
      bpe_word(std::string_view(text).substr(static_cast<size_t>(w.data() - subject.data()), w.size()), out,
               scratch);
    }
  }

  struct BpeBigram {
    int left;
    int right;
    int32_t rank;
    int32_t merged_id;  // id of the merged text, -1 if not a token
    size_t size;
  };
  struct BpeOrder {  // priority_queue is a max-heap: "less" = later
    bool operator()(const BpeBigram& l, const BpeBigram& r) const {
      return l.rank > r.rank || (l.rank == r.rank && l.left > r.left);
    }
  };
  struct BpeScratch {
    std::vector<Symbol> syms;
    std::vector<int32_t> ids;
    std::vector<BpeBigram> heap;
    std::string a, b;
  };

  // Byte-level text of word bytes [start, start + n).
  static void byte_level(std::string_view w, size_t start, size_t n, std::string& out) {
    const auto& map = tok::byte_level_map();
    out.clear();
    for (size_t k = start; k < start + n; ++k) out += map.byte_to_utf8[static_cast<uint8_t>(w[k])];
  }

  void bpe_word(std::string_view w, std::vector<int32_t>& out, BpeScratch& sc) const {
    if (w.empty()) return;
    if (pre_.ignore_merges) {
      byte_level(w, 0, w.size(), sc.a);
      const int32_t id = vocab_.find(sc.a);
      if (id >= 0) {
        out.push_back(id);
        return;
      }
    }
    std::vector<Symbol>& syms = sc.syms;
    std::vector<int32_t>& ids = sc.ids;
    syms.clear();
    ids.clear();
    const int n = static_cast<int>(w.size());
    for (int i = 0; i < n; ++i) {
      syms.push_back(Symbol{i - 1, i + 1 == n ? -1 : i + 1, static_cast<size_t>(i), 1});
      ids.push_back(byte_symbol_id_[static_cast<uint8_t>(w[static_cast<size_t>(i)])]);
    }
    sc.heap.clear();
    std::priority_queue<BpeBigram, std::vector<BpeBigram>, BpeOrder> queue(BpeOrder{}, std::move(sc.heap));
    auto try_add = [&](int left, int right) {
      if (left < 0 || right < 0) return;
      const Symbol& l = syms[static_cast<size_t>(left)];
      const Symbol& r = syms[static_cast<size_t>(right)];
      const int32_t il = ids[static_cast<size_t>(left)], ir = ids[static_cast<size_t>(right)];
      if (il >= 0 && ir >= 0) {
        auto it = pair_merges_.find(pair_key(il, ir));
        if (it == pair_merges_.end()) return;
        queue.push(BpeBigram{left, right, it->second.rank, it->second.merged_id, l.n + r.n});
        return;
      }
      byte_level(w, l.start, l.n, sc.a);
      byte_level(w, r.start, r.n, sc.b);
      const size_t left_len = sc.a.size();
      sc.a += ' ';
      sc.a += sc.b;
      auto it = ranks_.find(sc.a);
      if (it == ranks_.end()) return;
      sc.a.erase(left_len, 1);
      queue.push(BpeBigram{left, right, it->second, vocab_.find(sc.a), l.n + r.n});
    };
    for (int i = 1; i < n; ++i) try_add(i - 1, i);
    while (!queue.empty()) {
      const BpeBigram bg = queue.top();
      queue.pop();
      Symbol& l = syms[static_cast<size_t>(bg.left)];
      Symbol& r = syms[static_cast<size_t>(bg.right)];
      // Stale: one side has changed since this pair was queued.
      if (l.n == 0 || r.n == 0 || l.n + r.n != bg.size) continue;
      l.n += r.n;
      r.n = 0;
      ids[static_cast<size_t>(bg.left)] = bg.merged_id;
      l.next = r.next;
      if (r.next >= 0) syms[static_cast<size_t>(r.next)].prev = bg.left;
      try_add(l.prev, bg.left);
      try_add(bg.left, l.next);
    }
    for (int i = 0; i < n; ++i) {
      const Symbol& sym = syms[static_cast<size_t>(i)];
      if (sym.n == 0) continue;
      if (ids[static_cast<size_t>(i)] >= 0) {
        out.push_back(ids[static_cast<size_t>(i)]);
        continue;
      }
      // Not a token: llama.cpp looks up each byte of the byte-level text on
      // its own and drops the misses.
      byte_level(w, sym.start, sym.n, sc.a);
      for (char c : sc.a) {
        const int32_t bid = vocab_.find(std::string_view(&c, 1));
        if (bid >= 0) out.push_back(bid);
      }
    }
  }

  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }

  // ---- SentencePiece-style BPE --------------------------------------------

  struct SpmBigram {
    int left;
    int right;
    float score;
    size_t size;
  };
  struct SpmOrder {
    bool operator()(const SpmBigram& l, const SpmBigram& r) const {
      return l.score < r.score || (l.score == r.score && l.left > r.left);
    }
  };

  void encode_spm(const std::string& s, std::vector<int32_t>& out) const {
    std::vector<Symbol> syms;
    split_chars(s, syms);
    std::priority_queue<SpmBigram, std::vector<SpmBigram>, SpmOrder> queue;
    auto try_add = [&](int left, int right) {
      if (left < 0 || right < 0) return;
      const Symbol& l = syms[static_cast<size_t>(left)];
      const Symbol& r = syms[static_cast<size_t>(right)];
      const int32_t id = vocab_.find(std::string_view(s.data() + l.start, l.n + r.n));
      if (id < 0) return;
      queue.push(SpmBigram{left, right, vocab_.score[static_cast<size_t>(id)], l.n + r.n});
    };
    for (int i = 1; i < static_cast<int>(syms.size()); ++i) try_add(i - 1, i);
    while (!queue.empty()) {
      const SpmBigram b = queue.top();
      queue.pop();
      Symbol& l = syms[static_cast<size_t>(b.left)];
      Symbol& r = syms[static_cast<size_t>(b.right)];
      if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) continue;
      l.n += r.n;
      r.n = 0;
      l.next = r.next;
      if (r.next >= 0) syms[static_cast<size_t>(r.next)].prev = b.left;
      try_add(l.prev, b.left);
      try_add(b.left, l.next);
    }
    if (syms.empty()) return;
    for (int i = 0; i != -1; i = syms[static_cast<size_t>(i)].next) {
      const Symbol& sym = syms[static_cast<size_t>(i)];
      const std::string_view piece(s.data() + sym.start, sym.n);
      const int32_t id = vocab_.find(piece);
      if (id >= 0) {
        out.push_back(id);
        continue;
      }
      // Every merged piece is a token, so this is a single character that is
      // not in the vocabulary: fall back to its bytes.
      for (char c : piece) {
        const int32_t bid = byte_token_[static_cast<uint8_t>(c)];
        if (bid >= 0) {
          out.push_back(bid);
        } else if (vocab_.unk >= 0) {
          out.push_back(vocab_.unk);
        }
      }
    }
  }

  // llama.cpp's detokenize clean-up for models with clean_spaces (" ." -> ".",
  // " ' " -> "'", " 's" -> "'s", ...). Three in-place passes, kept byte for
  // byte as llama.cpp does them (a later step may read a byte an earlier step
  // of the same pass has overwritten).
  static void clean_up_spaces(std::string& t) {
    size_t n = t.size();
    size_t total = n ? 1 : 0;
    for (size_t i = 1; i < n; ++i) {
      const char x = t[i];
      if (t[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) --total;
      t[total++] = x;
    }
    t.resize(total);

    n = t.size();
    total = n ? 1 : 0;
    for (size_t i = 1; i < n; ++i) {
      const char x = t[i];
      if (x == '\'' && i + 1 < n && t[i - 1] == ' ' && t[i + 1] == ' ') {
        --total;       // drop the space before
        t[++i] = '\0';  // and skip the one after
      }
      t[total++] = x;
    }
    t.resize(total);

    n = t.size();
    total = n ? 1 : 0;
    for (size_t i = 1; i < n; ++i) {
      const char x = t[i];
      if (t[i - 1] == ' ' && x == '\'' && i + 1 < n) {
        const char x1 = t[i + 1];
        if (x1 == 's' || x1 == 'm') {
          --total;
        } else if (x1 != 't' && x1 != 'd' && i + 2 < n) {
          const char x2 = t[i + 2];
          if ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')) --total;
        }
      }
      t[total++] = x;
    }
    t.resize(total);
  }

  Vocab vocab_;
  tok::PreTokenizerSpec pre_;
  std::unique_ptr<tok::RegexSplitter> splitter_;
  struct Merge {
    int32_t rank;
    int32_t merged_id;
  };
  tok::TextToId ranks_;                               // "left right" -> merge rank
  std::unordered_map<uint64_t, Merge> pair_merges_;  // (left id, right id) -> merge
  int32_t byte_symbol_id_[256] = {};                 // token of each byte's byte-level text
  int32_t byte_token_[256] = {};
  std::vector<std::string> pieces_;
  std::string name_;
  // For min_tokens().
  bool every_merge_is_token_ = true;  // BPE: every merge joins two tokens into a token
  bool droppable_byte_[256] = {};     // the byte may give no token
  bool any_droppable_byte_ = false;
  size_t max_token_bytes_ = 0;        // 0: no sound bound
};

}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_gguf(const gguf::File& file) {
  return GgufTokenizer::create(file);
}

std::vector<int32_t> Tokenizer::encode_with_literals(std::string_view text, bool add_special,
                                                     std::span<const TextSpan> literal) const {
  // A tokenizer without special tokens to find: nothing can be forged, but
  // with literal spans given, no text is trusted to be special either.
  return encode(text, add_special, /*parse_special=*/literal.empty());
}

std::vector<int32_t> encode_pair(const Tokenizer& tok, std::string_view a, std::string_view b) {
  std::vector<int32_t> ids;
  if (tok.bos_id() >= 0) ids.push_back(tok.bos_id());
  for (std::string_view text : {a, b}) {
    const std::vector<int32_t> part = tok.encode(text, /*add_special=*/false, /*parse_special=*/false);
    ids.insert(ids.end(), part.begin(), part.end());
    if (tok.eos_id() >= 0) ids.push_back(tok.eos_id());
  }
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool render_special) const {
  return detokenize(ids, render_special);
}

std::string Tokenizer::detokenize(const std::vector<int32_t>& ids, bool render_special) const {
  std::string text;
  for (int32_t id : ids) text += token_to_piece(id, render_special);
  return text;
}

std::string IncrementalDecoder::push(int32_t id) {
  pending_ += tok_.token_to_piece(id, render_special_);
  const size_t n = tok::utf8_complete_prefix(pending_);
  std::string out;
  tok::append_valid_utf8(out, std::string_view(pending_).substr(0, n));
  pending_.erase(0, n);
  return out;
}

std::string IncrementalDecoder::flush() {
  std::string out;
  tok::append_valid_utf8(out, pending_);
  pending_.clear();
  return out;
}

}  // namespace inferd
