// Grammar-constrained decoding through llguidance (its C ABI, linked from the
// Rust library rust/inferd_rust). Three objects, from long-lived to per step:
//
//  - GrammarTokenizer: the model's vocabulary as llguidance sees it (the bytes
//    of every token, control tokens marked, end-of-generation tokens, and a
//    tokenize callback into inferd's Tokenizer). Built once per model.
//  - GrammarCompiler: turns a constraint (JSON schema, regex, Lark, GBNF, ...)
//    into a CompiledGrammar, and caches it by (kind, text), so one schema is
//    compiled once however many requests carry it. Thread-safe.
//  - GrammarMatcher: one per generated sequence. Each step: compute_mask() ->
//    apply_token_mask() on the logits -> sample -> commit(token).
//
// Errors are values naming the problem (llguidance's message), never asserts.
#pragma once
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/result.h"
#include "sampling/token_mask.h"  // apply_token_mask, token_allowed
#include "tokenizer/tokenizer.h"

struct LlgTokenizer;
struct LlgMatcher;

namespace inferd {

enum class GrammarKind {
  kJsonSchema,  // text: a JSON schema
  kJsonObject,  // any JSON object; text ignored
  kRegex,       // text: a regular expression (Rust regex syntax), matched whole
  kLark,        // text: a grammar in llguidance's Lark dialect
  kGbnf,        // text: a llama.cpp GBNF grammar (converted to Lark, see gbnf.h)
};
const char* grammar_kind_name(GrammarKind kind);  // "json_schema", "regex", ...

// The model's vocabulary for llguidance. Immutable once built; shared by every
// grammar compiled for the model. The Tokenizer must outlive it (the tokenize
// callback calls into it).
class GrammarTokenizer {
 public:
  static Result<std::shared_ptr<const GrammarTokenizer>> create(const Tokenizer& tokenizer);
  ~GrammarTokenizer();
  GrammarTokenizer(const GrammarTokenizer&) = delete;
  GrammarTokenizer& operator=(const GrammarTokenizer&) = delete;

  int32_t n_vocab() const { return n_vocab_; }
  const LlgTokenizer* handle() const { return handle_; }
  const Tokenizer& tokenizer() const { return tokenizer_; }

 private:
  explicit GrammarTokenizer(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
  const Tokenizer& tokenizer_;
  LlgTokenizer* handle_ = nullptr;
  int32_t n_vocab_ = 0;
};

class GrammarMatcher;

// A compiled constraint: llguidance's grammar, lexer and a matcher in its
// start state, which new_matcher() clones (the clones share the lexer's lazily
// built automaton, so what one request learns speeds up the next).
class CompiledGrammar : public std::enable_shared_from_this<CompiledGrammar> {
 public:
  ~CompiledGrammar();
  CompiledGrammar(const CompiledGrammar&) = delete;
  CompiledGrammar& operator=(const CompiledGrammar&) = delete;

  GrammarKind kind() const { return kind_; }
  // A fresh matcher at the start of the grammar. Any thread.
  Result<std::unique_ptr<GrammarMatcher>> new_matcher() const;
  int32_t n_vocab() const { return tokenizer_->n_vocab(); }

 private:
  friend class GrammarCompiler;
  CompiledGrammar(std::shared_ptr<const GrammarTokenizer> tokenizer, GrammarKind kind, LlgMatcher* proto)
      : tokenizer_(std::move(tokenizer)), kind_(kind), proto_(proto) {}
  std::shared_ptr<const GrammarTokenizer> tokenizer_;
  GrammarKind kind_;
  LlgMatcher* proto_;
  mutable std::mutex clone_mu_;
};

// The grammar state of one sequence. Not thread-safe (one owner at a time).
class GrammarMatcher {
 public:
  ~GrammarMatcher();
  GrammarMatcher(const GrammarMatcher&) = delete;
  GrammarMatcher& operator=(const GrammarMatcher&) = delete;

  // The tokens allowed next, one bit per token id of the grammar's vocabulary
  // (bit i % 32 of word i / 32); valid until the next call on this matcher.
  // When the grammar is complete only end-of-generation tokens are allowed.
  Result<std::span<const uint32_t>> compute_mask();
  // Advances past `token`, which must be allowed by the current mask.
  Status commit(int32_t token);
  // The grammar is complete: nothing but end of generation can follow.
  bool is_stopped() const;
  // What was generated so far is a complete match (end of generation allowed).
  bool is_accepting();
  int32_t n_vocab() const { return n_vocab_; }
  const std::shared_ptr<const CompiledGrammar>& grammar() const { return grammar_; }

 private:
  friend class CompiledGrammar;
  GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar, LlgMatcher* m, int32_t n_vocab);
  Status error_status(const char* what);
  std::shared_ptr<const CompiledGrammar> grammar_;  // keeps the tokenizer alive
  LlgMatcher* m_;
  int32_t n_vocab_;
  std::vector<uint32_t> mask_;  // reused every step
};

struct GrammarCompilerStats {
  int64_t compiles = 0;     // grammars compiled (successfully or not)
  int64_t cache_hits = 0;   // requests served by an earlier compilation
  int64_t failures = 0;     // compilations that failed
};

class GrammarCompiler {
 public:
  explicit GrammarCompiler(std::shared_ptr<const GrammarTokenizer> tokenizer,
                           size_t max_cached = 256);

  // Compiles (or finds in the cache) a constraint. Blocks for as long as the
  // compilation takes (milliseconds for a typical schema): call it off any
  // latency-critical thread. Concurrent calls for one (kind, text) compile it
  // once; failures are cached too (the same bad schema fails the same way).
  Result<std::shared_ptr<const CompiledGrammar>> compile(GrammarKind kind, std::string_view text);

  GrammarCompilerStats stats() const;
  const std::shared_ptr<const GrammarTokenizer>& tokenizer() const { return tokenizer_; }

 private:
  struct Entry;
  Result<std::shared_ptr<const CompiledGrammar>> compile_uncached(GrammarKind kind,
                                                                   const std::string& text) const;

  std::shared_ptr<const GrammarTokenizer> tokenizer_;
  size_t max_cached_;
  mutable std::mutex mu_;
  std::list<std::string> lru_;  // keys, most recent first
  std::unordered_map<std::string, std::shared_ptr<Entry>> cache_;
  GrammarCompilerStats stats_;
};

}  // namespace inferd
