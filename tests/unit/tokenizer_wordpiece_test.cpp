// BERT's WordPiece tokenizer against Hugging Face `tokenizers` on the model's
// own tokenizer.json: every sentence of tests/data/embeddings/sentences.jsonl
// (accents, CJK, scripts without spaces, emoji, control characters, special
// token text, words longer than 100 characters, inputs past 512 tokens)
// tokenized to the same ids (tools/reference/embedding_reference.py), on the
// GGUF scripts/fetch_models.sh --all converts.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"
#include "test_data.h"

namespace inferd {
namespace {

std::string minilm_path() {
  const char* d = std::getenv("INFERD_MODEL_DIR");
  const char* home = std::getenv("HOME");
  const std::string dir = d && *d ? d : std::string(home ? home : "/root") + "/.cache/inferd/models";
  return dir + "/all-MiniLM-L6-v2.f16.gguf";
}

std::vector<nlohmann::json> expected() {
  std::vector<nlohmann::json> out;
  std::ifstream in(inferd::test::test_data_root() + "/embeddings/all-minilm-l6-v2.expected.jsonl");
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

class WordPieceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto file = gguf::File::open(minilm_path());
    ASSERT_TRUE(file.ok()) << minilm_path() << ": " << file.error().message << " (run scripts/fetch_models.sh --all)";
    file_ = std::move(*file);
    auto tok = Tokenizer::from_gguf(*file_);
    ASSERT_TRUE(tok.ok()) << tok.error().message;
    tok_ = std::move(*tok);
  }
  std::unique_ptr<gguf::File> file_;
  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(WordPieceTest, IdsMatchHuggingFaceTokenizers) {
  const std::vector<nlohmann::json> cases = expected();
  ASSERT_GE(cases.size(), 40u);
  for (const nlohmann::json& c : cases) {
    const std::string text = c["text"];
    const std::vector<int32_t> want = c["ids"].get<std::vector<int32_t>>();
    // tokenizers reads special-token text ("[SEP]") as the special token.
    EXPECT_EQ(tok_->encode(text, /*add_special=*/true, /*parse_special=*/true), want) << text;
  }
}

TEST_F(WordPieceTest, SpecialTokensAndPlainText) {
  EXPECT_EQ(tok_->bos_id(), 101);  // [CLS]
  EXPECT_EQ(tok_->eos_id(), 102);  // [SEP]
  EXPECT_EQ(tok_->n_vocab(), 30522);
  // Without parse_special, "[SEP]" is three pieces of text.
  EXPECT_EQ(tok_->encode("[SEP]", false, false), (std::vector<int32_t>{1031, 19802, 1033}));
  EXPECT_EQ(tok_->encode("[SEP]", false, true), (std::vector<int32_t>{102}));
  EXPECT_EQ(tok_->decode(tok_->encode("Hello wonderful World", false, false), false), "hello wonderful world");
}

}  // namespace
}  // namespace inferd
