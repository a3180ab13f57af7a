#include "structured/grammar.h"

#include <cmath>
#include <future>
#include <limits>

#include <nlohmann/json.hpp>

#include "llguidance.h"
#include "structured/gbnf.h"
#include "structured/json_schema.h"

namespace inferd {

const char* grammar_kind_name(GrammarKind kind) {
  switch (kind) {
    case GrammarKind::kJsonSchema: return "json_schema";
    case GrammarKind::kJsonObject: return "json_object";
    case GrammarKind::kRegex: return "regex";
    case GrammarKind::kLark: return "lark";
    case GrammarKind::kGbnf: return "gbnf";
  }
  return "unknown";
}

// ---- tokenizer ----------------------------------------------------------------

namespace {

// llguidance's tokenize callback: the bytes as inferd's tokenizer reads plain
// text (no BOS/EOS, special-token text stays text) that continues an output,
// so without SentencePiece's space prefix: llguidance wants the bytes' tokens
// and nothing more. It uses them to tokenize forced text and to check token
// boundaries; it must be thread-safe, which encode_continuation() is (it is
// const and keeps no state).
size_t tokenize_callback(const void* user_data, const uint8_t* bytes, size_t bytes_len,
                         uint32_t* output_tokens, size_t output_tokens_len) {
  const auto* tok = static_cast<const Tokenizer*>(user_data);
  const std::vector<int32_t> ids =
      tok->encode_continuation(std::string_view(reinterpret_cast<const char*>(bytes), bytes_len));
  for (size_t i = 0; i < ids.size() && i < output_tokens_len; ++i)
    output_tokens[i] = static_cast<uint32_t>(ids[i]);
  return ids.size();
}

}  // namespace

Result<std::shared_ptr<const GrammarTokenizer>> GrammarTokenizer::create(const Tokenizer& tokenizer) {
  const int32_t n_vocab = tokenizer.n_vocab();
  if (n_vocab <= 0) return make_error("structured outputs: the tokenizer has no tokens");
  // llguidance's convention: a token's bytes as they appear in text, and for
  // control tokens (which never appear in text) 0xFF followed by their name,
  // so that no grammar can match them as text.
  std::vector<uint32_t> lens(n_vocab);
  std::string bytes;
  std::vector<uint32_t> eog;
  for (int32_t id = 0; id < n_vocab; ++id) {
    std::string piece;
    if (tokenizer.is_control(id) || tokenizer.is_eog(id)) {
      piece = "\xff" + tokenizer.token_text(id);
    } else {
      piece = tokenizer.token_to_piece(id, /*render_special=*/false);
    }
    lens[id] = static_cast<uint32_t>(piece.size());
    bytes += piece;
    if (tokenizer.is_eog(id)) eog.push_back(static_cast<uint32_t>(id));
  }
  // End of generation for the grammar: the model's EOS first, then every other
  // end-of-generation token (<|im_end|>, <|eot_id|>, ...); the engine stops on
  // any of them, so a finished grammar allows all of them.
  uint32_t eos = tokenizer.eos_id() >= 0 && tokenizer.eos_id() < n_vocab
                     ? static_cast<uint32_t>(tokenizer.eos_id())
                     : (eog.empty() ? 0u : eog.front());
  std::vector<uint32_t> extra;
  for (uint32_t t : eog)
    if (t != eos) extra.push_back(t);

  LlgTokenizerInitV2 init{};
  init.struct_size = sizeof(init);
  init.vocab_size = static_cast<uint32_t>(n_vocab);
  init.tok_eos = eos;
  init.token_lens = lens.data();
  init.token_bytes = reinterpret_cast<const uint8_t*>(bytes.data());
  init.tokenize_assumes_string = true;  // encode() is fed valid UTF-8 only
  init.tokenize_fn = tokenize_callback;
  init.tokenize_user_data = &tokenizer;
  init.tok_eos_extra = extra.empty() ? nullptr : extra.data();
  init.tok_eos_extra_count = static_cast<uint32_t>(extra.size());

  std::shared_ptr<GrammarTokenizer> out(new GrammarTokenizer(tokenizer));
  char err[1024] = {0};
  out->handle_ = llg_new_tokenizer_v2(&init, err, sizeof(err));
  if (!out->handle_)
    return make_error(std::string("structured outputs: llguidance refused the vocabulary: ") + err);
  out->n_vocab_ = n_vocab;
  return std::shared_ptr<const GrammarTokenizer>(std::move(out));
}

GrammarTokenizer::~GrammarTokenizer() { llg_free_tokenizer(handle_); }

// ---- compiled grammar and matcher -------------------------------------------

CompiledGrammar::~CompiledGrammar() { llg_free_matcher(proto_); }

Result<std::unique_ptr<GrammarMatcher>> CompiledGrammar::new_matcher() const {
  LlgMatcher* m;
  {
    std::lock_guard<std::mutex> lock(clone_mu_);
    m = llg_clone_matcher(proto_);
  }
  if (!m) return make_error("structured outputs: could not start a matcher");
  if (const char* e = llg_matcher_get_error(m)) {
    std::string msg = e;
    llg_free_matcher(m);
    return make_error("structured outputs: " + msg);
  }
  // The matcher keeps its grammar (and through it the tokenizer) alive;
  // compiled grammars always live in a shared_ptr (GrammarCompiler makes them).
  return std::unique_ptr<GrammarMatcher>(new GrammarMatcher(shared_from_this(), m, n_vocab()));
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar, LlgMatcher* m,
                               int32_t n_vocab)
    : grammar_(std::move(grammar)), m_(m), n_vocab_(n_vocab), mask_((n_vocab + 31) / 32) {}

GrammarMatcher::~GrammarMatcher() { llg_free_matcher(m_); }

Status GrammarMatcher::error_status(const char* what) {
  const char* e = llg_matcher_get_error(m_);
  return make_error(std::string("structured outputs: ") + what + ": " + (e ? e : "unknown error"));
}

Result<std::span<const uint32_t>> GrammarMatcher::compute_mask() {
  const size_t bytes = mask_.size() * sizeof(uint32_t);
  if (llg_matcher_get_mask_byte_size(m_) != bytes)
    return make_error("structured outputs: the grammar's mask size does not match its vocabulary");
  if (llg_matcher_compute_mask_into(m_, mask_.data(), bytes) != 0)
    return error_status("computing the allowed tokens failed").error();
  return std::span<const uint32_t>(mask_);
}

Status GrammarMatcher::commit(int32_t token) {
  if (token < 0 || token >= n_vocab_)
    return make_error("structured outputs: token " + std::to_string(token) +
                      " is outside the grammar's vocabulary of " + std::to_string(n_vocab_));
  if (llg_matcher_consume_token(m_, static_cast<uint32_t>(token)) != 0)
    return error_status(("token " + std::to_string(token) + " does not fit the grammar").c_str());
  return {};
}

bool GrammarMatcher::is_stopped() const { return llg_matcher_is_stopped(m_); }
bool GrammarMatcher::is_accepting() { return llg_matcher_is_accepting(m_); }

// ---- compiler -------------------------------------------------------------------

namespace {

// A JSON schema as it goes to llguidance. Its objects are closed as llama.cpp
// and vLLM read schemas (close_json_schema_objects). And llguidance lets JSON
// have any run of whitespace between tokens by default, so a small model can
// fall into emitting newlines until max_tokens: unless a schema sets its own
// "x-guidance" options, whitespace between JSON tokens is one space, or one
// newline and up to 20 spaces or tabs of indentation, enough for
// pretty-printed JSON, never a runaway. Text that is not a JSON object is
// passed on unchanged (llguidance names the error).
std::string prepared_json_schema(const std::string& schema) {
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(schema);
  } catch (const nlohmann::ordered_json::exception&) {
    return schema;
  }
  if (j.is_boolean() && j.get<bool>()) j = nlohmann::ordered_json::object();
  if (!j.is_object()) return schema;
  close_json_schema_objects(j);
  if (!j.contains("x-guidance")) j["x-guidance"] = {{"whitespace_pattern", "(?: |\\n[ \\t]{0,20})"}};
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace

struct GrammarCompiler::Entry {
  std::shared_future<Result<std::shared_ptr<const CompiledGrammar>>> result;
  std::list<std::string>::iterator lru_pos;
};

GrammarCompiler::GrammarCompiler(std::shared_ptr<const GrammarTokenizer> tokenizer, size_t max_cached)
    : tokenizer_(std::move(tokenizer)), max_cached_(std::max<size_t>(1, max_cached)) {}

GrammarCompilerStats GrammarCompiler::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

Result<std::shared_ptr<const CompiledGrammar>> GrammarCompiler::compile(GrammarKind kind,
                                                                        std::string_view text) {
  std::string key(grammar_kind_name(kind));
  key += '\n';
  if (kind != GrammarKind::kJsonObject) key.append(text);

  std::promise<Result<std::shared_ptr<const CompiledGrammar>>> promise;
  std::shared_future<Result<std::shared_ptr<const CompiledGrammar>>> future;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = cache_.find(key); it != cache_.end()) {
      ++stats_.cache_hits;
      lru_.splice(lru_.begin(), lru_, it->second->lru_pos);
      future = it->second->result;
    } else {
      ++stats_.compiles;
      auto entry = std::make_shared<Entry>();
      entry->result = promise.get_future().share();
      lru_.push_front(key);
      entry->lru_pos = lru_.begin();
      cache_.emplace(key, entry);
      while (cache_.size() > max_cached_) {  // forget the least recently used
        cache_.erase(lru_.back());
        lru_.pop_back();
      }
    }
  }
  if (future.valid()) return future.get();  // compiled, or being compiled by another caller

  Result<std::shared_ptr<const CompiledGrammar>> result = compile_uncached(kind, key.substr(key.find('\n') + 1));
  if (!result) {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.failures;
  }
  promise.set_value(result);
  return result;
}

Result<std::shared_ptr<const CompiledGrammar>> GrammarCompiler::compile_uncached(
    GrammarKind kind, const std::string& text) const {
  const char* type = nullptr;
  std::string data = text;
  switch (kind) {
    case GrammarKind::kJsonSchema: type = "json_schema"; data = prepared_json_schema(text); break;
    case GrammarKind::kJsonObject:
      type = "json_schema";
      data = prepared_json_schema(R"({"type":"object"})");
      break;
    case GrammarKind::kRegex: type = "regex"; break;
    case GrammarKind::kLark: type = "lark"; break;
    case GrammarKind::kGbnf: {
      auto lark = gbnf_to_lark(text);
      if (!lark) return make_error("invalid GBNF grammar: " + lark.error().message);
      data = std::move(*lark);
      type = "lark";
      break;
    }
  }
  if (data.find('\0') != std::string::npos)
    return make_error(std::string("invalid ") + grammar_kind_name(kind) + ": it contains a NUL character");

  LlgConstraintInit init{};
  llg_constraint_init_set_defaults(&init, tokenizer_->handle());
  init.log_stderr_level = 0;            // errors come back as values
  init.limits.verbose_errors = false;   // name the problem, do not dump the grammar
  LlgMatcher* m = llg_new_matcher(&init, type, data.c_str());
  if (!m) return make_error("structured outputs: llguidance returned no matcher");
  if (const char* e = llg_matcher_get_error(m)) {
    // llguidance's message names the problem and may quote the constraint;
    // a long one is cut (it goes back to the client in a 400).
    std::string msg = std::string("invalid ") + grammar_kind_name(kind) + ": " + e;
    constexpr size_t kMaxMessage = 1024;
    if (msg.size() > kMaxMessage) msg = msg.substr(0, kMaxMessage) + "...";
    llg_free_matcher(m);
    return make_error(std::move(msg));
  }
  return std::shared_ptr<const CompiledGrammar>(new CompiledGrammar(tokenizer_, kind, m));
}

}  // namespace inferd
