// The router's instance choice and request bodies, with no I/O.
#include <gtest/gtest.h>

#include "router/instance_choice.h"
#include "router/router.h"

namespace inferd::router {
namespace {

using ordered_json = nlohmann::ordered_json;
using Clock = InstanceChooser::Clock;

std::string text_of(size_t bytes, char fill) { return std::string(bytes, fill); }

TEST(ChunkHashes, ChainedOverWholeChunksAndSalted) {
  const std::string a = text_of(200, 'a');
  const auto h = chunk_hashes(a, "m");
  ASSERT_EQ(h.size(), 200 / kPrefixChunkBytes);  // the partial chunk is left out
  // A shared prefix shares hashes up to where the texts part; after that the chain differs.
  std::string b = a;
  b[kPrefixChunkBytes + 3] = 'b';
  const auto hb = chunk_hashes(b, "m");
  EXPECT_EQ(hb[0], h[0]);
  EXPECT_NE(hb[1], h[1]);
  EXPECT_NE(hb[2], h[2]);  // chained: equal chunk text, different prefix
  EXPECT_NE(chunk_hashes(a, "other model")[0], h[0]);
}

TEST(PromptText, CompletionsAndChat) {
  EXPECT_EQ(prompt_text(ordered_json::parse(R"({"prompt": "abc"})"), false), "abc");
  EXPECT_EQ(prompt_text(ordered_json::parse(R"({"prompt": ["first", "second"]})"), false), "first");
  EXPECT_EQ(prompt_text(ordered_json::parse(R"({"prompt": [1, 2]})"), false), "1,2,");
  const std::string chat =
      prompt_text(ordered_json::parse(R"({"messages": [{"role": "user", "content": "hi"}]})"), true);
  EXPECT_EQ(chat, "user\x1fhi\x1e");
  EXPECT_EQ(prompt_text(ordered_json::parse(R"({"messages": 3})"), true), "");
}

TEST(PrefixLru, MatchesFromTheStartAndEvictsTheOldest) {
  PrefixLru lru(3);
  lru.insert({1, 2, 3});
  EXPECT_EQ(lru.matched({1, 2, 3, 4}), 3u);
  EXPECT_EQ(lru.matched({2, 3}), 2u);
  EXPECT_EQ(lru.matched({9, 1}), 0u);  // a prefix, not any hash
  lru.insert({1});                     // refreshed: 2 is now the oldest
  lru.insert({4});
  EXPECT_EQ(lru.size(), 3u);
  EXPECT_EQ(lru.matched({1}), 1u);
  EXPECT_EQ(lru.matched({2}), 0u);
}

TEST(InstanceChooser, PrefillFollowsTheLongestCachedPrefix) {
  InstanceChooser c({"p0", "p1", "p2"}, {"d0"});
  const std::vector<uint64_t> shared = {10, 11, 12, 13};
  const auto first = c.pick_prefill(shared);
  ASSERT_TRUE(first);
  // The same prefix again, and a longer prompt that starts with it, go where it was sent.
  EXPECT_EQ(c.pick_prefill(shared), first);
  EXPECT_EQ(c.pick_prefill({10, 11, 12, 13, 14, 15}), first);
  // A prompt no instance has seen goes to the least loaded.
  c.begin(Role::kPrefill, *first);
  const auto other = c.pick_prefill({99});
  EXPECT_NE(other, first);
}

TEST(InstanceChooser, PrefillTiesGoToTheLeastLoaded) {
  InstanceChooser c({"p0", "p1"}, {"d0"});
  c.begin(Role::kPrefill, 0);
  c.begin(Role::kPrefill, 0);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(c.pick_prefill({static_cast<uint64_t>(100 + i)}), 1u);
}

TEST(InstanceChooser, AnOverloadedInstanceLosesItsPrefixPreference) {
  ChoiceConfig config;
  config.max_prefix_imbalance = 3;
  InstanceChooser c({"p0", "p1"}, {"d0"}, config);
  const auto home = *c.pick_prefill({1, 2, 3});
  for (int i = 0; i < 2; ++i) c.begin(Role::kPrefill, home);
  EXPECT_EQ(c.pick_prefill({1, 2, 3}), home);  // 2 more in flight: still preferred
  c.begin(Role::kPrefill, home);
  EXPECT_NE(c.pick_prefill({1, 2, 3}), home);  // 3 more: load decides
}

TEST(InstanceChooser, DecodeByLoadAndInstancesDownLast) {
  InstanceChooser c({}, {"d0", "d1", "d2"});
  EXPECT_FALSE(c.pick_prefill({1}));  // no prefill instances: straight to decode
  c.begin(Role::kDecode, 0);
  c.begin(Role::kDecode, 0);
  c.begin(Role::kDecode, 2);
  EXPECT_EQ(c.decode_order(), (std::vector<size_t>{1, 2, 0}));
  const Clock::time_point now = Clock::now();
  c.mark_down(Role::kDecode, 1, now);
  EXPECT_EQ(c.decode_order(now), (std::vector<size_t>{2, 0, 1}));
  // After the cooldown it is back, and the least loaded again.
  EXPECT_EQ(c.decode_order(now + std::chrono::seconds(3)), (std::vector<size_t>{1, 2, 0}));
  c.end(Role::kDecode, 0);
  EXPECT_EQ(c.in_flight(Role::kDecode, 0), 1);
}

TEST(InstanceChooser, APrefillInstanceDownIsPassedOverUnlessAllAre) {
  InstanceChooser c({"p0", "p1"}, {"d0"});
  const Clock::time_point now = Clock::now();
  const auto home = *c.pick_prefill({7, 8}, now);
  c.mark_down(Role::kPrefill, home, now);
  EXPECT_NE(c.pick_prefill({7, 8}, now), home);
  c.mark_down(Role::kPrefill, 1 - home, now);
  EXPECT_TRUE(c.pick_prefill({7, 8}, now));  // all down: one is tried anyway
}

TEST(RouterBodies, PrefillAsksForOneTokenAndTheBlocks) {
  const auto request = ordered_json::parse(
      R"({"model": "m", "messages": [], "max_completion_tokens": 50, "stream": true,
          "stream_options": {"include_usage": true}, "n": 3, "response_format": {"type": "json_schema",
          "json_schema": {"schema": {"properties": {"z": {}, "a": {}}}}}})");
  const ordered_json p = prefill_body(request);
  EXPECT_EQ(p["max_tokens"], 1);
  EXPECT_EQ(p["max_completion_tokens"], 1);
  EXPECT_EQ(p["stream"], false);
  EXPECT_FALSE(p.contains("stream_options"));
  EXPECT_EQ(p["n"], 1);
  EXPECT_EQ(p["kv_transfer_params"]["do_remote_decode"], true);
  // Key order is kept: a schema's property order is the order fields are generated in.
  EXPECT_NE(p.dump().find(R"({"z":{},"a":{}})"), std::string::npos);
  // A beam search's prompt is prefilled as a plain request (the decode side runs the beams).
  const ordered_json beams = prefill_body(ordered_json::parse(
      R"({"prompt": "x", "n": 2, "use_beam_search": true, "length_penalty": 0.5, "early_stopping": true})"));
  for (const char* key : {"use_beam_search", "length_penalty", "early_stopping"}) EXPECT_FALSE(beams.contains(key));
  EXPECT_EQ(beams["n"], 1);

  const nlohmann::json params = {{"do_remote_prefill", true}, {"remote_engine_id", "e"}};
  const ordered_json d = decode_body(request, &params);
  EXPECT_EQ(d["kv_transfer_params"]["remote_engine_id"], "e");
  EXPECT_EQ(d["max_completion_tokens"], 50);
  EXPECT_EQ(d["stream"], true);
  EXPECT_EQ(decode_body(request, nullptr), request);
}

}  // namespace
}  // namespace inferd::router
