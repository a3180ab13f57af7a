// Beam search in the engine on the default model (its beams against llama.cpp's are
// engine_beam_search_reference_test.cpp): the same beams when a group is cut by the
// budget and when it is preempted and recomputed; abort
// in the middle of a search frees every beam's blocks; stop strings end beams;
// requests that cannot run are refused with a reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "engine_test_util.h"

namespace inferd {
namespace {

using test::Outputs;

class EngineBeams : public test::ModelTest {
 protected:
  static GenerationParams beam_request(std::vector<int32_t> prompt, int64_t max_tokens, int32_t width,
                                       float length_penalty = 1.0f, EarlyStopping es = EarlyStopping::kFalse) {
    GenerationParams p = request(std::move(prompt), max_tokens);
    p.ignore_eos = false;
    p.beam_search = BeamSearchParams{width, length_penalty, es};
    return p;
  }

  // Runs the requests to the end on an engine with this config; returns each one's final output.
  std::map<std::string, RequestOutput> run(const EngineConfig& c, const std::vector<GenerationParams>& requests,
                                           EngineStats* stats = nullptr) {
    auto engine = make_engine(c);
    EXPECT_TRUE(engine);
    if (!engine) return {};
    std::vector<std::string> ids;
    for (const GenerationParams& p : requests) ids.push_back(add(*engine, p));
    Outputs out;
    test::run_until_idle(*engine, out);
    test::expect_idle_and_clean(*engine);
    if (stats) *stats = engine->stats();
    std::map<std::string, RequestOutput> finals;
    for (const std::string& id : ids) {
      EXPECT_TRUE(out.requests[id].finished) << id;
      finals[id] = out.requests[id].final_output;
    }
    return finals;
  }
};

// A prompt's logits depend on how it is chunked where llama.cpp's do (a
// one-token chunk takes the decode kernels: docs/design.md, "Logit
// tolerance"), so these tests keep every prompt whole in one step, or split
// into chunks of two tokens or more, and vary what beam search adds: groups
// cut by the budget, preempted and recomputed, sharing steps with others.

void expect_same_beams(const RequestOutput& got, const RequestOutput& want, const std::string& id) {
  SCOPED_TRACE(id);
  ASSERT_TRUE(got.finished);
  ASSERT_EQ(got.beams.size(), want.beams.size());
  for (size_t k = 0; k < got.beams.size(); ++k) {
    EXPECT_EQ(got.beams[k].token_ids, want.beams[k].token_ids) << "beam " << k;
    EXPECT_EQ(got.beams[k].text, want.beams[k].text) << "beam " << k;
    EXPECT_EQ(got.beams[k].cumulative_logprob, want.beams[k].cumulative_logprob) << "beam " << k;
  }
}

TEST_F(EngineBeams, AGroupCutByTheBudgetWaitsWithoutChangingItsBeams) {
  GenerationParams a = beam_request(random_prompt(6, 21), 10, 4);
  a.request_id = "a";
  GenerationParams b = beam_request(random_prompt(2, 22), 12, 3);
  b.request_id = "b";
  const RequestOutput alone_a = run(engine_config(512, 8, 200), {a})["a"];
  const RequestOutput alone_b = run(engine_config(512, 8, 200), {b})["b"];
  ASSERT_EQ(alone_a.beams.size(), 4u);

  // 6 tokens a step: a's prompt whole, then its 4 beams; b's 2-token prompt
  // whole beside them; then b's 3 beams get the 2 tokens a leaves: b's rows
  // are not used until a has finished.
  auto engine = make_engine(engine_config(6, 8, 200));
  ASSERT_TRUE(engine);
  Outputs out;
  add(*engine, a);
  test::step(*engine, out);
  add(*engine, b);
  int64_t steps_b_split = 0;
  while (engine->has_pending_work()) {
    const int64_t running = engine->stats().scheduler.num_running;
    test::step(*engine, out);
    steps_b_split += running == 7;  // 4 + 3 beams, 6 tokens
    ASSERT_LT(out.steps, 200);
  }
  test::expect_idle_and_clean(*engine);
  EXPECT_GT(steps_b_split, 3);
  expect_same_beams(out.requests["a"].final_output, alone_a, "a");
  expect_same_beams(out.requests["b"].final_output, alone_b, "b");
}

TEST_F(EngineBeams, APreemptedGroupIsRecomputedToTheSameBeams) {
  // Short prompts and a budget that takes each whole; 13 blocks of 16 tokens,
  // where three plain requests of 10 + 60 tokens (5 blocks each) and two beam
  // groups do not fit at once. The groups come last, so they are the newest
  // running requests, the ones preempted to make room.
  std::vector<GenerationParams> all;
  for (int i = 0; i < 3; ++i) {
    all.push_back(request(random_prompt(10, 30 + i), 60));
    all.back().request_id = "plain" + std::to_string(i);
  }
  for (int i = 0; i < 2; ++i) {
    all.push_back(beam_request(random_prompt(9 + i, 40 + i), 20, 3 - i));
    all.back().request_id = "beams" + std::to_string(i);
  }
  std::map<std::string, RequestOutput> alone;
  for (const GenerationParams& p : all) alone[p.request_id] = run(engine_config(512, 8, 200), {p})[p.request_id];
  EngineStats stats;
  auto together = run(engine_config(256, 8, 14), all, &stats);
  int32_t group_preemptions = 0;
  for (const GenerationParams& p : all) {
    if (p.beam_search) {
      group_preemptions += together[p.request_id].metrics.num_preemptions;
      expect_same_beams(together[p.request_id], alone[p.request_id], p.request_id);
    } else {
      EXPECT_EQ(together[p.request_id].token_ids, alone[p.request_id].token_ids) << p.request_id;
    }
  }
  std::printf("[ info ] %lld preemptions, %d of beam groups\n", static_cast<long long>(stats.scheduler.preemptions),
              group_preemptions);
  EXPECT_GT(group_preemptions, 0);
}

TEST_F(EngineBeams, AbortInTheMiddleOfASearchFreesEveryBeam) {
  auto engine = make_engine(engine_config(256, 8, 100));
  ASSERT_TRUE(engine);
  const std::string id = add(*engine, beam_request(random_prompt(40, 3), 30, 4));
  Outputs out;
  for (int i = 0; i < 5; ++i) test::step(*engine, out);
  EXPECT_EQ(engine->stats().scheduler.num_running, 4);
  EXPECT_GT(engine->stats().scheduler.kv_used_blocks, 3);
  // A beam alone cannot be aborted (the search would wait for its row); of
  // these names, four are live beams.
  for (int k = 0; k < 24; ++k) engine->abort(id + "#beam" + std::to_string(k));
  test::step(*engine, out);
  EXPECT_EQ(engine->stats().scheduler.num_running, 4);
  EXPECT_FALSE(out.requests[id].finished);
  engine->abort(id);
  test::step(*engine, out);
  ASSERT_TRUE(out.requests[id].finished);
  EXPECT_EQ(out.requests[id].final_output.status, RequestStatus::kFinishedAborted);
  EXPECT_TRUE(out.requests[id].final_output.beams.empty());
  test::expect_idle_and_clean(*engine);
  EXPECT_FALSE(engine->has_pending_work());
}

TEST_F(EngineBeams, AStopStringEndsTheBeamsThatWriteIt) {
  const std::vector<int32_t> prompt = random_prompt(30, 5);
  auto plain = run(engine_config(256, 8, 100), {beam_request(prompt, 12, 3)});
  const RequestOutput& first = plain.begin()->second;
  ASSERT_FALSE(first.beams.empty());
  // A piece of the best beam's text, from its middle: it must now end there.
  const std::string& text = first.beams[0].text;
  ASSERT_GT(text.size(), 6u);
  GenerationParams p = beam_request(prompt, 12, 3);
  p.stop = {text.substr(text.size() / 2, 3)};
  auto stopped = run(engine_config(256, 8, 100), {p});
  const RequestOutput& got = stopped.begin()->second;
  ASSERT_FALSE(got.beams.empty());
  bool one_stopped = false;
  for (const BeamOutput& b : got.beams) {
    EXPECT_EQ(b.text.find(p.stop[0]), std::string::npos) << b.text;
    if (b.stop_string == p.stop[0]) {
      EXPECT_EQ(b.status, RequestStatus::kFinishedStopped);
      one_stopped = true;
    }
  }
  EXPECT_TRUE(one_stopped);
}

TEST_F(EngineBeams, RequestsThatCannotRunAreRefusedWithAReason) {
  auto engine = make_engine(engine_config(256, 4, 100));
  ASSERT_TRUE(engine);
  auto expect_refused = [&](GenerationParams p, const std::string& words) {
    auto h = engine->add_request(std::move(p));
    ASSERT_FALSE(h.ok());
    EXPECT_NE(h.error().message.find(words), std::string::npos) << h.error().message;
  };
  expect_refused(beam_request(random_prompt(10, 1), 8, 5), "max_num_seqs");
  expect_refused(beam_request(random_prompt(10, 1), 8, 0), "beam width");
  expect_refused(beam_request(random_prompt(10, 1), 8, 2, NAN), "length_penalty");
  // 4 beams of 10 + 500 tokens do not fit 99 blocks of 16.
  expect_refused(beam_request(random_prompt(10, 1), 500, 4), "for each of 4 beams");
  GenerationParams lp = beam_request(random_prompt(10, 1), 8, 2);
  lp.logprobs = 1;
  expect_refused(lp, "logprobs");
  GenerationParams named = beam_request(random_prompt(10, 1), 8, 2);
  named.request_id = "x#beam1";
  expect_refused(named, "#beam");
  test::expect_idle_and_clean(*engine);
}

}  // namespace
}  // namespace inferd
