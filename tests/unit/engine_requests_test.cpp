// The engine's request life cycle on the default model: abort in every state,
// seeded sampling across batch compositions, stop strings across token
// boundaries, stop tokens and end-of-generation, logprobs, refused requests,
// and the loop thread with per-request streams.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <thread>

#include "engine_test_util.h"

namespace inferd {
namespace {

using test::Collected;
using test::Outputs;

class EngineRequests : public test::ModelTest {
 protected:
  static const RequestOutput* find_final(const std::vector<RequestOutput>& outs,
                                         const std::string& id) {
    for (const RequestOutput& o : outs)
      if (o.request_id == id && o.finished) return &o;
    return nullptr;
  }
};

// ---------------------------------------------------------------------------
// Abort

TEST_F(EngineRequests, AbortWhileQueuedMidPrefillAndMidDecodeFreesBlocksWithinOneStep) {
  // A budget of 32 tokens and one running request at a time; no prefix cache,
  // so a freed block is simply free.
  auto engine = make_engine(engine_config(32, 1, 64, /*prefix_caching=*/false));
  ASSERT_TRUE(engine);
  const std::string a = add(*engine, request(random_prompt(100, 1), 40));
  const std::string b = add(*engine, request(random_prompt(20, 2), 4));
  std::vector<RequestOutput> outs = engine->step();
  EXPECT_TRUE(outs.empty());
  EXPECT_EQ(engine->stats().scheduler.num_running, 1);
  EXPECT_EQ(engine->stats().scheduler.num_waiting, 1);
  EXPECT_EQ(engine->stats().scheduler.kv_used_blocks, 2);  // a: 32 tokens

  // Queued: b ends in the next step and never held a block.
  engine->abort(b);
  outs = engine->step();
  const RequestOutput* fb = find_final(outs, b);
  ASSERT_NE(fb, nullptr) << "the abort of a queued request is reported in the next step";
  EXPECT_EQ(fb->status, RequestStatus::kFinishedAborted);
  EXPECT_STREQ(fb->finish_reason(), "abort");
  EXPECT_TRUE(fb->token_ids.empty());
  EXPECT_EQ(fb->metrics.first_scheduled_time, 0.0);
  EngineStats st = engine->stats();
  EXPECT_EQ(st.scheduler.num_waiting, 0);
  EXPECT_EQ(st.scheduler.kv_used_blocks, 4);  // a alone: 64 tokens
  EXPECT_EQ(st.scheduler.aborted, 1);

  // Mid-prefill: a has computed 64 of its 100 prompt tokens.
  engine->abort(a);
  outs = engine->step();
  const RequestOutput* fa = find_final(outs, a);
  ASSERT_NE(fa, nullptr);
  EXPECT_EQ(fa->status, RequestStatus::kFinishedAborted);
  EXPECT_TRUE(fa->token_ids.empty());
  EXPECT_GT(fa->metrics.first_scheduled_time, 0.0);
  test::expect_idle_and_clean(*engine);
  EXPECT_FALSE(engine->has_pending_work());

  // Mid-decode: c has sampled three tokens.
  const std::string c = add(*engine, request(random_prompt(20, 3), 50));
  Outputs run;
  while (run.requests[c].tokens.size() < 3) test::step(*engine, run);
  EXPECT_EQ(engine->stats().scheduler.kv_used_blocks, 2);  // 20 + 2 tokens computed, one more slot
  engine->abort(c);
  outs = engine->step();
  const RequestOutput* fc = find_final(outs, c);
  ASSERT_NE(fc, nullptr);
  EXPECT_EQ(fc->status, RequestStatus::kFinishedAborted);
  EXPECT_EQ(fc->metrics.num_output_tokens, 3);
  test::expect_idle_and_clean(*engine);

  // Added and aborted before any step: it is never scheduled.
  const std::string d = add(*engine, request(random_prompt(20, 4), 5));
  engine->abort(d);
  outs = engine->step();
  ASSERT_NE(find_final(outs, d), nullptr);
  EXPECT_EQ(find_final(outs, d)->metrics.first_scheduled_time, 0.0);
  // Unknown and already finished ids are ignored.
  engine->abort("no-such-request");
  engine->abort(c);
  EXPECT_TRUE(engine->step().empty());
  test::expect_idle_and_clean(*engine);
  EXPECT_EQ(engine->stats().scheduler.aborted, 4);
}

TEST_F(EngineRequests, AbortFromAnotherThreadWhileTheLoopRunsFreesBlocksWithinOneStep) {
  auto engine = make_engine(engine_config(64, 8, 64));
  ASSERT_TRUE(engine);
  engine->start();
  auto h = engine->add_request(request(random_prompt(50, 5), 400));
  ASSERT_TRUE(h.ok()) << h.error().message;
  size_t tokens = 0;
  while (tokens < 3) {
    auto o = h->stream->next();
    ASSERT_TRUE(o.has_value());
    tokens += o->token_ids.size();
  }
  engine->abort(h->request_id);
  // The step running now may still finish; the abort lands before the next one.
  const EngineStats at_abort = engine->stats();
  std::optional<RequestOutput> last;
  while (auto o = h->stream->next()) last = std::move(o);
  ASSERT_TRUE(last.has_value());
  EXPECT_TRUE(last->finished);
  EXPECT_EQ(last->status, RequestStatus::kFinishedAborted);
  EXPECT_TRUE(h->stream->finished());
  const EngineStats st = engine->stats();
  EXPECT_LE(st.scheduler.steps, at_abort.scheduler.steps + 1);
  EXPECT_LE(last->metrics.num_output_tokens, at_abort.generation_tokens + 1);
  EXPECT_EQ(st.scheduler.kv_used_blocks, 0);
  EXPECT_EQ(st.scheduler.num_running, 0);
  engine->stop();
  test::expect_idle_and_clean(*engine);
}

TEST_F(EngineRequests, DestroyingTheEngineEndsOpenStreams) {
  std::shared_ptr<RequestStream> running, queued;
  {
    auto engine = make_engine(engine_config(64, 1, 64));
    ASSERT_TRUE(engine);
    engine->start();
    auto h1 = engine->add_request(request(random_prompt(10, 6), 400));
    auto h2 = engine->add_request(request(random_prompt(10, 7), 400));
    ASSERT_TRUE(h1.ok() && h2.ok());
    running = h1->stream;
    queued = h2->stream;
    ASSERT_TRUE(running->next().has_value());  // it is decoding
  }
  std::optional<RequestOutput> last;
  while (auto o = running->next()) last = std::move(o);
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(last->status, RequestStatus::kFinishedAborted);
  auto q = queued->next();
  ASSERT_TRUE(q.has_value());
  EXPECT_TRUE(q->finished);
  EXPECT_EQ(q->status, RequestStatus::kFinishedAborted);
}

// ---------------------------------------------------------------------------
// Seeded sampling

TEST_F(EngineRequests, SeededSamplingGivesTheSameTokensWhateverShareTheBatch) {
  constexpr int64_t kMaxTokens = 16;
  std::vector<GenerationParams> sampled;
  for (int i = 0; i < 4; ++i) {
    SamplingParams sp;
    sp.temperature = 0.8f;
    sp.top_p = 0.9f;
    sp.seed = 1000 + i;
    sampled.push_back(request(random_prompt(10 + 17 * i, 40 + i), kMaxTokens, sp));
  }
  // Alone, by the single-sequence generator.
  std::vector<std::vector<int32_t>> alone;
  for (const GenerationParams& p : sampled)
    alone.push_back(run_alone(p.prompt_token_ids, kMaxTokens, p.sampling));

  auto run_batch = [&](int64_t budget, int32_t max_seqs, bool reversed, int n_noise) {
    auto engine = make_engine(engine_config(budget, max_seqs, 200));
    std::vector<std::string> ids(sampled.size());
    for (int j = 0; j < n_noise; ++j)  // greedy requests with longer prompts share the steps
      add(*engine, request(random_prompt(60 + 40 * j, 90 + j), 6 + j));
    for (size_t k = 0; k < sampled.size(); ++k) {
      const size_t i = reversed ? sampled.size() - 1 - k : k;
      ids[i] = add(*engine, sampled[i]);
    }
    Outputs run;
    test::run_until_idle(*engine, run);
    std::vector<std::vector<int32_t>> out;
    for (const std::string& id : ids) out.push_back(run.requests[id].tokens);
    return out;
  };
  const auto mixed = run_batch(64, 16, false, 4);
  const auto queued = run_batch(16, 3, true, 2);
  for (size_t i = 0; i < sampled.size(); ++i) {
    ASSERT_EQ(alone[i].size(), static_cast<size_t>(kMaxTokens));
    EXPECT_EQ(mixed[i], alone[i]) << "request " << i;
    EXPECT_EQ(queued[i], alone[i]) << "request " << i;
  }
  // The outputs really are sampled: some differ from the greedy ones.
  int differ = 0;
  for (size_t i = 0; i < sampled.size(); ++i)
    differ += alone[i] != run_alone(sampled[i].prompt_token_ids, kMaxTokens);
  EXPECT_GT(differ, 0);
}

// ---------------------------------------------------------------------------
// Stop strings, stop tokens, end of generation

class EngineStops : public EngineRequests {
 protected:
  void SetUp() override {
    EngineRequests::SetUp();
    if (IsSkipped()) return;
    prompt_ = model_->tokenizer().encode("The capital of France is", true, false);
    full_ = generate({}, {});
    ASSERT_TRUE(full_.finished);
    ASSERT_EQ(full_.tokens.size(), static_cast<size_t>(kMaxTokens));
    // With no stop string the text is the tokens' pieces joined.
    std::string joined;
    for (int32_t t : full_.tokens) {
      pieces_.push_back(model_->tokenizer().token_to_piece(t, false));
      joined += pieces_.back();
    }
    ASSERT_EQ(full_.text, joined);
  }

  Collected generate(std::vector<std::string> stop, std::vector<int32_t> stop_tokens) {
    auto engine = make_engine(engine_config(64, 4, 64));
    GenerationParams p = request(prompt_, kMaxTokens);
    p.stop = std::move(stop);
    p.stop_token_ids = std::move(stop_tokens);
    const std::string id = add(*engine, p);
    Outputs run;
    test::run_until_idle(*engine, run);
    test::expect_idle_and_clean(*engine);
    return run.requests[id];
  }

  // Index of the token whose piece completes text position `end` (exclusive).
  size_t token_ending_at(size_t end) const {
    size_t len = 0;
    for (size_t j = 0; j < pieces_.size(); ++j)
      if ((len += pieces_[j].size()) >= end) return j;
    return pieces_.size();
  }

  static constexpr int64_t kMaxTokens = 24;
  std::vector<int32_t> prompt_;
  Collected full_;
  std::vector<std::string> pieces_;
};

TEST_F(EngineStops, StopStringAcrossTokenBoundariesIsNotEmitted) {
  // A boundary between two pieces of at least two ASCII bytes each.
  size_t k = 0;
  for (size_t j = 1; j + 1 < pieces_.size() && !k; ++j)
    if (pieces_[j - 1].size() >= 2 && pieces_[j].size() >= 2) k = j;
  ASSERT_GT(k, 0u) << "no suitable token boundary in: " << full_.text;
  const std::string stop = pieces_[k - 1].substr(pieces_[k - 1].size() - 2) + pieces_[k].substr(0, 2);
  const size_t at = full_.text.find(stop);
  ASSERT_NE(at, std::string::npos);

  const Collected c = generate({"never\x01", stop}, {});
  ASSERT_TRUE(c.finished);
  EXPECT_EQ(c.final_output.status, RequestStatus::kFinishedStopped);
  EXPECT_EQ(c.final_output.stop_string, stop);
  EXPECT_EQ(c.text, full_.text.substr(0, at)) << "stop string: '" << stop << "'";
  // Generation ended with the token that completed the stop string.
  const size_t last = token_ending_at(at + stop.size());
  EXPECT_EQ(c.tokens, std::vector<int32_t>(full_.tokens.begin(), full_.tokens.begin() + last + 1));
  // Emitted text only grows by what was released: no delta ever contains the stop string.
  for (const RequestOutput& o : c.deltas) EXPECT_EQ(o.text.find(stop), std::string::npos);

  // A stop string that spans three tokens.
  if (k + 1 < pieces_.size()) {
    const std::string three = pieces_[k - 1].substr(pieces_[k - 1].size() - 1) + pieces_[k] +
                              pieces_[k + 1].substr(0, 1);
    const Collected c3 = generate({three}, {});
    EXPECT_EQ(c3.final_output.status, RequestStatus::kFinishedStopped);
    EXPECT_EQ(c3.text, full_.text.substr(0, full_.text.find(three)));
  }
}

TEST_F(EngineStops, HeldBackTextIsReleasedWhenNoStopStringCompletes) {
  // The stop string starts with the last two bytes of the next-to-last piece
  // and goes on with the last piece, then a byte the text never has: those
  // bytes are held back for two steps, and finishing by length releases them.
  const size_t n = pieces_.size();
  ASSERT_GE(pieces_[n - 2].size(), 2u);
  const std::string tail = pieces_[n - 2].substr(pieces_[n - 2].size() - 2) + pieces_[n - 1];
  const Collected c = generate({tail + "\x01"}, {});
  ASSERT_TRUE(c.finished);
  EXPECT_EQ(c.final_output.status, RequestStatus::kFinishedLength);
  EXPECT_EQ(c.text, full_.text);
  EXPECT_EQ(c.tokens, full_.tokens);
  std::string before_final;
  for (const RequestOutput& o : c.deltas)
    if (!o.finished) before_final += o.text;
  EXPECT_EQ(before_final, full_.text.substr(0, full_.text.size() - tail.size()));
  EXPECT_EQ(c.final_output.text, tail);
}

TEST_F(EngineStops, StopTokenEndsGenerationAndIsKept) {
  const int32_t stop_token = full_.tokens[5];
  const Collected c = generate({}, {stop_token});
  ASSERT_TRUE(c.finished);
  EXPECT_EQ(c.final_output.status, RequestStatus::kFinishedStopped);
  const auto first = std::find(full_.tokens.begin(), full_.tokens.end(), stop_token);
  EXPECT_EQ(c.tokens, std::vector<int32_t>(full_.tokens.begin(), first + 1));
}

TEST_F(EngineRequests, EndOfGenerationStopsUnlessIgnored) {
  const Tokenizer& tok = model_->tokenizer();
  const std::vector<int32_t> prompt = tok.encode(
      "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n", false, true);
  auto engine = make_engine(engine_config(64, 4, 64));
  GenerationParams p = request(prompt, 64);
  p.ignore_eos = false;
  const std::string id = add(*engine, p);
  GenerationParams ignoring = request(prompt, 64);
  const std::string id2 = add(*engine, ignoring);
  Outputs run;
  test::run_until_idle(*engine, run);
  const Collected& c = run.requests[id];
  ASSERT_TRUE(c.finished);
  ASSERT_EQ(c.final_output.status, RequestStatus::kFinishedStopped) << c.text;
  EXPECT_TRUE(tok.is_eog(c.tokens.back()));
  EXPECT_LT(c.tokens.size(), 64u);
  EXPECT_EQ(c.text.find("<|im_end|>"), std::string::npos);
  // ignore_eos runs on to max_tokens, through the same first tokens.
  const Collected& c2 = run.requests[id2];
  EXPECT_EQ(c2.final_output.status, RequestStatus::kFinishedLength);
  EXPECT_EQ(c2.tokens.size(), 64u);
  EXPECT_TRUE(std::equal(c.tokens.begin(), c.tokens.end(), c2.tokens.begin()));
}

// ---------------------------------------------------------------------------
// Logprobs

TEST_F(EngineRequests, LogprobsArePresentWhenAskedAndMatchTheModel) {
  const std::vector<int32_t> prompt = random_prompt(30, 11);
  auto engine = make_engine(engine_config(64, 4, 64));
  GenerationParams with = request(prompt, 6);
  with.logprobs = 5;
  GenerationParams only_sampled = request(prompt, 6);
  only_sampled.logprobs = 0;
  GenerationParams penalized = request(prompt, 6);
  penalized.logprobs = 3;
  penalized.sampling.repetition_penalty = 1.5f;  // penalties do not change reported logprobs
  const std::string a = add(*engine, with);
  const std::string b = add(*engine, only_sampled);
  const std::string c = add(*engine, request(prompt, 6));
  const std::string d = add(*engine, penalized);
  Outputs run;
  test::run_until_idle(*engine, run);

  const Collected& ca = run.requests[a];
  std::vector<SampledLogprobs> lps;
  for (const RequestOutput& o : ca.deltas) {
    EXPECT_EQ(o.logprobs.size(), o.token_ids.size());
    lps.insert(lps.end(), o.logprobs.begin(), o.logprobs.end());
  }
  ASSERT_EQ(lps.size(), 6u);
  for (size_t i = 0; i < lps.size(); ++i) {
    EXPECT_EQ(lps[i].token, ca.tokens[i]);
    ASSERT_EQ(lps[i].top.size(), 5u);
    for (size_t j = 1; j < 5; ++j) EXPECT_GE(lps[i].top[j - 1].logprob, lps[i].top[j].logprob);
    double mass = 0;
    for (const TokenLogprob& t : lps[i].top) mass += std::exp(t.logprob);
    EXPECT_LE(mass, 1.0 + 1e-5);
    // Greedy: the sampled token is the most likely one.
    EXPECT_EQ(lps[i].top[0].token, lps[i].token);
    EXPECT_EQ(lps[i].top[0].logprob, lps[i].logprob);
    EXPECT_LE(lps[i].logprob, 0.0f);
  }
  // The first token's logprob is the prompt's last-position distribution.
  SequenceGenerator gen(*model_, 64);
  auto logits = gen.prompt_logits(prompt);
  ASSERT_TRUE(logits.ok());
  EXPECT_EQ(lps[0].logprob, token_logprob(logits->data(), model_->config().n_vocab, lps[0].token));

  const Collected& cb = run.requests[b];
  for (const RequestOutput& o : cb.deltas) {
    ASSERT_EQ(o.logprobs.size(), o.token_ids.size());
    for (const SampledLogprobs& lp : o.logprobs) EXPECT_TRUE(lp.top.empty());
  }
  EXPECT_EQ(cb.deltas.front().logprobs.front().logprob, lps[0].logprob);
  for (const RequestOutput& o : run.requests[c].deltas) EXPECT_TRUE(o.logprobs.empty());
  // With a repetition penalty the first token's logprob is still the model's.
  const SampledLogprobs& dl = run.requests[d].deltas.front().logprobs.front();
  EXPECT_EQ(dl.logprob, token_logprob(logits->data(), model_->config().n_vocab, dl.token));
  EXPECT_EQ(dl.top.front().logprob, lps[0].top.front().logprob);
}

// ---------------------------------------------------------------------------
// Refused requests

TEST_F(EngineRequests, RefusesRequestsThatCanNeverRun) {
  EngineConfig cfg = engine_config(64, 4, 6);  // 5 usable blocks of 16: 80 tokens
  cfg.max_model_len = 100;
  auto engine = make_engine(cfg);
  ASSERT_TRUE(engine);
  auto expect_refused = [&](GenerationParams p, const std::string& phrase) {
    auto h = engine->add_request(std::move(p));
    ASSERT_FALSE(h.ok()) << "accepted; expected an error about '" << phrase << "'";
    EXPECT_NE(h.error().message.find(phrase), std::string::npos) << h.error().message;
  };
  const int32_t n_vocab = static_cast<int32_t>(model_->config().n_vocab);
  expect_refused(request({}, 4), "prompt is empty");
  expect_refused(request({1, -1}, 4), "outside the vocabulary");
  expect_refused(request({1, n_vocab}, 4), "outside the vocabulary");
  expect_refused(request({1, 2}, 0), "max_tokens");
  expect_refused(request(random_prompt(95, 1), 10), "exceeds the model length of 100");
  expect_refused(request(random_prompt(60, 1), 30), "KV blocks");
  SamplingParams bad;
  bad.top_p = 0.0f;
  expect_refused(request({1, 2}, 4, bad), "top_p");
  GenerationParams many = request({1, 2}, 4);
  many.logprobs = 21;
  expect_refused(many, "logprobs");
  GenerationParams empty_stop = request({1, 2}, 4);
  empty_stop.stop = {""};
  expect_refused(empty_stop, "stop string is empty");
  GenerationParams bad_stop_token = request({1, 2}, 4);
  bad_stop_token.stop_token_ids = {n_vocab + 5};
  expect_refused(bad_stop_token, "outside the vocabulary");
  EXPECT_FALSE(engine->has_pending_work());
  // What fits exactly is accepted: 60 + 21 - 1 = 80 tokens in 5 blocks.
  auto ok = engine->add_request(request(random_prompt(60, 1), 21));
  EXPECT_TRUE(ok.ok()) << ok.error().message;

  EngineConfig tiny = engine_config(64, 4, 1);
  auto refused = Engine::create(*model_, tiny);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("at least 2 blocks"), std::string::npos)
      << refused.error().message;
}

// ---------------------------------------------------------------------------
// The loop thread and streams

TEST_F(EngineRequests, RequestsFromManyThreadsStreamTheSameOutputsAsSynchronousSteps) {
  std::vector<GenerationParams> reqs;
  for (int i = 0; i < 6; ++i) reqs.push_back(request(random_prompt(5 + 23 * i, 60 + i), 6 + i));

  // Reference: the same requests stepped synchronously.
  std::vector<std::vector<int32_t>> expected;
  {
    auto engine = make_engine(engine_config(48, 8, 100));
    std::vector<std::string> ids;
    for (const auto& p : reqs) ids.push_back(add(*engine, p));
    Outputs run;
    test::run_until_idle(*engine, run);
    for (const std::string& id : ids) expected.push_back(run.requests[id].tokens);
  }

  auto engine = make_engine(engine_config(48, 8, 100));
  ASSERT_TRUE(engine);
  engine->start();
  std::vector<Collected> got(reqs.size());
  std::vector<std::thread> clients;
  for (int t = 0; t < 3; ++t) {
    clients.emplace_back([&, t] {
      for (int i = t; i < static_cast<int>(reqs.size()); i += 3) {
        auto h = engine->add_request(reqs[i]);
        if (!h.ok()) return;
        while (auto o = h->stream->next()) {
          got[i].tokens.insert(got[i].tokens.end(), o->token_ids.begin(), o->token_ids.end());
          got[i].text += o->text;
          got[i].deltas.push_back(*o);
          if (o->finished) {
            got[i].finished = true;
            got[i].final_output = *o;
          }
        }
      }
    });
  }
  for (auto& c : clients) c.join();
  engine->stop();
  test::expect_idle_and_clean(*engine);

  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(got[i].finished) << "request " << i;
    EXPECT_EQ(got[i].tokens, expected[i]) << "request " << i;
    // The streamed text is the tokens decoded incrementally, all of it.
    IncrementalDecoder decoder(model_->tokenizer());
    std::string text;
    for (int32_t t : got[i].tokens) text += decoder.push(t);
    text += decoder.flush();
    EXPECT_EQ(got[i].text, text) << "request " << i;
    const RequestMetrics& m = got[i].final_output.metrics;
    EXPECT_EQ(m.num_prompt_tokens, static_cast<int64_t>(reqs[i].prompt_token_ids.size()));
    EXPECT_EQ(m.num_output_tokens, static_cast<int64_t>(got[i].tokens.size()));
    ASSERT_EQ(m.token_times.size(), got[i].tokens.size());
    EXPECT_GT(m.arrival_time, 0.0);
    EXPECT_LE(m.arrival_time, m.first_scheduled_time);
    EXPECT_LE(m.first_scheduled_time, m.first_token_time);
    EXPECT_EQ(m.first_token_time, m.token_times.front());
    EXPECT_EQ(m.last_token_time, m.token_times.back());
    EXPECT_LE(m.last_token_time, m.finished_time);
    EXPECT_GE(m.queue_time(), 0.0);
    EXPECT_GE(m.time_to_first_token(), m.queue_time());
    EXPECT_GE(m.e2e_latency(), m.time_to_first_token());
    const std::vector<double> itl = m.inter_token_latencies();
    EXPECT_EQ(itl.size(), got[i].tokens.size() - 1);
    for (double d : itl) EXPECT_GE(d, 0.0);
    // Per-delta timestamps are the same as the metrics'.
    std::vector<double> times;
    for (const RequestOutput& o : got[i].deltas)
      times.insert(times.end(), o.token_times.begin(), o.token_times.end());
    EXPECT_EQ(times, m.token_times);
  }
  const EngineStats st = engine->stats();
  EXPECT_EQ(st.requests_added, 6);
  EXPECT_EQ(st.scheduler.finished, 6);
  int64_t n_out = 0;
  for (const auto& g : got) n_out += static_cast<int64_t>(g.tokens.size());
  EXPECT_EQ(st.generation_tokens, n_out);
  EXPECT_GT(st.forward_seconds, 0.0);
}

}  // namespace
}  // namespace inferd
