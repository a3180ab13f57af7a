// The vocabulary llguidance gets from each model family's tokenizer (byte-level
// BPE: SmolLM2, Qwen2.5; SentencePiece-style: Gemma 3): for texts with
// spaces, newlines, digits, punctuation and non-ASCII characters, the
// tokenizer's own tokens must be what the grammar allows, token by token, and
// end-of-generation must be every end-of-generation token of the model.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "gguf/gguf.h"
#include "structured/gbnf.h"
#include "structured/grammar.h"

namespace inferd {
namespace {

std::string model_file(const std::string& name) {
  const char* d = std::getenv("INFERD_MODEL_DIR");
  const char* home = std::getenv("HOME");
  const std::string dir = d && *d ? d : std::string(home ? home : ".") + "/.cache/inferd/models";
  return dir + "/" + name;
}

class StructuredVocab : public ::testing::TestWithParam<std::string> {};

TEST_P(StructuredVocab, TokenizerTokensAreWhatTheGrammarAllows) {
  const std::string path = model_file(GetParam());
  if (!std::ifstream(path).good()) GTEST_SKIP() << path << " not found (scripts/fetch_models.sh --all)";
  auto file = gguf::File::open(path);
  ASSERT_TRUE(file.ok()) << file.error().message;
  auto tok = Tokenizer::from_gguf(**file);
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  auto gt = GrammarTokenizer::create(**tok);
  ASSERT_TRUE(gt.ok()) << gt.error().message;
  EXPECT_EQ((*gt)->n_vocab(), (*tok)->n_vocab());
  GrammarCompiler compiler(*gt);

  const std::vector<std::string> texts = {
      "The answer is 42.",
      "  two leading spaces, a tab\tand\nnewlines\n\n",
      "héllo wörld ✓ 東京 🙂",
      "{\"name\": \"Ada\", \"age\": 36, \"tags\": [\"x\", \"y\"]}",
      "snake_case, CamelCase & symbols: #$%^*()[]{}<>~`|\\",
  };
  for (const std::string& text : texts) {
    auto lark = choices_to_lark({text});
    ASSERT_TRUE(lark.ok());
    auto g = compiler.compile(GrammarKind::kLark, *lark);
    ASSERT_TRUE(g.ok()) << g.error().message;
    auto m = (*g)->new_matcher();
    ASSERT_TRUE(m.ok());
    const std::vector<int32_t> ids = (*tok)->encode(text, /*add_special=*/false, /*parse_special=*/false);
    for (size_t i = 0; i < ids.size(); ++i) {
      auto mask = (*m)->compute_mask();
      ASSERT_TRUE(mask.ok()) << mask.error().message;
      ASSERT_TRUE(token_allowed(*mask, ids[i]))
          << GetParam() << ": token " << i << " (id " << ids[i] << ", '" << (*tok)->token_to_piece(ids[i], true)
          << "') of \"" << text << "\" is not allowed";
      ASSERT_TRUE((*m)->commit(ids[i]).ok());
    }
    EXPECT_TRUE((*m)->is_stopped()) << text;
    // The finished grammar allows exactly the end-of-generation tokens.
    auto mask = (*m)->compute_mask();
    ASSERT_TRUE(mask.ok());
    for (int32_t id = 0; id < (*tok)->n_vocab(); ++id)
      ASSERT_EQ(token_allowed(*mask, id), (*tok)->is_eog(id)) << GetParam() << ": token " << id;
  }
  // Control tokens never match text, even text that spells them.
  const int32_t eos = (*tok)->eos_id();
  ASSERT_GE(eos, 0);
  auto spelled = compiler.compile(GrammarKind::kLark, *choices_to_lark({(*tok)->token_text(eos)}));
  ASSERT_TRUE(spelled.ok()) << spelled.error().message;
  auto m = (*spelled)->new_matcher();
  ASSERT_TRUE(m.ok());
  auto mask = (*m)->compute_mask();
  ASSERT_TRUE(mask.ok());
  EXPECT_FALSE(token_allowed(*mask, eos)) << (*tok)->token_text(eos);
}

INSTANTIATE_TEST_SUITE_P(Models, StructuredVocab,
                         ::testing::Values("SmolLM2-135M-Instruct.Q4_1.gguf", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
                                           "gemma-3-270m-q4_k_m.gguf"),
                         [](const auto& info) {
                           std::string n = info.param.substr(0, info.param.find_first_of("-."));
                           return n == "SmolLM2" ? std::string("smollm2") : n;
                         });

}  // namespace
}  // namespace inferd
