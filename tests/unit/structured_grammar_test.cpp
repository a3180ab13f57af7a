// Structured outputs through llguidance, without a model: the matcher's life
// cycle, the compile cache, compile errors, and the GBNF and choice
// conversions (the mask on logits is tested in sampling_token_mask_test). The
// vocabulary is a small character-level tokenizer (a real Tokenizer, written
// here), so every mask can be checked by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <thread>

#include "structured/gbnf.h"
#include "structured/grammar.h"
#include "structured/json_schema.h"

namespace inferd {
namespace {

// Token 0 is an end-of-generation control token, 1 another control token;
// then every printable ASCII character, then a few multi-character tokens.
// encode() is greedy longest match, which is exact for this vocabulary.
class CharTokenizer : public Tokenizer {
 public:
  CharTokenizer() {
    pieces_ = {"<eos>", "<pad>"};
    for (char c = 0x20; c < 0x7f; ++c) pieces_.push_back(std::string(1, c));
    pieces_.push_back("\n");
    pieces_.push_back("\t");
    for (const char* t : {"ab", "true", "false", "null", "12", "\"a\"", "{\"", "\":"}) pieces_.push_back(t);
  }
  std::vector<int32_t> encode(std::string_view text, bool, bool) const override {
    std::vector<int32_t> out;
    size_t pos = 0;
    while (pos < text.size()) {
      int32_t best = -1;
      size_t best_len = 0;
      for (int32_t id = 2; id < n_vocab(); ++id) {
        const std::string& p = pieces_[id];
        if (p.size() > best_len && text.substr(pos, p.size()) == p) {
          best = id;
          best_len = p.size();
        }
      }
      if (best < 0) break;  // a byte outside the vocabulary: stop (never happens in these tests)
      out.push_back(best);
      pos += best_len;
    }
    return out;
  }
  std::string token_to_piece(int32_t id, bool render_special) const override {
    if (id < 2) return render_special ? pieces_[id] : "";
    return pieces_[id];
  }
  int32_t n_vocab() const override { return static_cast<int32_t>(pieces_.size()); }
  int32_t bos_id() const override { return -1; }
  int32_t eos_id() const override { return 0; }
  bool add_bos() const override { return false; }
  bool is_eog(int32_t id) const override { return id == 0; }
  bool is_control(int32_t id) const override { return id < 2; }
  const std::string& token_text(int32_t id) const override { return pieces_[id]; }
  std::string model_name() const override { return "chars"; }

  int32_t id_of(std::string_view piece) const {
    for (int32_t id = 2; id < n_vocab(); ++id)
      if (pieces_[id] == piece) return id;
    return -1;
  }

 private:
  std::vector<std::string> pieces_;
};

class StructuredGrammar : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tok_ = new CharTokenizer();
    auto gt = GrammarTokenizer::create(*tok_);
    ASSERT_TRUE(gt.ok()) << gt.error().message;
    gtok_ = new std::shared_ptr<const GrammarTokenizer>(*gt);
  }
  static void TearDownTestSuite() {
    delete gtok_;
    delete tok_;
  }

  static std::shared_ptr<const CompiledGrammar> compile(GrammarKind kind, const std::string& text) {
    GrammarCompiler c(*gtok_);
    auto g = c.compile(kind, text);
    EXPECT_TRUE(g.ok()) << grammar_kind_name(kind) << " " << text << ": " << g.error().message;
    return g.ok() ? *g : nullptr;
  }

  static std::unique_ptr<GrammarMatcher> matcher(const std::shared_ptr<const CompiledGrammar>& g) {
    auto m = g->new_matcher();
    EXPECT_TRUE(m.ok()) << m.error().message;
    return m.ok() ? std::move(*m) : nullptr;
  }

  // The allowed token pieces of the current mask, sorted ("<eos>" for token 0).
  static std::vector<std::string> allowed(GrammarMatcher& m) {
    auto mask = m.compute_mask();
    EXPECT_TRUE(mask.ok()) << mask.error().message;
    std::vector<std::string> out;
    if (!mask.ok()) return out;
    for (int32_t id = 0; id < tok_->n_vocab(); ++id)
      if (token_allowed(*mask, id)) out.push_back(tok_->token_text(id));
    std::sort(out.begin(), out.end());
    return out;
  }

  // Feeds `text` as the tokenizer encodes it (llguidance allows only
  // canonical tokenizations: "a" then "b" is refused where "ab" is a token);
  // false at the first token the grammar refuses (checked against the mask
  // before committing).
  static bool feed(GrammarMatcher& m, std::string_view text) {
    for (int32_t id : tok_->encode(text, false, false)) {
      auto mask = m.compute_mask();
      if (!mask.ok() || !token_allowed(*mask, id)) return false;
      if (!m.commit(id).ok()) return false;
    }
    return true;
  }

  // Does the grammar match exactly `text` (character by character)?
  static bool matches(const std::shared_ptr<const CompiledGrammar>& g, std::string_view text) {
    auto m = matcher(g);
    if (!m || !feed(*m, text)) return false;
    auto mask = m->compute_mask();
    return mask.ok() && token_allowed(*mask, 0);  // end of generation allowed here
  }

  inline static CharTokenizer* tok_ = nullptr;
  inline static std::shared_ptr<const GrammarTokenizer>* gtok_ = nullptr;
};

// ---------------------------------------------------------------------------
// Matcher life cycle

TEST_F(StructuredGrammar, MatcherFollowsARegexToItsEndThenAllowsOnlyEndOfGeneration) {
  auto g = compile(GrammarKind::kRegex, "ab[0-9]");
  ASSERT_TRUE(g);
  auto m = matcher(g);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->n_vocab(), tok_->n_vocab());
  EXPECT_FALSE(m->is_stopped());
  EXPECT_FALSE(m->is_accepting());
  // "a" alone is not allowed: "b" must follow, and "ab" is one token.
  EXPECT_EQ(allowed(*m), (std::vector<std::string>{"ab"}));
  ASSERT_TRUE(m->commit(tok_->id_of("ab")).ok());
  std::vector<std::string> digits = {"0", "1", "12", "2", "3", "4", "5", "6", "7", "8", "9"};
  digits.erase(std::find(digits.begin(), digits.end(), "12"));  // two digits would pass the end
  EXPECT_EQ(allowed(*m), digits);
  ASSERT_TRUE(m->commit(tok_->id_of("7")).ok());
  EXPECT_TRUE(m->is_accepting());
  EXPECT_TRUE(m->is_stopped());
  EXPECT_EQ(allowed(*m), (std::vector<std::string>{"<eos>"}));
}

TEST_F(StructuredGrammar, CommittingATokenTheMaskRefusesIsAnErrorNamingIt) {
  auto g = compile(GrammarKind::kRegex, "[0-9]+");
  auto m = matcher(g);
  ASSERT_TRUE(m);
  Status st = m->commit(tok_->id_of("x"));
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("does not fit the grammar"), std::string::npos) << st.error().message;
  Status out_of_vocab = matcher(g)->commit(100000);
  ASSERT_FALSE(out_of_vocab.ok());
  EXPECT_NE(out_of_vocab.error().message.find("outside the grammar's vocabulary"), std::string::npos);
}

TEST_F(StructuredGrammar, MatchersOfOneGrammarAreIndependent) {
  auto g = compile(GrammarKind::kRegex, "(abc|abd)");
  auto a = matcher(g), b = matcher(g);
  ASSERT_TRUE(feed(*a, "abc"));
  EXPECT_TRUE(a->is_stopped());
  // b starts from the beginning, whatever a did.
  EXPECT_EQ(allowed(*b), (std::vector<std::string>{"ab"}));
  ASSERT_TRUE(feed(*b, "abd"));
  EXPECT_TRUE(b->is_stopped());
}

TEST_F(StructuredGrammar, JsonSchemaMatcherAcceptsValidAndRefusesInvalidDocuments) {
  auto g = compile(GrammarKind::kJsonSchema,
                   R"({"type":"object","properties":{"n":{"type":"integer","minimum":1,"maximum":20},)"
                   R"("e":{"enum":["x","y"]}},"required":["n","e"],"additionalProperties":false})");
  ASSERT_TRUE(g);
  EXPECT_TRUE(matches(g, R"({"n":12,"e":"x"})"));
  EXPECT_TRUE(matches(g, R"({"n": 3, "e": "y"})"));
  EXPECT_FALSE(matches(g, R"({"n":12})"));            // required field missing
  EXPECT_FALSE(matches(g, R"({"n":12,"e":"z"})"));    // not in the enum
  EXPECT_FALSE(matches(g, R"({"n":"12","e":"x"})"));  // wrong type
  EXPECT_FALSE(matches(g, R"({"n":1.5,"e":"x"})"));   // not an integer
  EXPECT_FALSE(matches(g, R"({"n":12,"e":"x","f":1})"));  // additionalProperties
  auto any = compile(GrammarKind::kJsonObject, "");
  EXPECT_TRUE(matches(any, R"({"a":[1,true,null,{"b":"c"}]})"));
  EXPECT_FALSE(matches(any, "[1]"));
}

TEST_F(StructuredGrammar, ObjectsWithoutAdditionalPropertiesAreClosedAsLlamaCppAndVllmReadThem) {
  // Listed keys only, at every depth, unless the schema asks for others.
  auto closed = compile(GrammarKind::kJsonSchema,
                        R"({"type":"object","properties":{"a":{"type":"integer"},)"
                        R"("o":{"type":"object","properties":{"b":{"type":"integer"}}}}})");
  ASSERT_TRUE(closed);
  EXPECT_TRUE(matches(closed, R"({"a":1,"o":{"b":2}})"));
  EXPECT_FALSE(matches(closed, R"({"a":1,"c":2})"));
  EXPECT_FALSE(matches(closed, R"({"a":1,"o":{"b":2,"c":3}})"));
  auto open = compile(GrammarKind::kJsonSchema,
                      R"({"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":true})");
  ASSERT_TRUE(open);
  EXPECT_TRUE(matches(open, R"({"a":1,"c":2})"));
  auto any = compile(GrammarKind::kJsonObject, "");  // no "properties": any object
  EXPECT_TRUE(matches(any, R"({"c":2})"));
}

TEST(JsonSchemaClosing, ClosesEverySubschemaWithPropertiesButAllOfMembersAndExplicitRules) {
  auto schema = nlohmann::ordered_json::parse(R"({
    "type": "object",
    "properties": {
      "items": {"type": "object", "properties": {"x": {}}},
      "list": {"type": "array", "items": {"properties": {"y": {}}}},
      "either": {"anyOf": [{"properties": {"z": {}}}, {"type": "null"}]},
      "free": {"properties": {"w": {}}, "additionalProperties": {"type": "string"}},
      "pattern": {"properties": {"v": {}}, "patternProperties": {"^p": {}}},
      "both": {"allOf": [{"properties": {"u": {}}}, {"properties": {"t": {"properties": {"s": {}}}}}]}
    },
    "$defs": {"Node": {"properties": {"r": {}}}}
  })");
  close_json_schema_objects(schema);
  const auto closed = [&](const nlohmann::ordered_json::json_pointer& p) {
    return schema.at(p).value("additionalProperties", nlohmann::ordered_json(true)) == false;
  };
  using ptr = nlohmann::ordered_json::json_pointer;
  EXPECT_TRUE(closed(ptr("")));
  EXPECT_TRUE(closed(ptr("/properties/items")));  // a property named like a keyword is a schema
  EXPECT_TRUE(closed(ptr("/properties/list/items")));
  EXPECT_TRUE(closed(ptr("/properties/either/anyOf/0")));
  EXPECT_EQ(schema.at(ptr("/properties/free/additionalProperties")), nlohmann::ordered_json({{"type", "string"}}));
  EXPECT_FALSE(schema.at(ptr("/properties/pattern")).contains("additionalProperties"));
  EXPECT_FALSE(schema.at(ptr("/properties/both/allOf/0")).contains("additionalProperties"));
  EXPECT_TRUE(closed(ptr("/properties/both/allOf/1/properties/t")));
  EXPECT_TRUE(closed(ptr("/$defs/Node")));
  EXPECT_FALSE(schema.at(ptr("/properties/either/anyOf/1")).contains("additionalProperties"));  // no properties
}

// ---------------------------------------------------------------------------
// Compile cache

TEST_F(StructuredGrammar, OneSchemaIsCompiledOnceAndSharedByEveryCaller) {
  GrammarCompiler c(*gtok_);
  const std::string schema = R"({"type":"object","properties":{"a":{"type":"string"}}})";
  auto a = c.compile(GrammarKind::kJsonSchema, schema);
  auto b = c.compile(GrammarKind::kJsonSchema, schema);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->get(), b->get());
  EXPECT_EQ(c.stats().compiles, 1);
  EXPECT_EQ(c.stats().cache_hits, 1);
  // The same text as another kind is another grammar.
  auto lark = c.compile(GrammarKind::kLark, "start: \"x\"");
  auto regex = c.compile(GrammarKind::kRegex, "start: \"x\"");
  ASSERT_TRUE(lark.ok() && regex.ok());
  EXPECT_NE(lark->get(), regex->get());
  EXPECT_EQ(c.stats().compiles, 3);
  // Many threads asking at once for a new schema: still one compilation.
  const std::string other = R"({"type":"array","items":{"type":"integer"},"maxItems":4})";
  std::vector<const CompiledGrammar*> got(8, nullptr);
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i)
    threads.emplace_back([&, i] {
      auto g = c.compile(GrammarKind::kJsonSchema, other);
      if (g.ok()) got[i] = g->get();
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(c.stats().compiles, 4);
  EXPECT_EQ(c.stats().cache_hits, 1 + 7);
  for (const CompiledGrammar* p : got) EXPECT_EQ(p, got[0]);
  EXPECT_NE(got[0], nullptr);
  // Failures are cached too, and counted.
  EXPECT_FALSE(c.compile(GrammarKind::kRegex, "(").ok());
  EXPECT_FALSE(c.compile(GrammarKind::kRegex, "(").ok());
  EXPECT_EQ(c.stats().compiles, 5);
  EXPECT_EQ(c.stats().failures, 1);
}

TEST_F(StructuredGrammar, TheCacheForgetsTheLeastRecentlyUsedGrammar) {
  GrammarCompiler c(*gtok_, /*max_cached=*/2);
  auto a1 = c.compile(GrammarKind::kRegex, "a");
  auto b1 = c.compile(GrammarKind::kRegex, "b");
  auto a2 = c.compile(GrammarKind::kRegex, "a");  // a is now the most recent
  auto c1 = c.compile(GrammarKind::kRegex, "c");  // evicts b
  EXPECT_EQ(c.stats().compiles, 3);
  auto a3 = c.compile(GrammarKind::kRegex, "a");
  EXPECT_EQ(c.stats().compiles, 3);
  EXPECT_EQ(a1->get(), a3->get());
  auto b2 = c.compile(GrammarKind::kRegex, "b");
  EXPECT_EQ(c.stats().compiles, 4);
  // An evicted grammar stays valid for whoever holds it.
  auto m = (*b1)->new_matcher();
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE(feed(**m, "b"));
}

// ---------------------------------------------------------------------------
// Errors name the problem

TEST_F(StructuredGrammar, BadConstraintsAreErrorsNamingTheProblem) {
  GrammarCompiler c(*gtok_);
  struct Case {
    GrammarKind kind;
    std::string text;
    std::string expect;  // a part of the message
  };
  const std::vector<Case> cases = {
      {GrammarKind::kJsonSchema, R"({"type":"strin"})", "strin"},
      {GrammarKind::kJsonSchema, R"({"type":"object")", "json_schema"},  // not JSON
      {GrammarKind::kJsonSchema, R"({"$ref":"#/$defs/missing"})", "missing"},
      {GrammarKind::kJsonSchema, R"({"type":"integer","minimum":5,"maximum":1})", "json_schema"},
      {GrammarKind::kRegex, "[a-", "unclosed character class"},
      {GrammarKind::kRegex, "a{5,2}", "regex"},
      {GrammarKind::kLark, "start: foo", "foo"},
      {GrammarKind::kLark, "start: \"a\" (", "lark"},
      {GrammarKind::kLark, "", "lark"},
      {GrammarKind::kGbnf, "root ::= foo", "rule 'foo' is not defined"},
      {GrammarKind::kGbnf, "rot ::= \"a\"", "no 'root' rule"},
      {GrammarKind::kGbnf, "root ::= \"a", "unterminated string literal"},
      {GrammarKind::kGbnf, "root ::= [a-", "unterminated character class"},
      {GrammarKind::kGbnf, "root := \"a\"", "expected '::='"},
      {GrammarKind::kGbnf, "root ::= \"a\"\nroot ::= \"b\"", "line 2: rule 'root' is already defined on line 1"},
      {GrammarKind::kGbnf, "root ::= \"a\"{3,1}", "n < m"},
      {GrammarKind::kGbnf, "root ::= \"\\q\"", "unknown escape"},
      {GrammarKind::kGbnf, "root ::= <[12]>", "token references"},
      {GrammarKind::kGbnf, "root ::= (\"a\"", "expected ')'"},
      {GrammarKind::kGbnf, std::string("root ::= \"\xff\""), "not valid UTF-8"},
      {GrammarKind::kRegex, std::string("a\0b", 3), "NUL"},
  };
  for (const Case& t : cases) {
    auto g = c.compile(t.kind, t.text);
    ASSERT_FALSE(g.ok()) << grammar_kind_name(t.kind) << ": " << t.text;
    EXPECT_NE(g.error().message.find(t.expect), std::string::npos)
        << grammar_kind_name(t.kind) << ": " << t.text << " -> " << g.error().message;
  }
}

// ---------------------------------------------------------------------------
// GBNF and choices

TEST_F(StructuredGrammar, GbnfGrammarsMatchWhatLlamaCppWouldMatch) {
  auto g = compile(GrammarKind::kGbnf, R"(# a comment line
root   ::= greeting ws name ("!" | "?")?   # trailing comment
greeting ::= "hi" | "hello"
ws ::= [ \t]+
name ::= [A-Z] [a-z]{1,3} Digit*
Digit ::= [0-9]
)");
  ASSERT_TRUE(g);
  EXPECT_TRUE(matches(g, "hi Bob"));
  EXPECT_TRUE(matches(g, "hello \tAnna7!"));
  EXPECT_TRUE(matches(g, "hi Ab12?"));
  EXPECT_FALSE(matches(g, "hi bob"));       // capital first
  EXPECT_FALSE(matches(g, "hi Bobby"));     // at most 3 lowercase letters
  EXPECT_FALSE(matches(g, "hiBob"));        // the space is required
  EXPECT_FALSE(matches(g, "hey Bob"));

  // Alternatives continued on the next line after '|', groups across lines,
  // escapes, negated classes, '.', and {m}, {m,}, {,n}.
  auto h = compile(GrammarKind::kGbnf,
                   "root ::= \"\\x41\" [^a-z\\n] . ( \"x\" |\n   \"y\" ) \"q\"{2} \"r\"{1,} \"s\"{,1} end\n"
                   "end ::= \"\\\"\" | \"\\u00e9\" |\n \"\\\\\"\n");
  ASSERT_TRUE(h);
  EXPECT_TRUE(matches(h, "AB%xqqr\""));
  EXPECT_TRUE(matches(h, "A9zyqqrrrs\\"));
  EXPECT_FALSE(matches(h, "Ab%xqqr\""));  // [^a-z\n]
  EXPECT_FALSE(matches(h, "AB%xqr\""));   // q{2}
  EXPECT_FALSE(matches(h, "AB%xqq\""));   // r{1,}
  EXPECT_FALSE(matches(h, "AB%xqqrss\""));  // s{,1}
}

TEST_F(StructuredGrammar, ChoicesMatchExactlyOneOfTheStringsEscapesIncluded) {
  auto lark = choices_to_lark({"yes", "no", "a\"b\\c", "x\ny"});
  ASSERT_TRUE(lark.ok()) << lark.error().message;
  auto g = compile(GrammarKind::kLark, *lark);
  ASSERT_TRUE(g);
  for (const char* s : {"yes", "no", "a\"b\\c", "x\ny"}) EXPECT_TRUE(matches(g, s)) << s;
  for (const char* s : {"ye", "yesno", "No", "a\"b", ""}) EXPECT_FALSE(matches(g, s)) << s;
  EXPECT_FALSE(choices_to_lark({}).ok());
  EXPECT_FALSE(choices_to_lark({"a", ""}).ok());
}

}  // namespace
}  // namespace inferd
