#include "tokenizer/vocab.h"

#include <algorithm>
#include <cstring>

namespace inferd::tok {

namespace {

constexpr const char* kKeyTokens = "tokenizer.ggml.tokens";
constexpr const char* kKeyScores = "tokenizer.ggml.scores";
constexpr const char* kKeyTypes = "tokenizer.ggml.token_type";

// Optional token id key: unset when missing, not an integer, or out of range
// (llama.cpp then keeps its default).
void read_id(const gguf::File& f, const char* key, int32_t n_tokens, int32_t& id) {
  if (!f.find(key)) return;
  auto v = f.get_u32(key);
  if (v.ok() && *v < static_cast<uint32_t>(n_tokens)) id = static_cast<int32_t>(*v);
}

void read_bool(const gguf::File& f, const char* key, bool& out) {
  if (!f.find(key)) return;
  auto v = f.get_bool(key);
  if (v.ok()) out = *v;
}

// Ids of the tokens whose text is one of `names`, in id order (token texts
// are unique, so this is one lookup per name).
std::vector<int32_t> ids_named(const Vocab& v, std::initializer_list<const char*> names) {
  std::vector<int32_t> ids;
  for (const char* n : names) {
    if (const int32_t id = v.find(n); id >= 0) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

}  // namespace

Result<Vocab> Vocab::load(const gguf::File& file, VocabType type, bool add_bos_default,
                          bool clean_spaces_default, bool bos_disabled) {
  Vocab v;
  v.type = type;
  if (auto m = file.get_string("tokenizer.ggml.model"); m.ok()) v.model = *m;
  if (auto p = file.get_string("tokenizer.ggml.pre"); p.ok()) v.pre = *p;

  const gguf::Value* tokens = file.find(kKeyTokens);
  if (!tokens) return make_error(std::string("missing ") + kKeyTokens);
  if (!tokens->is_array() || tokens->elem_type != gguf::ValueType::STRING) {
    return make_error(std::string(kKeyTokens) + " is not an array of strings");
  }
  const size_t n = tokens->strings.size();
  if (n == 0) return make_error(std::string(kKeyTokens) + " is empty");
  if (n > static_cast<size_t>(INT32_MAX)) return make_error("vocabulary too large");

  std::vector<float> scores;
  if (file.find(kKeyScores)) {
    auto s = file.get_f32_array(kKeyScores);
    if (!s.ok()) {
      // llama.cpp also accepts integer scores.
      auto si = file.get_i32_array(kKeyScores);
      if (!si.ok()) return make_error(std::string(kKeyScores) + ": " + s.error().message);
      for (int32_t x : *si) scores.push_back(static_cast<float>(x));
    } else {
      scores = std::move(*s);
    }
    if (scores.size() < n) return make_error(std::string(kKeyScores) + " is shorter than the vocabulary");
  }
  std::vector<int32_t> types;
  if (file.find(kKeyTypes)) {
    auto t = file.get_i32_array(kKeyTypes);
    if (!t.ok()) return make_error(std::string(kKeyTypes) + ": " + t.error().message);
    types = std::move(*t);
    if (types.size() < n) return make_error(std::string(kKeyTypes) + " is shorter than the vocabulary");
  }

  v.text.resize(n);
  v.score.assign(n, 0.0f);
  v.attr.assign(n, kAttrNormal);
  v.to_id.reserve(n * 2);
  for (size_t i = 0; i < n; ++i) {
    std::string word = tokens->strings[i];
    if (word.empty()) word = "[EMPTY_" + std::to_string(i) + "]";
    if (!v.to_id.emplace(word, static_cast<int32_t>(i)).second) {
      return make_error("duplicate token in vocabulary at id " + std::to_string(i));
    }
    v.text[i] = std::move(word);
    if (!scores.empty()) v.score[i] = scores[i];
    if (!types.empty()) {
      switch (types[i]) {
        case 1: v.attr[i] = kAttrNormal; break;
        case 2: v.attr[i] = kAttrUnknown; break;
        case 3: v.attr[i] = kAttrControl; break;
        case 4: v.attr[i] = kAttrUserDefined; break;
        case 5: v.attr[i] = kAttrUnused; break;
        case 6: v.attr[i] = kAttrByte; break;
        default: v.attr[i] = kAttrUndefined; break;
      }
    }
  }

  const int32_t nt = static_cast<int32_t>(n);
  // Defaults per vocabulary type, then the file's keys (llama_vocab::load).
  if (type == VocabType::kSpm) {
    v.bos = 1;
    v.eos = 2;
    v.unk = 0;
    v.add_bos = true;
    v.add_space_prefix = true;
    v.clean_spaces = false;
  } else {
    v.bos = bos_disabled ? -1 : 11;
    v.eos = 11;
    v.add_bos = add_bos_default;
    v.add_space_prefix = false;
    v.clean_spaces = clean_spaces_default;
  }
  for (int32_t* id : {&v.bos, &v.eos, &v.unk}) {
    if (*id >= nt) *id = -1;
  }
  read_bool(file, "tokenizer.ggml.add_space_prefix", v.add_space_prefix);

  int32_t fim_pre = -1, fim_suf = -1, fim_mid = -1;
  read_id(file, "tokenizer.ggml.bos_token_id", nt, v.bos);
  read_id(file, "tokenizer.ggml.eos_token_id", nt, v.eos);
  read_id(file, "tokenizer.ggml.eot_token_id", nt, v.eot);
  read_id(file, "tokenizer.ggml.eom_token_id", nt, v.eom);
  read_id(file, "tokenizer.ggml.unknown_token_id", nt, v.unk);
  read_id(file, "tokenizer.ggml.padding_token_id", nt, v.pad);
  read_id(file, "tokenizer.ggml.fim_pre_token_id", nt, fim_pre);
  read_id(file, "tokenizer.ggml.fim_suf_token_id", nt, fim_suf);
  read_id(file, "tokenizer.ggml.fim_mid_token_id", nt, fim_mid);
  read_id(file, "tokenizer.ggml.fim_pad_token_id", nt, v.fim_pad);
  read_id(file, "tokenizer.ggml.fim_rep_token_id", nt, v.fim_rep);
  read_id(file, "tokenizer.ggml.fim_sep_token_id", nt, v.fim_sep);
  read_id(file, "tokenizer.ggml.prefix_token_id", nt, fim_pre);
  read_id(file, "tokenizer.ggml.suffix_token_id", nt, fim_suf);
  read_id(file, "tokenizer.ggml.middle_token_id", nt, fim_mid);

  read_bool(file, "tokenizer.ggml.add_bos_token", v.add_bos);
  read_bool(file, "tokenizer.ggml.add_eos_token", v.add_eos);
  if (v.add_bos && v.bos < 0) return make_error("add_bos_token is true but there is no BOS token");
  if (v.add_eos && v.eos < 0) return make_error("add_eos_token is true but there is no EOS token");

  // llama.cpp recognises several special tokens by their text and forces them
  // to CONTROL; the first match (here: lowest id) becomes the EOT/FIM token.
  auto detect = [&](int32_t& id, std::initializer_list<const char*> names) {
    if (id >= 0) return;
    const std::vector<int32_t> found = ids_named(v, names);
    if (found.empty()) return;
    id = found.front();
    v.attr[static_cast<size_t>(id)] |= kAttrControl;
  };
  detect(v.eot, {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                 "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]",
                 "<\xEF\xBD\x9C" "end\xE2\x96\x81" "of\xE2\x96\x81" "sentence\xEF\xBD\x9C>",
                 "<end_of_utterance>"});
  detect(v.eom, {"<|eom_id|>"});
  detect(fim_pre, {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",
                   "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "begin\xEF\xBD\x9C>", "<PRE>",
                   "\xE2\x96\x81<PRE>", "<|code_prefix|>", "<|prefix|>"});
  detect(fim_suf, {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
                   "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "hole\xEF\xBD\x9C>", "<SUF>",
                   "\xE2\x96\x81<SUF>", "<|code_suffix|>", "<|suffix|>"});
  detect(fim_mid, {"<|fim_middle|>", "<fim-middle>", "<fim_middle>",
                   "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "end\xEF\xBD\x9C>", "<MID>",
                   "\xE2\x96\x81<MID>", "<|code_middle|>", "<|middle|>"});
  detect(v.fim_pad, {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"});
  detect(v.fim_rep, {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"});
  detect(v.fim_sep, {"<|file_sep|>"});

  // Control tokens named "...unused..." are also UNUSED.
  for (int32_t i = 0; i < nt; ++i) {
    if ((v.attr[i] & kAttrControl) && v.text[i].find("unused") != std::string::npos) {
      v.attr[i] |= kAttrUnused;
    }
  }
  v.finish_special_tokens();
  return v;
}

void Vocab::finish_special_tokens() {
  const int32_t nt = n_tokens();
  eog.clear();
  for (int32_t id : {fim_pad, fim_rep, fim_sep}) {
    if (id >= 0) eog.insert(id);
  }
  for (int32_t i : ids_named(*this, {"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>",
                                      "<|flush|>", "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>",
                                      "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
                                      "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
                                      "<\xEF\xBD\x9C" "end\xE2\x96\x81" "of\xE2\x96\x81" "sentence\xEF\xBD\x9C>",
                                      "[e~["})) {
    eog.insert(i);
    attr[static_cast<size_t>(i)] |= kAttrControl;
  }
  // gpt-oss: these are always rendered, as user-defined tokens.
  for (int32_t i : ids_named(*this, {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"})) {
    attr[static_cast<size_t>(i)] = kAttrUserDefined;
  }
  for (int32_t id : {eos, eot, eom}) {
    if (id >= 0) eog.insert(id);
  }
  // o200k_harmony / solar-open: "<|end|>" is not end-of-generation there.
  {
    bool has_return = false, has_call = false, has_flush = false;
    int32_t end_id = -1;
    for (int32_t id : eog) {
      const std::string& t = text[id];
      if (t == "<|return|>") has_return = true;
      else if (t == "<|call|>" || t == "<|calls|>") has_call = true;
      else if (t == "<|flush|>") has_flush = true;
      else if (t == "<|end|>") end_id = id;
    }
    if (end_id >= 0 && has_call && (has_return || has_flush)) {
      eog.erase(end_id);
      attr[end_id] = kAttrUserDefined;
    }
  }
  // gemma4 / paddleocr: "</s>" is not end-of-generation next to "<|tool_response>".
  {
    bool has_tool_response = false;
    int32_t s_id = -1;
    for (int32_t id : eog) {
      if (text[id] == "<|tool_response>") has_tool_response = true;
      else if (text[id] == "</s>") s_id = id;
    }
    if (has_tool_response && s_id >= 0) {
      eog.erase(s_id);
      attr[s_id] = kAttrNormal;
    }
  }

  special_order.clear();
  for (int32_t i = 0; i < nt; ++i) {
    if (attr[i] & (kAttrControl | kAttrUserDefined | kAttrUnknown)) special_order.push_back(i);
  }
  // llama.cpp sorts by length only (std::sort, so the order of equal lengths is
  // unspecified); we keep id order. The order only matters for two
  // equal-length tokens that can overlap in a text, which neither SmolLM2's
  // nor Gemma 3's vocabulary has.
  std::stable_sort(special_order.begin(), special_order.end(), [&](int32_t a, int32_t b) {
    return text[a].size() > text[b].size();
  });
  build_special_trie();
}

void Vocab::build_special_trie() {
  trie_.assign(1, TrieNode{});
  special_rank_.assign(text.size(), -1);
  for (size_t r = 0; r < special_order.size(); ++r) {
    const int32_t id = special_order[r];
    special_rank_[static_cast<size_t>(id)] = static_cast<int32_t>(r);
    int32_t node = 0;
    for (char ch : text[id]) {
      const uint8_t b = static_cast<uint8_t>(ch);
      auto& next = trie_[node].next;
      auto it = std::lower_bound(next.begin(), next.end(), std::make_pair(b, int32_t{-1}));
      if (it != next.end() && it->first == b) {
        node = it->second;
      } else {
        const int32_t child = static_cast<int32_t>(trie_.size());
        next.insert(it, {b, child});
        trie_.push_back(TrieNode{});  // may reallocate: `next` is not used after this
        node = child;
      }
    }
    trie_[node].token = id;
  }
}

namespace {
// Whether [pos, pos + n) overlaps one of the sorted, disjoint spans.
bool overlaps(std::span<const TextSpan> spans, size_t pos, size_t n) {
  auto it = std::partition_point(spans.begin(), spans.end(),
                                 [pos](const TextSpan& sp) { return sp.offset + sp.length <= pos; });
  return it != spans.end() && it->offset < pos + n;
}
}  // namespace

std::vector<Fragment> Vocab::partition(std::string_view s, bool parse_special,
                                       std::span<const TextSpan> literal) const {
  std::vector<Fragment> frags;
  if (s.empty()) return frags;
  frags.push_back(Fragment{-1, 0, s.size()});
  if (special_order.empty()) return frags;

  // Which special tokens occur anywhere in the text? Only those can split it,
  // so the llama.cpp procedure below runs over a handful of tokens, not all.
  std::vector<int32_t> ranks;
  for (size_t pos = 0; pos < s.size(); ++pos) {
    int32_t node = 0;
    for (size_t k = pos; k < s.size(); ++k) {
      const uint8_t b = static_cast<uint8_t>(s[k]);
      const auto& next = trie_[node].next;
      auto it = std::lower_bound(next.begin(), next.end(), std::make_pair(b, int32_t{-1}));
      if (it == next.end() || it->first != b) break;
      node = it->second;
      if (trie_[node].token >= 0) ranks.push_back(special_rank_[trie_[node].token]);
    }
  }
  if (ranks.empty()) return frags;
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());

  // llama.cpp's tokenizer_st_partition: for each special token, longest first,
  // cut every occurrence out of every remaining raw-text fragment.
  std::vector<Fragment> next;
  for (int32_t r : ranks) {
    const int32_t id = special_order[static_cast<size_t>(r)];
    const bool control = (attr[id] & (kAttrControl | kAttrUnknown)) != 0;
    if (!parse_special && control) continue;
    const bool check_literal = control && !literal.empty();
    const std::string& tok = text[id];
    next.clear();
    for (const Fragment& f : frags) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      size_t off = f.offset;  // start of the text not yet passed on
      size_t from = off;      // where the next occurrence may start
      const size_t end = f.offset + f.length;
      while (from < end) {
        const size_t m = s.substr(0, end).find(tok, from);
        if (m == std::string_view::npos) break;
        if (check_literal && overlaps(literal, m, tok.size())) {
          from = m + 1;
          continue;
        }
        if (m > off) next.push_back(Fragment{-1, off, m - off});
        next.push_back(Fragment{id, m, tok.size()});
        off = from = m + tok.size();
      }
      if (off < end) next.push_back(Fragment{-1, off, end - off});
    }
    frags.swap(next);
  }
  return frags;
}

}  // namespace inferd::tok
