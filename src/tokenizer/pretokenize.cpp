#include "tokenizer/pretokenize.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>

namespace inferd::tok {

namespace {

// The regexes, in llama.cpp's notation (llama-vocab.cpp, llm_tokenizer_bpe).
constexpr const char* kGpt2 =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
constexpr const char* kLlama3 =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr const char* kQwen2 =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
// Qwen3.5: Qwen2's with combining marks (\p{M}) taken into words.
constexpr const char* kQwen35 =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|"
    "\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// gpt-4o (o200k_base, o200k_harmony): llama.cpp's rewrite of tiktoken's pattern
// with lookaheads in place of \p{Lu}/\p{Ll}/\p{Lt}/\p{Lm}/\p{Lo}/\p{M}, which its
// collapsed-category std::regex cannot tell apart: "upper" is any letter but a-z,
// "lower" any letter but A-Z, so a non-ASCII letter is both and marks are no letters.
constexpr const char* kGpt4o =
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+"
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|"
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*"
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|"
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

bool one_of(const std::string& s, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    if (s == n) return true;
  }
  return false;
}

// Unicode White_Space, which is what llama.cpp's tables call whitespace.
constexpr const char* kWhiteSpace =
    "\\x{9}-\\x{D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
    "\\x{205F}\\x{3000}";

// Code points assigned in Unicode 15.0/15.1 that llama.cpp's tables put in a
// category but PCRE2 10.42 (Unicode 14) sees as unassigned. Found by
// tokenizing every code point in several contexts with llama.cpp and with this
// tokenizer, for each supported pre-tokenizer; no other code point differs.
struct ExtraCategory {
  const char* property;  // as written in the regexes
  const char* ranges;    // PCRE2 class items to add
};
constexpr ExtraCategory kExtraCategories[] = {
    // Khojki, Kawi, Egyptian hieroglyphs, small kana, Latin, Cyrillic
    // modifiers, Nag Mundari, CJK (Ext. B addition, Ext. H, Ext. I).
    {"\\p{L}",
     "\\x{1123F}-\\x{11240}\\x{11F02}\\x{11F04}-\\x{11F10}\\x{11F12}-\\x{11F33}\\x{1342F}"
     "\\x{13441}-\\x{13446}\\x{1B132}\\x{1B155}\\x{1DF25}-\\x{1DF2A}\\x{1E030}-\\x{1E06D}"
     "\\x{1E4D0}-\\x{1E4EB}\\x{2B739}\\x{2EBF0}-\\x{2EE5D}\\x{31350}-\\x{323AF}"},
    // Kawi, Kaktovik and Nag Mundari digits.
    {"\\p{N}", "\\x{11F50}-\\x{11F59}\\x{1D2C0}-\\x{1D2D3}\\x{1E4F0}-\\x{1E4F9}"},
    // Devanagari Extended-A and Kawi punctuation.
    {"\\p{P}", "\\x{11B00}-\\x{11B09}\\x{11F43}-\\x{11F4F}"},
};

}  // namespace

Result<PreTokenizerSpec> pre_tokenizer_spec(const std::string& pre) {
  PreTokenizerSpec spec;
  if (pre.empty() || pre == "default") {
    spec.name = "default";
    spec.regexes = {"[\\p{P}\\$\\+<=>\\^~\\|]+", kGpt2, "\\p{N}+", "[0-9][0-9][0-9]"};
  } else if (one_of(pre, {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral",
                          "midm-2.0", "lfm2", "jina-v5-nano"})) {
    spec.name = "llama3";
    spec.regexes = {kLlama3};
    spec.ignore_merges = true;
    spec.add_bos_default = true;
  } else if (one_of(pre, {"dbrx", "smaug-bpe"})) {
    spec.name = pre;
    spec.regexes = {kLlama3};
  } else if (one_of(pre, {"glm4", "chatglm-bpe"})) {
    spec.name = pre;
    spec.regexes = {kLlama3};
    spec.bos_disabled = true;
  } else if (one_of(pre, {"qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2"})) {
    spec.name = "qwen2";
    spec.regexes = {kQwen2};
    spec.clean_spaces = false;
  } else if (pre == "qwen35") {
    spec.name = pre;
    spec.regexes = {kQwen35};
    spec.clean_spaces = false;
  } else if (one_of(pre, {"megrez", "stablelm2"})) {
    spec.name = pre;
    spec.regexes = {kQwen2};
  } else if (one_of(pre, {"smollm", "command-r"})) {
    spec.name = pre;
    spec.regexes = {"\\p{N}", kGpt2};
    spec.clean_spaces = false;
  } else if (one_of(pre, {"starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2"})) {
    spec.name = pre;
    spec.regexes = {"\\p{N}", kGpt2};
  } else if (one_of(pre, {"gpt2", "gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es",
                          "jina-v2-de", "a.x-4.0", "mellum", "modern-bert", "mpt", "olmo", "jais",
                          "exaone4"})) {
    spec.name = "gpt2";
    spec.regexes = {kGpt2};
  } else if (one_of(pre, {"gpt-4o", "llama4", "kanana2", "talkie"})) {
    spec.name = "gpt-4o";
    spec.regexes = {kGpt4o};
    spec.clean_spaces = false;
  } else if (one_of(pre, {"trillion", "granite-docling"})) {
    spec.name = pre;
    spec.regexes = {kGpt2};
    spec.clean_spaces = false;
  } else {
    return make_error("unsupported tokenizer.ggml.pre value \"" + pre + "\"");
  }
  return spec;
}

std::string expand_regex(std::string_view p) {
  std::string out;
  out.reserve(p.size() * 2);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char n = p[i + 1];
      bool expanded = false;
      for (const ExtraCategory& cat : kExtraCategories) {
        const std::string_view prop = cat.property;
        if (p.substr(i, prop.size()) != prop) continue;
        out += in_class ? "" : "[";
        out += prop;
        out += cat.ranges;
        out += in_class ? "" : "]";
        i += prop.size() - 1;
        expanded = true;
        break;
      }
      if (expanded) continue;
      if (n == 's' || n == 'S') {
        if (in_class) {
          // Only \s occurs inside classes in these regexes; \S there would
          // need a negated set, which a class cannot nest.
          out += kWhiteSpace;
        } else {
          out += n == 's' ? "[" : "[^";
          out += kWhiteSpace;
          out += "]";
        }
        ++i;
        continue;
      }
      out += c;
      out += n;
      ++i;
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      // A leading ']' or '^]' is literal in PCRE2; our regexes have none.
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

struct RegexSplitter::Compiled {
  pcre2_code* code = nullptr;
  ~Compiled() {
    if (code) pcre2_code_free(code);
  }
};

RegexSplitter::~RegexSplitter() {
  for (Compiled* c : compiled_) delete c;
}

Result<std::unique_ptr<RegexSplitter>> RegexSplitter::create(const std::vector<std::string>& regexes) {
  std::unique_ptr<RegexSplitter> s(new RegexSplitter());
  for (const std::string& r : regexes) {
    const std::string pattern = expand_regex(r);
    int err = 0;
    PCRE2_SIZE err_off = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                     PCRE2_UTF | PCRE2_UCP, &err, &err_off, nullptr);
    if (!code) {
      std::array<PCRE2_UCHAR, 256> msg{};
      pcre2_get_error_message(err, msg.data(), msg.size());
      return make_error("pre-tokenizer regex does not compile at offset " + std::to_string(err_off) +
                        ": " + reinterpret_cast<const char*>(msg.data()));
    }
    auto* c = new Compiled();
    c->code = code;
    s->compiled_.push_back(c);
    // JIT is an optimisation only: if it is unavailable the interpreter runs.
    (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  }
  return s;
}

std::vector<std::string_view> RegexSplitter::split(std::string_view text) const {
  std::vector<std::string_view> pieces;
  if (text.empty()) return pieces;
  pieces.push_back(text);
  std::vector<std::string_view> next;
  for (const Compiled* c : compiled_) {
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(c->code, nullptr);
    next.clear();
    next.reserve(pieces.size() * 2);
    const char* base = text.data();
    for (std::string_view piece : pieces) {
      // Match inside the piece only: the subject ends where the piece ends, so
      // a lookahead at its end sees end-of-text, as in llama.cpp.
      const size_t begin = static_cast<size_t>(piece.data() - base);
      const size_t end = begin + piece.size();
      size_t pos = begin;
      while (pos < end) {
        const int rc = pcre2_match(c->code, reinterpret_cast<PCRE2_SPTR>(base), end, pos,
                                   PCRE2_NO_UTF_CHECK, md, nullptr);
        if (rc < 0) break;
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
        const size_t m0 = ov[0], m1 = ov[1];
        if (m0 > pos) next.emplace_back(base + pos, m0 - pos);
        if (m1 == m0) {  // empty match: none of our regexes has one; step on
          pos = m0 + 1;
          while (pos < end && (static_cast<uint8_t>(base[pos]) & 0xC0) == 0x80) ++pos;
          if (pos > m0) next.emplace_back(base + m0, pos - m0);
          continue;
        }
        next.emplace_back(base + m0, m1 - m0);
        pos = m1;
      }
      if (pos < end) next.emplace_back(base + pos, end - pos);
    }
    pcre2_match_data_free(md);
    pieces.swap(next);
  }
  return pieces;
}

}  // namespace inferd::tok
