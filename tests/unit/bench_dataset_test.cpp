// Benchmark datasets: random token prompts (lengths, shared prefix,
// determinism) and JSONL prompts and conversations.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "bench/dataset.h"

namespace inferd::bench {
namespace {

const std::vector<int32_t> kPool = {10, 11, 12, 13, 14};

TEST(BenchDataset, RandomPromptsHaveExactLengthsAndSharedPrefix) {
  RandomDatasetOptions o;
  o.num_prompts = 20;
  o.input_len = 16;
  o.output_len = 8;
  o.prefix_len = 5;
  o.seed = 3;
  const auto reqs = make_random_dataset(o, kPool);
  ASSERT_EQ(reqs.size(), 20u);
  const auto& first = std::get<std::vector<int32_t>>(reqs[0].prompt);
  for (const SampleRequest& r : reqs) {
    const auto& ids = std::get<std::vector<int32_t>>(r.prompt);
    EXPECT_EQ(ids.size(), 21u);
    EXPECT_EQ(r.prompt_len, 21);
    EXPECT_EQ(r.expected_output_len, 8);
    EXPECT_TRUE(std::equal(ids.begin(), ids.begin() + 5, first.begin()));
    for (int32_t id : ids) EXPECT_TRUE(id >= 10 && id <= 14);
  }
  // Same seed, same prompts; another seed, others.
  EXPECT_EQ(std::get<std::vector<int32_t>>(make_random_dataset(o, kPool)[7].prompt),
            std::get<std::vector<int32_t>>(reqs[7].prompt));
  o.seed = 4;
  EXPECT_NE(std::get<std::vector<int32_t>>(make_random_dataset(o, kPool)[7].prompt),
            std::get<std::vector<int32_t>>(reqs[7].prompt));
}

TEST(BenchDataset, RangeRatioSpreadsLengths) {
  uint64_t state = 1;
  int64_t lo = 1000, hi = 0;
  for (int i = 0; i < 2000; ++i) {
    const int64_t n = spread_length(100, 0.5, state);
    lo = std::min(lo, n);
    hi = std::max(hi, n);
  }
  EXPECT_EQ(lo, 50);
  EXPECT_EQ(hi, 150);
  EXPECT_EQ(spread_length(1, 0.9, state), 1);  // never below one token
}

class JsonlTest : public ::testing::Test {
 protected:
  std::string write(const std::string& text) {
    path_ = std::filesystem::temp_directory_path() /
            ("inferd_bench_dataset_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".jsonl");
    std::ofstream(path_) << text;
    return path_.string();
  }
  void TearDown() override { std::filesystem::remove(path_); }
  std::filesystem::path path_;
};

// One token per whitespace-separated word.
int64_t words(const std::string& s) {
  int64_t n = 0;
  bool in = false;
  for (char c : s) {
    if (c == ' ') in = false;
    else if (!in) in = true, ++n;
  }
  return n;
}

TEST_F(JsonlTest, PromptsAndConversationsForCompletions) {
  const std::string path = write(
      R"({"prompt": "one two three", "output_len": 7})" "\n"
      "\n"
      R"({"conversations": [{"from": "human", "value": "hi there"}, {"from": "gpt", "value": "a b c d"}]})" "\n"
      R"({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]})" "\n");
  JsonlDatasetOptions o;
  o.num_prompts = 4;
  auto reqs = load_jsonl_dataset(path, o, words);
  ASSERT_TRUE(reqs) << reqs.error().message;
  ASSERT_EQ(reqs->size(), 4u);
  EXPECT_EQ(std::get<std::string>((*reqs)[0].prompt), "one two three");
  EXPECT_EQ((*reqs)[0].prompt_len, 3);
  EXPECT_EQ((*reqs)[0].expected_output_len, 7);
  EXPECT_EQ(std::get<std::string>((*reqs)[1].prompt), "hi there");
  EXPECT_EQ((*reqs)[1].expected_output_len, 4);  // the reference reply's tokens
  EXPECT_EQ(std::get<std::string>((*reqs)[2].prompt), "q");
  EXPECT_EQ((*reqs)[2].expected_output_len, 128);  // nothing says: the default
  EXPECT_EQ(std::get<std::string>((*reqs)[3].prompt), "one two three");  // lines reused in order
}

TEST_F(JsonlTest, ConversationsForChatDropTheReferenceReply) {
  const std::string path = write(
      R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b c"},)"
      R"( {"role": "user", "content": "d"}, {"role": "assistant", "content": "e f g"}]})" "\n"
      R"({"prompt": "p"})" "\n");
  JsonlDatasetOptions o;
  o.num_prompts = 2;
  o.chat = true;
  auto reqs = load_jsonl_dataset(path, o, words);
  ASSERT_TRUE(reqs) << reqs.error().message;
  const auto& m0 = std::get<ChatMessages>((*reqs)[0].prompt).messages;
  ASSERT_EQ(m0.size(), 3u);
  EXPECT_EQ(m0[2]["content"], "d");
  EXPECT_EQ((*reqs)[0].expected_output_len, 3);
  const auto& m1 = std::get<ChatMessages>((*reqs)[1].prompt).messages;
  EXPECT_EQ(m1, nlohmann::json::parse(R"([{"role":"user","content":"p"}])"));
  o.output_len = 5;  // the flag overrides
  EXPECT_EQ((*load_jsonl_dataset(path, o, words))[0].expected_output_len, 5);
}

TEST_F(JsonlTest, BadLinesNameTheirLineNumber) {
  const std::string path = write("{\"prompt\": \"ok\"}\n{\"prompt\": 3}\n");
  auto reqs = load_jsonl_dataset(path, {}, nullptr);
  ASSERT_FALSE(reqs);
  EXPECT_NE(reqs.error().message.find(":2:"), std::string::npos);
  EXPECT_FALSE(load_jsonl_dataset(write("not json\n"), {}, nullptr));
  EXPECT_FALSE(load_jsonl_dataset(write(R"({"text": "x"})"), {}, nullptr));
  EXPECT_FALSE(load_jsonl_dataset("/nonexistent/file.jsonl", {}, nullptr));
}

}  // namespace
}  // namespace inferd::bench
