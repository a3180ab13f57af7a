// The output processor's text side on a real vocabulary (gpt-oss's, committed
// in tests/data/vocab): streamed text never shows part of a stop string
// before it is decided, a stop string completed inside a step's several
// tokens (accepted drafts) cuts the tokens at the one completing it, and a
// finished beam's text is cut before its first stop string.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "engine/output_processor.h"
#include "gguf/gguf.h"
#include "test_data.h"

namespace inferd {
namespace {

class EngineOutputProcessor : public ::testing::Test {
 protected:
  void SetUp() override {
    auto file = gguf::File::open(inferd::test::test_data_root() + "/vocab/gpt-oss-vocab.gguf");
    ASSERT_TRUE(file.ok()) << file.error().message;
    auto tok = Tokenizer::from_gguf(**file);
    ASSERT_TRUE(tok.ok()) << tok.error().message;
    tok_ = std::move(*tok);
  }
  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(EngineOutputProcessor, StreamedTextHoldsBackWhatCouldStartAStopStringAndEndsBeforeIt) {
  const std::string text = "Hello world. The END of it";
  const std::vector<int32_t> tokens = tok_->encode(text, false, false);
  ASSERT_GT(tokens.size(), 4u);
  RequestText out(*tok_, false, {"END", "world!"});
  std::string emitted, stop_at;
  for (int32_t t : tokens) {
    ASSERT_EQ(out.append({t}, false), 1u);
    emitted += out.release(false, &stop_at);
    // Never a byte that a stop string could still claim.
    EXPECT_EQ(emitted, text.substr(0, emitted.size()));
    EXPECT_EQ(emitted.find("END"), std::string::npos);
    if (!stop_at.empty()) break;
  }
  EXPECT_EQ(stop_at, "END");
  EXPECT_EQ(emitted, "Hello world. The ");
}

TEST_F(EngineOutputProcessor, WithoutAStopStringEverythingIsReleasedAtTheEnd) {
  const std::string text = "Hello world. The EN";
  RequestText out(*tok_, false, {"END"});
  ASSERT_EQ(out.append(tok_->encode(text, false, false), false), tok_->encode(text, false, false).size());
  std::string stop_at;
  std::string emitted = out.release(false, &stop_at);
  EXPECT_EQ(emitted, "Hello world. The ");  // "EN" may begin "END"
  emitted += out.release(true, &stop_at);
  EXPECT_EQ(emitted, text);
  EXPECT_TRUE(stop_at.empty());
}

TEST_F(EngineOutputProcessor, AStopStringInsideSeveralTokensKeepsTheTokensUpToTheOneCompletingIt) {
  const std::string text = "one two STOP three four five";
  const std::vector<int32_t> tokens = tok_->encode(text, false, false);
  // The first token whose text completes "STOP", found by decoding prefixes.
  size_t completes = 0;
  for (size_t n = 1; n <= tokens.size(); ++n) {
    std::string prefix;
    for (size_t i = 0; i < n; ++i) prefix += tok_->token_to_piece(tokens[i], false);
    if (prefix.find("STOP") != std::string::npos) {
      completes = n;
      break;
    }
  }
  ASSERT_GT(completes, 0u);
  ASSERT_LT(completes, tokens.size());
  RequestText out(*tok_, false, {"STOP"});
  EXPECT_EQ(out.append(tokens, false), completes);
  std::string stop_at;
  EXPECT_EQ(out.release(true, &stop_at), "one two ");
  EXPECT_EQ(stop_at, "STOP");
}

TEST_F(EngineOutputProcessor, ABeamsTextIsCutBeforeItsFirstStopStringAndChecksCandidates) {
  const std::vector<int32_t> tokens = tok_->encode("alpha beta gamma", false, false);
  BeamText beams(*tok_, false, {"beta"});
  std::string stop_at;
  EXPECT_EQ(beams.render(tokens, false, &stop_at), "alpha ");
  EXPECT_EQ(stop_at, "beta");
  // One live beam, grown token by token: the candidate that completes "beta" is seen as ending it.
  size_t i = 0;
  for (; i < tokens.size(); ++i) {
    if (beams.completes_stop_string(0, tokens[i])) break;
    beams.advance({0}, {tokens[i]});
  }
  ASSERT_LT(i, tokens.size());
  std::string upto;
  for (size_t j = 0; j <= i; ++j) upto += tok_->token_to_piece(tokens[j], false);
  EXPECT_NE(upto.find("beta"), std::string::npos);
  EXPECT_EQ(upto.substr(0, upto.size() - tok_->token_to_piece(tokens[i], false).size()).find("beta"),
            std::string::npos);
}

}  // namespace
}  // namespace inferd
