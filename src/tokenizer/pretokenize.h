// Pre-tokenization for byte-level BPE: the text is cut into words by a list of
// regexes applied one after another (each regex splits every piece left by the
// previous one; text between matches stays a piece of its own), exactly as
// llama.cpp's unicode_regex_split does. Regexes run on PCRE2 (UTF + UCP + JIT).
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace inferd::tok {

// The pre-tokenizer regex list for a tokenizer.ggml.pre value, plus the
// behaviour flags llama.cpp ties to that value.
struct PreTokenizerSpec {
  std::string name;                  // canonical name, for model_name()
  std::vector<std::string> regexes;  // in llama.cpp's notation (see expand_regex)
  bool ignore_merges = false;        // a word that is itself a token skips BPE
  bool clean_spaces = true;          // detokenize tidies " ." / " 's" etc.
  bool add_bos_default = false;      // BOS default before tokenizer.ggml.add_bos_token
  bool bos_disabled = false;         // model has no BOS by convention (glm4)
};
Result<PreTokenizerSpec> pre_tokenizer_spec(const std::string& pre);

// Rewrites a regex written with \s, \S, \p{L}, \p{N}, \p{P} so that PCRE2 sees
// the same character classes as llama.cpp's Unicode tables: \s becomes the
// Unicode White_Space set (PCRE2's own \s also takes U+180E), and the
// categories gain the few code points PCRE2's older tables classify differently.
std::string expand_regex(std::string_view pattern);

class RegexSplitter {
 public:
  static Result<std::unique_ptr<RegexSplitter>> create(const std::vector<std::string>& regexes);
  ~RegexSplitter();
  RegexSplitter(const RegexSplitter&) = delete;
  RegexSplitter& operator=(const RegexSplitter&) = delete;

  // `text` must be well-formed UTF-8. Returns consecutive pieces covering it.
  std::vector<std::string_view> split(std::string_view text) const;

 private:
  RegexSplitter() = default;
  struct Compiled;
  std::vector<Compiled*> compiled_;
};

}  // namespace inferd::tok
