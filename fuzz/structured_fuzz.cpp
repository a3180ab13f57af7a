// libFuzzer target for structured-output constraints: JSON schemas, regexes,
// Lark and GBNF grammars (the GBNF-to-Lark converter is inferd's own code),
// as a request would hand them to the GrammarCompiler. Any input must be
// refused with an Error or compiled into a grammar whose matcher keeps its
// promises: a token the mask allows commits, a finished grammar allows end of
// generation. Built with ASan+UBSan (llguidance itself is Rust, not
// instrumented, but every byte it gets and gives back crosses inferd's code).
//
//   fuzz/run_structured_fuzz.sh 120     (builds build-fuzz, runs with the seed corpus)
//
// The first input byte picks the kind (its value mod 4: JSON schema, regex,
// Lark, GBNF); the rest is the constraint's text.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "structured/gbnf.h"
#include "structured/grammar.h"

using namespace inferd;

namespace {

void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "structured-output invariant violated: %s\n", what);
    std::abort();
  }
}

// A small vocabulary: an end-of-generation token, every byte value as a
// token of its own (so any text, valid UTF-8 or not, can be generated), and a
// few multi-byte tokens; encode() is greedy longest match.
class FuzzTokenizer : public Tokenizer {
 public:
  FuzzTokenizer() {
    pieces_.push_back("<eos>");
    for (int b = 0; b < 256; ++b) pieces_.push_back(std::string(1, static_cast<char>(b)));
    for (const char* t : {"{\"", "\":", "\",", "true", "false", "null", "  ", "\n", "ab", "12", "the"})
      pieces_.push_back(t);
  }
  std::vector<int32_t> encode(std::string_view text, bool, bool) const override {
    std::vector<int32_t> out;
    size_t pos = 0;
    while (pos < text.size()) {
      int32_t best = 1 + static_cast<unsigned char>(text[pos]);
      size_t best_len = 1;
      for (int32_t id = 257; id < n_vocab(); ++id) {
        const std::string& p = pieces_[id];
        if (p.size() > best_len && text.substr(pos, p.size()) == p) best = id, best_len = p.size();
      }
      out.push_back(best);
      pos += best_len;
    }
    return out;
  }
  std::string token_to_piece(int32_t id, bool render_special) const override {
    return id == 0 ? (render_special ? pieces_[0] : "") : pieces_[id];
  }
  int32_t n_vocab() const override { return static_cast<int32_t>(pieces_.size()); }
  int32_t bos_id() const override { return -1; }
  int32_t eos_id() const override { return 0; }
  bool add_bos() const override { return false; }
  bool is_eog(int32_t id) const override { return id == 0; }
  bool is_control(int32_t id) const override { return id == 0; }
  const std::string& token_text(int32_t id) const override { return pieces_[id]; }
  std::string model_name() const override { return "fuzz"; }

 private:
  std::vector<std::string> pieces_;
};

struct Env {
  FuzzTokenizer tok;
  std::shared_ptr<const GrammarTokenizer> gtok;
  Env() {
    auto g = GrammarTokenizer::create(tok);
    require(g.ok(), "the fuzz vocabulary is accepted");
    gtok = *g;
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Env* env = new Env();  // one vocabulary for the whole run
  if (size < 1) return 0;
  static const GrammarKind kinds[] = {GrammarKind::kJsonSchema, GrammarKind::kRegex, GrammarKind::kLark,
                                      GrammarKind::kGbnf};
  const GrammarKind kind = kinds[data[0] % 4];
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);

  if (kind == GrammarKind::kGbnf) {
    auto lark = gbnf_to_lark(text);
    require(lark.ok() || !lark.error().message.empty(), "a GBNF error has a message");
  }
  GrammarCompiler compiler(env->gtok, /*max_cached=*/1);
  auto g = compiler.compile(kind, text);
  if (!g.ok()) {
    require(!g.error().message.empty(), "a compile error has a message");
    return 0;
  }
  auto m = (*g)->new_matcher();
  require(m.ok(), "a compiled grammar starts a matcher");
  GrammarMatcher& matcher = **m;
  // Walk the grammar for a few steps, taking an allowed token picked by the
  // input's bytes, and check each step's promises.
  for (size_t step = 0; step < 24; ++step) {
    auto mask = matcher.compute_mask();
    if (!mask.ok()) return 0;  // a resource limit: an error, reported as such
    std::vector<int32_t> allowed;
    for (int32_t t = 0; t < matcher.n_vocab(); ++t)
      if (token_allowed(*mask, t)) allowed.push_back(t);
    if (matcher.is_stopped()) {
      require(allowed.size() == 1 && allowed[0] == 0, "a finished grammar allows only end of generation");
      return 0;
    }
    if (allowed.empty()) return 0;
    const int32_t t = allowed[data[step % size] % allowed.size()];
    if (t == 0) {
      require(matcher.is_accepting(), "end of generation is allowed only where the grammar accepts");
      return 0;
    }
    require(matcher.commit(t).ok(), "a token the mask allows commits");
  }
  return 0;
}
