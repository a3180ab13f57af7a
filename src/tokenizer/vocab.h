// The vocabulary as llama.cpp sees it after loading: token texts, scores,
// attributes (including the ones llama.cpp infers from token text), special
// ids, end-of-generation set, and the special-token partition of input text.
// Internal to the tokenizer module.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/result.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace inferd::tok {

// Token attributes, as bit flags (a token can be e.g. CONTROL and UNUSED).
enum Attr : uint32_t {
  kAttrUndefined = 0,
  kAttrUnknown = 1u << 0,
  kAttrUnused = 1u << 1,
  kAttrNormal = 1u << 2,
  kAttrControl = 1u << 3,
  kAttrUserDefined = 1u << 4,
  kAttrByte = 1u << 5,
};

enum class VocabType { kBpe, kSpm };

// Hash/equality that let an unordered_map<std::string, ...> be searched with a
// string_view without building a string.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using TextToId = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// A piece of input after special-token partition: either raw text or a token.
struct Fragment {
  int32_t token = -1;  // -1: raw text [offset, offset + length)
  size_t offset = 0;
  size_t length = 0;
};

struct Vocab {
  VocabType type = VocabType::kBpe;
  std::string model;  // tokenizer.ggml.model
  std::string pre;    // tokenizer.ggml.pre (as given)

  std::vector<std::string> text;
  std::vector<float> score;
  std::vector<uint32_t> attr;
  TextToId to_id;

  int32_t bos = -1, eos = -1, eot = -1, eom = -1, unk = -1, pad = -1;
  int32_t fim_pad = -1, fim_rep = -1, fim_sep = -1;
  bool add_bos = false;
  bool add_eos = false;
  bool add_space_prefix = false;
  bool clean_spaces = false;
  std::unordered_set<int32_t> eog;

  // Ids of CONTROL / USER_DEFINED / UNKNOWN tokens, longest text first: the
  // order in which llama.cpp carves them out of the input.
  std::vector<int32_t> special_order;

  int32_t n_tokens() const { return static_cast<int32_t>(text.size()); }
  int32_t find(std::string_view s) const {
    auto it = to_id.find(s);
    return it == to_id.end() ? -1 : it->second;
  }
  bool has(int32_t id, uint32_t a) const { return (attr[static_cast<size_t>(id)] & a) != 0; }

  // Reads the tokenizer.ggml.* keys. `type` is decided from tokenizer.ggml.model
  // by the caller; BPE callers pass their pre-tokenizer defaults.
  static Result<Vocab> load(const gguf::File& file, VocabType type, bool add_bos_default,
                            bool clean_spaces_default, bool bos_disabled);

  // Splits `text` around special-token text. Without parse_special only
  // user-defined tokens are carved out (as llama.cpp does). With it, control
  // and unknown tokens are carved too, except where they overlap a `literal`
  // span (sorted, disjoint): there they stay text.
  std::vector<Fragment> partition(std::string_view text, bool parse_special,
                                  std::span<const TextSpan> literal = {}) const;

 private:
  void finish_special_tokens();
  void build_special_trie();
  // Trie over the texts in special_order, used to find quickly which special
  // tokens occur in a text at all.
  struct TrieNode {
    std::vector<std::pair<uint8_t, int32_t>> next;  // byte -> node index, sorted
    int32_t token = -1;
  };
  std::vector<TrieNode> trie_;
  std::vector<int32_t> special_rank_;  // token id -> position in special_order (or -1)
};

}  // namespace inferd::tok
