// EngineArgs: vLLM-named engine arguments into an EngineConfig, with errors
// that name the argument as the front end spells it.
#include <gtest/gtest.h>

#include "engine/engine_args.h"
#include "engine/speculative_json.h"

namespace inferd {
namespace {

TEST(EngineArgs, BuildsTheConfig) {
  EngineArgs a;
  a.max_num_seqs = 7;
  a.max_num_batched_tokens = 512;
  a.max_model_len = 1024;
  a.kv_cache_memory = "1.5M";
  a.num_gpu_blocks_override = 300;
  a.block_size = 32;
  a.enable_prefix_caching = false;
  a.max_logprobs = 5;
  a.speculative_config = R"({"method": "ngram", "num_speculative_tokens": 3})";
  auto c = a.config();
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->max_num_seqs, 7);
  EXPECT_EQ(c->max_num_batched_tokens, 512);
  EXPECT_EQ(c->max_model_len, 1024);
  EXPECT_EQ(c->kv_cache_bytes, 1024 * 1024 * 3 / 2);
  EXPECT_EQ(c->num_gpu_blocks_override, 300);
  EXPECT_EQ(c->block_size, 32);
  EXPECT_FALSE(c->enable_prefix_caching);
  EXPECT_EQ(c->max_logprobs, 5);
  EXPECT_EQ(c->speculative.method, SpeculativeConfig::Method::kNgram);
  EXPECT_EQ(c->speculative.num_speculative_tokens, 3);
  EXPECT_EQ(c->speculative.first_drafts(), 3);  // n-grams: 3 at most, here k
}

// The numerics tier: exact unless asked, fast by name, anything else refused
// with the argument's name and the two tiers.
TEST(EngineArgs, NumericsTierIsExactByDefaultAndRefusesUnknownNames) {
  EngineArgs a;
  ASSERT_TRUE(a.config().ok());
  EXPECT_EQ(a.config()->numerics, kernels::Numerics::kExact);
  a.numerics = "fast";
  ASSERT_TRUE(a.config().ok());
  EXPECT_EQ(a.config()->numerics, kernels::Numerics::kFast);
  a.numerics = "fastest";
  auto flag = a.config();
  ASSERT_FALSE(flag.ok());
  EXPECT_NE(flag.error().message.find("--numerics 'fastest'"), std::string::npos) << flag.error().message;
  EXPECT_NE(flag.error().message.find("exact"), std::string::npos) << flag.error().message;
  auto keyword = a.config(EngineArgs::Naming::kKeyword);
  ASSERT_FALSE(keyword.ok());
  EXPECT_EQ(keyword.error().message.rfind("numerics 'fastest'", 0), 0u) << keyword.error().message;
}

TEST(EngineArgs, TheFirstProposalIsShortForNgramsAndSettable) {
  EngineArgs a;
  a.speculative_config = R"({"method": "ngram", "num_speculative_tokens": 8})";
  EXPECT_EQ(a.config()->speculative.first_drafts(), SpeculativeConfig::kNgramFirstDrafts);
  a.speculative_config = R"({"method": "ngram", "num_speculative_tokens": 8, "first_draft_tokens": 6})";
  EXPECT_EQ(a.config()->speculative.first_drafts(), 6);
  a.speculative_config = R"({"method": "ngram", "num_speculative_tokens": 8, "first_draft_tokens": 20})";
  EXPECT_EQ(a.config()->speculative.first_drafts(), 8);  // never more than k
  a.speculative_config = R"({"method": "ngram", "num_speculative_tokens": 8, "first_draft_tokens": -1})";
  EXPECT_NE(a.config().error().message.find("first_draft_tokens must be >= 0"), std::string::npos);
  a.speculative_config = R"({"method": "ngram", "num_speculative_tokens": 8, "first_draft_tokens": "2"})";
  EXPECT_NE(a.config().error().message.find("'first_draft_tokens' must be an integer"), std::string::npos);
}

TEST(EngineArgs, TheStateRollbackIsACheckpointUnlessSaidOtherwise) {
  EngineArgs a;
  a.speculative_config = R"({"method": "ngram", "num_speculative_tokens": 5})";
  EXPECT_EQ(a.config()->speculative.state_rollback, SpeculativeConfig::StateRollback::kCheckpoint);
  EXPECT_EQ(a.config()->speculative.state_checkpoints(), 1);
  a.speculative_config = R"({"method": "ngram", "num_speculative_tokens": 5, "state_rollback": "per-position"})";
  EXPECT_EQ(a.config()->speculative.state_rollback, SpeculativeConfig::StateRollback::kPerPosition);
  EXPECT_EQ(a.config()->speculative.state_checkpoints(), 5);
  a.speculative_config = R"({"method": "ngram", "num_speculative_tokens": 5, "state_rollback": "recompute"})";
  EXPECT_NE(a.config().error().message.find("'state_rollback' must be \"checkpoint\" or \"per-position\""),
            std::string::npos);
  // The CLI's --speculative-state-rollback edits the JSON of --speculative-config.
  auto edited = with_state_rollback(R"({"method": "ngram", "num_speculative_tokens": 5})", "per-position");
  ASSERT_TRUE(edited.ok()) << edited.error().message;
  EXPECT_EQ(parse_speculative_config(*edited)->state_rollback, SpeculativeConfig::StateRollback::kPerPosition);
  EXPECT_FALSE(with_state_rollback("", "checkpoint").ok());  // no speculation to roll back
  EXPECT_FALSE(with_state_rollback(R"({"method": "ngram", "num_speculative_tokens": 5})", "both").ok());
  EXPECT_EQ(SpeculativeConfig{}.state_checkpoints(), 0);  // speculation off
}

TEST(EngineArgs, ErrorsNameTheArgumentAsTheFrontEndSpellsIt) {
  EngineArgs a;
  a.kv_cache_memory = "lots";
  EXPECT_NE(a.config(EngineArgs::Naming::kFlag).error().message.find("--kv-cache-memory 'lots'"), std::string::npos);
  EXPECT_NE(a.config(EngineArgs::Naming::kKeyword).error().message.find("kv_cache_memory 'lots'"), std::string::npos);
  a = EngineArgs{};
  a.speculative_config = R"({"method": "eagle", "num_speculative_tokens": 2})";
  EXPECT_EQ(a.config(EngineArgs::Naming::kKeyword).error().message.rfind("speculative_config: ", 0), 0u);
  EXPECT_EQ(a.config().error().message.rfind("--speculative-config: ", 0), 0u);
}

TEST(EngineArgs, RefusesOutOfRangeValues) {
  for (auto set : {+[](EngineArgs& a) { a.max_num_seqs = 0; }, +[](EngineArgs& a) { a.max_num_seqs = int64_t{1} << 40; },
                   +[](EngineArgs& a) { a.block_size = 0; }, +[](EngineArgs& a) { a.max_num_batched_tokens = 0; },
                   +[](EngineArgs& a) { a.max_logprobs = -1; }, +[](EngineArgs& a) { a.max_model_len = -5; },
                   +[](EngineArgs& a) { a.kv_cache_memory_fraction = 1.5; },
                   +[](EngineArgs& a) { a.num_gpu_blocks_override = -1; }}) {
    EngineArgs a;
    set(a);
    EXPECT_FALSE(a.config().ok());
  }
  EngineArgs none_running;
  none_running.max_num_seqs = 0;
  EXPECT_NE(none_running.config(EngineArgs::Naming::kKeyword).error().message.find("max_num_seqs is 0"),
            std::string::npos);
}

}  // namespace
}  // namespace inferd
