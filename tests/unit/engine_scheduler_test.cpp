// The scheduler with no model: a fake runner stands in for the forward pass.
// It keeps a fake KV cache (one token id and position per slot), writes every
// scheduled token into the slot its block table names, and "samples" the next
// token from the request's history read back through the block table. So a
// wrong table, a bad prefix hit or a block reused while still in use changes
// the outputs, and the outputs can be compared with a reference computed
// directly from the prompt.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <cstdio>
#include <deque>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "engine/beam_search.h"
#include "engine/scheduler.h"

namespace inferd {
namespace {

constexpr int32_t kVocab = 64;

// The fake model: the next token depends on the whole history, in order.
int32_t next_token(std::span<const int32_t> history) {
  uint64_t h = 1469598103934665603ull;
  for (int32_t t : history) h = (h ^ static_cast<uint32_t>(t)) * 1099511628211ull;
  h ^= h >> 29;
  return static_cast<int32_t>(h % kVocab);
}

// What a request must produce, whatever the batching: the reference loop.
std::vector<int32_t> reference_output(const Request& r) {
  std::vector<int32_t> all = r.prompt_token_ids, out;
  while (static_cast<int64_t>(out.size()) < r.max_tokens) {
    const int32_t t = next_token(all);
    all.push_back(t);
    out.push_back(t);
    if (!r.ignore_eos && r.eos_token_id && t == *r.eos_token_id) break;
    if (std::find(r.stop_token_ids.begin(), r.stop_token_ids.end(), t) != r.stop_token_ids.end()) break;
  }
  return out;
}

class FakeRunner {
 public:
  explicit FakeRunner(const Scheduler& s)
      : s_(s),
        bs_(s.config().kv.block_size),
        token_(int64_t{s.config().kv.n_blocks} * bs_, -1),
        pos_(token_.size(), -1) {}

  // Runs one step: all writes first (as the real forward pass writes every
  // token's keys and values before attention), then one sample per request
  // whose chunk reaches its last token.
  std::vector<int32_t> execute(const SchedulerOutput& out) { return execute_writes_and_reads(out, true); }

  // Writes and checks the reads of a step; with `sample`, samples (no drafts).
  std::vector<int32_t> execute_writes_and_reads(const SchedulerOutput& out, bool sample = false) {
    const kv::BlockPool& pool = s_.kv_cache().pool();
    const kv::KVCacheConfig& kv = s_.config().kv;
    // Copies on write first, as the runner makes them before the forward pass.
    for (const kv::BlockCopy& c : out.block_copies) {
      EXPECT_GT(pool.ref_count(c.src), 0) << "step " << out.step << " copies a free block";
      std::copy_n(token_.begin() + c.src * bs_, bs_, token_.begin() + c.dst * bs_);
      std::copy_n(pos_.begin() + c.src * bs_, bs_, pos_.begin() + c.dst * bs_);
      ++copied_blocks;
    }
    for (const ScheduledRequest& sr : out.scheduled) {
      const Request* r = s_.find(sr.request_id);
      EXPECT_EQ(static_cast<int32_t>(sr.block_tables.size()), kv.num_groups());
      for (const std::vector<int32_t>& table : sr.block_tables) {
        for (int64_t i = 0; i < sr.num_new_tokens; ++i) {
          const int64_t p = sr.num_computed_tokens + i;
          const int32_t block = table[p / bs_];
          // Writing into a block another request holds, or one the prefix cache
          // hands out, would corrupt someone else's keys and values.
          EXPECT_NE(block, kv::BlockPool::kNullBlock);
          EXPECT_EQ(pool.ref_count(block), 1) << "step " << out.step << " writes a shared block";
          EXPECT_FALSE(pool.block_hash(block).has_value()) << "step " << out.step << " writes a cached block";
          const int64_t slot = kv_slot(table, bs_, p);
          token_[slot] = sr.token_ids[i];
          pos_[slot] = p;
        }
      }
      for (int64_t i = 0; i < sr.num_new_tokens; ++i)
        if (sr.num_computed_tokens + i < r->num_prompt_tokens()) ++prefilled_prompt_tokens;
      computed_tokens += sr.num_new_tokens;
      if (kv.n_state_slots > 0) run_recurrent_state(sr, *r);
    }
    // Reads: every new token of every group sees the positions its window
    // (all of them for full attention) reaches, each holding the right token.
    for (const ScheduledRequest& sr : out.scheduled) {
      const Request* r = s_.find(sr.request_id);
      for (int32_t g = 0; g < kv.num_groups(); ++g) {
        const int64_t w = kv.window(g);
        for (int64_t p = sr.num_computed_tokens; p < sr.num_computed_tokens + sr.num_new_tokens; ++p) {
          // Full attention: checking the chunk's last token covers the others.
          if (w == 0 && p + 1 < sr.num_computed_tokens + sr.num_new_tokens) continue;
          for (int64_t q = w > 0 ? std::max<int64_t>(0, p + 1 - w) : 0; q <= p; ++q) {
            const int64_t slot = kv_slot(sr.block_tables[g], bs_, q);
            EXPECT_EQ(pos_[slot], q) << "request " << sr.request_id << " (group " << g
                                     << ") reads a slot it never wrote at position " << q;
            // Past the request's tokens: its drafts.
            const int32_t want = q < r->num_tokens() ? r->all_token_ids[q]
                                                     : sr.token_ids[q - sr.num_computed_tokens];
            EXPECT_EQ(token_[slot], want)
                << "request " << sr.request_id << " (group " << g << ") sees another token at " << q;
          }
        }
      }
    }
    std::vector<int32_t> sampled(out.scheduled.size(), -1);
    for (size_t k = 0; k < out.scheduled.size() && sample; ++k) {
      const ScheduledRequest& sr = out.scheduled[k];
      if (!sr.sample) continue;
      EXPECT_EQ(sr.num_draft_tokens, 0) << "drafts scheduled: call execute_verifying";
      const Request* r = s_.find(sr.request_id);
      const int64_t n = sr.num_computed_tokens + sr.num_new_tokens;
      sampled[k] = next_token(std::span<const int32_t>(r->all_token_ids).first(n));
    }
    return sampled;
  }

  // The same for steps that may verify drafts: a request's rows are sampled
  // in order while the token equals the draft at its place (the engine's rule).
  std::vector<std::vector<int32_t>> execute_verifying(const SchedulerOutput& out) {
    std::vector<int32_t> one = execute_writes_and_reads(out);
    std::vector<std::vector<int32_t>> sampled(out.scheduled.size());
    for (size_t k = 0; k < out.scheduled.size(); ++k) {
      const ScheduledRequest& sr = out.scheduled[k];
      if (!sr.sample) continue;
      const Request* r = s_.find(sr.request_id);
      std::vector<int32_t> history = r->all_token_ids;
      const int64_t first_draft = sr.num_new_tokens - sr.num_draft_tokens;
      for (int64_t j = 0; j <= sr.num_draft_tokens; ++j) {
        sampled[k].push_back(next_token(history));
        if (j == sr.num_draft_tokens || sampled[k].back() != sr.token_ids[first_draft + j]) break;
        history.push_back(sampled[k].back());
      }
    }
    return sampled;
  }

  // A connector's load: block `block` now holds tokens [first, first + bs) of `tokens`.
  void fill_block(int32_t block, std::span<const int32_t> tokens, int64_t first) {
    for (int64_t i = 0; i < bs_; ++i) {
      token_[block * bs_ + i] = tokens[first + i];
      pos_[block * bs_ + i] = first + i;
    }
  }
  // What a connector writing late would do: scribble over a block.
  void scribble(int32_t block) {
    for (int64_t i = 0; i < bs_; ++i) token_[block * bs_ + i] = -7;
  }

  int64_t prefilled_prompt_tokens = 0;  // prompt positions computed, recomputes included
  int64_t computed_tokens = 0;
  int64_t copied_blocks = 0;

 private:
  // A recurrent state, as the executor keeps it: the tokens fed into a slot
  // since the position-0 slice that zeroed it. A step must start from the
  // state of exactly the tokens before it (its slot's, or the snapshot's or
  // checkpoint's it is told to load); saves copy it after their position.
  void run_recurrent_state(const ScheduledRequest& sr, const Request& r) {
    std::vector<int32_t>& state = states_[sr.state_slot];
    if (sr.state_source >= 0)
      state = states_[sr.state_source];
    else if (sr.num_computed_tokens == 0)
      state.clear();
    EXPECT_TRUE(std::equal(state.begin(), state.end(), r.all_token_ids.begin(),
                           r.all_token_ids.begin() + std::min<int64_t>(r.num_tokens(), sr.num_computed_tokens)) &&
                static_cast<int64_t>(state.size()) == sr.num_computed_tokens)
        << "request " << sr.request_id << " starts its step at " << sr.num_computed_tokens << " from the state of "
        << state.size() << " tokens, not of the tokens before it";
    for (int64_t i = 0; i < sr.num_new_tokens; ++i) {
      state.push_back(sr.token_ids[i]);
      for (const kv::StateSave& save : sr.state_saves)
        if (save.position == sr.num_computed_tokens + i + 1) states_[save.slot] = state;
    }
  }

  const Scheduler& s_;
  int64_t bs_;
  std::vector<int32_t> token_;
  std::vector<int64_t> pos_;
  std::map<int32_t, std::vector<int32_t>> states_;  // by state slot
};

// The test's own check of one step's limits, independent of check_output().
void expect_step_ok(const Scheduler& s, const SchedulerOutput& out) {
  const SchedulerConfig& c = s.config();
  EXPECT_LE(out.total_num_scheduled_tokens, c.max_num_batched_tokens) << "step " << out.step;
  EXPECT_LE(static_cast<int64_t>(out.scheduled.size()), c.max_num_seqs) << "step " << out.step;
  int64_t total = 0;
  for (const ScheduledRequest& sr : out.scheduled) {
    total += sr.num_new_tokens;
    EXPECT_GE(sr.num_new_tokens, 1);
    EXPECT_EQ(static_cast<int64_t>(sr.token_ids.size()), sr.num_new_tokens);
    for (const std::vector<int32_t>& table : sr.block_tables)
      EXPECT_GE(static_cast<int64_t>(table.size()) * c.kv.block_size, sr.num_computed_tokens + sr.num_new_tokens)
          << "step " << out.step << ": the table of " << sr.request_id << " does not cover its tokens";
    const Request* r = s.find(sr.request_id);
    ASSERT_NE(r, nullptr);
    EXPECT_EQ(sr.sample, sr.num_computed_tokens + sr.num_new_tokens - sr.num_draft_tokens == r->num_tokens());
    // Drafts only follow a decode's one token (beside recurrent layers, after
    // a rollback: every token left to compute), and only as many as were set.
    if (sr.num_draft_tokens > 0) {
      EXPECT_EQ(sr.num_computed_tokens + sr.num_new_tokens - sr.num_draft_tokens, r->num_tokens());
      if (!s.kv_cache().has_state_slots()) EXPECT_EQ(sr.num_new_tokens, sr.num_draft_tokens + 1);
    }
  }
  EXPECT_EQ(total, out.total_num_scheduled_tokens);
  // Attention-aware chunks: the step's chunks together cost no more than one
  // chunk of max_request_step_tokens at position 0, unless the step's only
  // chunk is one token (a prompt deeper than that always progresses). The
  // beams of a group are admitted on the same work left, so not for them.
  if (c.context_positions_per_token > 0.0) {
    double work = 0.0;
    int64_t chunks = 0, last_chunk = 0;
    bool beams = false;
    for (const ScheduledRequest& sr : out.scheduled) {
      const Request* r = s.find(sr.request_id);
      beams = beams || !r->beam_group.empty();
      const int64_t chunk = sr.num_new_tokens - sr.num_draft_tokens;
      if (chunk <= 1 && sr.num_computed_tokens + chunk == r->num_tokens()) continue;  // a decode's token
      work += c.chunk_work(chunk, sr.num_computed_tokens);
      ++chunks, last_chunk = chunk;
    }
    const double limit = c.chunk_work(c.max_request_step_tokens(), 0);
    if (!beams && !(chunks == 1 && last_chunk == 1))
      EXPECT_LE(work, limit * (1.0 + 1e-9)) << "step " << out.step;
  }
  Status st = s.check_output(out);
  EXPECT_TRUE(st.ok()) << st.error().message;
}

void expect_invariants(const Scheduler& s) {
  Status st = s.check_invariants();
  EXPECT_TRUE(st.ok()) << st.error().message;
}

void expect_idle_and_clean(const Scheduler& s) {
  EXPECT_FALSE(s.has_unfinished_requests());
  const kv::BlockPool& pool = s.kv_cache().pool();
  for (int32_t b = 0; b < pool.num_blocks(); ++b) EXPECT_EQ(pool.ref_count(b), 0) << "block " << b;
  EXPECT_EQ(pool.num_free_blocks(), pool.num_usable_blocks());
  EXPECT_EQ(s.kv_cache().num_requests(), 0);
  EXPECT_EQ(s.kv_cache().num_free_state_slots(), s.kv_cache().num_state_slots());
  expect_invariants(s);
}

struct Recorder {
  std::map<std::string, std::vector<int32_t>> outputs;
  std::map<std::string, RequestStatus> finished;
  std::vector<SchedulerOutput> steps;

  void record(const std::vector<RequestUpdate>& updates) {
    for (const RequestUpdate& u : updates) {
      auto& o = outputs[u.request_id];
      o.insert(o.end(), u.new_token_ids.begin(), u.new_token_ids.end());
      if (is_finished(u.status)) finished[u.request_id] = u.status;
    }
  }
};

// Drafts for a running request after its step (speculative decoding's proposer).
using Proposer = std::function<std::vector<int32_t>(const Request&)>;

// One step: schedule, check, run, update, check; then drafts, if proposed.
void step(Scheduler& s, FakeRunner& runner, Recorder& rec, const Proposer& propose = nullptr) {
  SchedulerOutput out = s.schedule();
  expect_step_ok(s, out);
  expect_invariants(s);
  auto updates = s.update(out, runner.execute_verifying(out));
  ASSERT_TRUE(updates.ok()) << updates.error().message;
  rec.record(*updates);
  expect_invariants(s);
  rec.steps.push_back(std::move(out));
  if (!propose) return;
  for (const RequestUpdate& u : *updates)
    if (const Request* r = s.find(u.request_id); r && r->status == RequestStatus::kRunning)
      EXPECT_TRUE(s.set_draft_tokens(u.request_id, propose(*r)));
}

void run_until_idle(Scheduler& s, FakeRunner& runner, Recorder& rec, int max_steps = 100000,
                    const Proposer& propose = nullptr) {
  for (int i = 0; i < max_steps && s.has_unfinished_requests(); ++i) {
    step(s, runner, rec, propose);
    if (testing::Test::HasFatalFailure()) return;
  }
  ASSERT_FALSE(s.has_unfinished_requests()) << "requests did not finish in " << max_steps << " steps";
}

// Up to k drafts: the true continuation for a random number of tokens, then
// wrong guesses, so that every acceptance length occurs.
Proposer guessing_proposer(std::mt19937& rng, int k) {
  return [&rng, k](const Request& r) {
    std::vector<int32_t> history = r.all_token_ids, drafts;
    const int n = std::uniform_int_distribution<int>(0, k)(rng);
    const int right = std::uniform_int_distribution<int>(0, n)(rng);
    for (int i = 0; i < n; ++i) {
      int32_t t = next_token(history);
      if (i >= right) t = (t + 1 + static_cast<int32_t>(rng() % (kVocab - 1))) % kVocab;  // any other token
      drafts.push_back(t);
      history.push_back(t);
    }
    return drafts;
  };
}

std::vector<int32_t> prompt(int32_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> p(n);
  for (auto& t : p) t = static_cast<int32_t>(rng() % kVocab);
  return p;
}

Request make_request(std::string id, std::vector<int32_t> prompt_tokens, int64_t max_tokens) {
  Request r;
  r.id = std::move(id);
  r.prompt_token_ids = std::move(prompt_tokens);
  r.max_tokens = max_tokens;
  return r;
}

SchedulerConfig config(int64_t budget, int32_t max_seqs, int32_t n_blocks, int32_t block_size,
                       bool caching = true) {
  SchedulerConfig c;
  c.max_num_batched_tokens = budget;
  c.max_num_seqs = max_seqs;
  c.kv = {.n_blocks = n_blocks, .block_size = block_size, .enable_prefix_caching = caching};
  return c;
}

const ScheduledRequest* find_in(const SchedulerOutput& out, const std::string& id) {
  for (const ScheduledRequest& sr : out.scheduled)
    if (sr.request_id == id) return &sr;
  return nullptr;
}

// ---------------------------------------------------------------------------

TEST(EngineScheduler, BudgetAndMaxNumSeqsHoldOnEveryStepAndOutputsMatchTheReference) {
  Scheduler s(config(100, 4, 400, 8));
  FakeRunner runner(s);
  Recorder rec;
  std::map<std::string, Request> reqs;
  for (int i = 0; i < 12; ++i) {
    Request r = make_request("r" + std::to_string(i), prompt(5 + 37 * i % 150, i), 3 + i % 7);
    reqs[r.id] = r;
    ASSERT_TRUE(s.add_request(r).ok());
  }
  run_until_idle(s, runner, rec);
  for (const auto& [id, r] : reqs) EXPECT_EQ(rec.outputs[id], reference_output(r)) << id;
  // The budget is used: a step with waiting work never leaves more than a
  // request's worth idle while fewer than max_num_seqs run.
  int64_t full_steps = 0;
  for (const auto& out : rec.steps) full_steps += out.total_num_scheduled_tokens == 100;
  EXPECT_GT(full_steps, 5);
  for (const auto& out : rec.steps) EXPECT_LE(out.scheduled.size(), 4u);
  expect_idle_and_clean(s);
  const SchedulerStats st = s.stats();
  EXPECT_EQ(st.steps, static_cast<int64_t>(rec.steps.size()));
  EXPECT_EQ(st.finished, 12);
  EXPECT_EQ(st.max_step_tokens, 100);
}

TEST(EngineScheduler, ChunkedPrefillOfALongPromptThenDecodesAlongsideOthers) {
  Scheduler s(config(64, 8, 200, 16));
  FakeRunner runner(s);
  Recorder rec;
  ASSERT_TRUE(s.add_request(make_request("long", prompt(1000, 1), 6)).ok());
  ASSERT_TRUE(s.add_request(make_request("b", prompt(10, 2), 6)).ok());
  ASSERT_TRUE(s.add_request(make_request("c", prompt(10, 3), 6)).ok());
  run_until_idle(s, runner, rec);

  // "long" is prefilled in 16 chunks: fifteen of 64 tokens and one of 40.
  std::vector<int64_t> chunks;
  size_t last_prefill_step = 0;
  for (size_t i = 0; i < rec.steps.size(); ++i) {
    const ScheduledRequest* sr = find_in(rec.steps[i], "long");
    if (sr && sr->num_computed_tokens < 1000) {
      chunks.push_back(sr->num_new_tokens);
      EXPECT_EQ(sr->sample, sr->num_computed_tokens + sr->num_new_tokens == 1000);
      last_prefill_step = i;
    }
  }
  std::vector<int64_t> expected(15, 64);
  expected.push_back(40);
  EXPECT_EQ(chunks, expected);
  // b and c are admitted into the last chunk's step, with the 24 tokens left.
  EXPECT_EQ(last_prefill_step, 15u);
  EXPECT_EQ(rec.steps[15].total_num_scheduled_tokens, 60);
  EXPECT_NE(find_in(rec.steps[15], "b"), nullptr);
  EXPECT_NE(find_in(rec.steps[15], "c"), nullptr);
  // Then all three decode together, one token each per step.
  for (size_t i = 16; i < 21; ++i) {
    ASSERT_EQ(rec.steps[i].scheduled.size(), 3u) << "step " << i;
    for (const auto& sr : rec.steps[i].scheduled) EXPECT_EQ(sr.num_new_tokens, 1);
  }
  EXPECT_EQ(rec.outputs["long"], reference_output(make_request("long", prompt(1000, 1), 6)));
  expect_idle_and_clean(s);
}

TEST(EngineScheduler, PrefillChunksShareStepsWithRunningDecodes) {
  Scheduler s(config(64, 8, 200, 16));
  FakeRunner runner(s);
  Recorder rec;
  ASSERT_TRUE(s.add_request(make_request("b", prompt(10, 2), 40)).ok());
  ASSERT_TRUE(s.add_request(make_request("c", prompt(10, 3), 40)).ok());
  step(s, runner, rec);  // both prefilled
  ASSERT_TRUE(s.add_request(make_request("long", prompt(300, 1), 4)).ok());
  for (int i = 0; i < 4; ++i) {
    step(s, runner, rec);
    const SchedulerOutput& out = rec.steps.back();
    // Running decodes go first; the new prompt gets the rest of the budget.
    ASSERT_EQ(out.scheduled.size(), 3u);
    EXPECT_EQ(out.scheduled[0].request_id, "b");
    EXPECT_EQ(out.scheduled[0].num_new_tokens, 1);
    EXPECT_EQ(out.scheduled[1].num_new_tokens, 1);
    EXPECT_EQ(out.scheduled[2].request_id, "long");
    EXPECT_EQ(out.scheduled[2].num_new_tokens, 62);
    EXPECT_EQ(out.scheduled[2].is_new, i == 0);
    EXPECT_FALSE(out.scheduled[2].sample);
    EXPECT_EQ(out.total_num_scheduled_tokens, 64);
  }
  // Mid-prefill steps sample nothing for "long".
  EXPECT_TRUE(rec.outputs["long"].empty());
  run_until_idle(s, runner, rec);
  EXPECT_EQ(rec.outputs["long"], reference_output(make_request("long", prompt(300, 1), 4)));
  expect_idle_and_clean(s);
}

TEST(EngineScheduler, LongPrefillThresholdCapsChunks) {
  SchedulerConfig c = config(64, 8, 200, 16);
  c.long_prefill_token_threshold = 20;
  Scheduler s(c);
  FakeRunner runner(s);
  Recorder rec;
  ASSERT_TRUE(s.add_request(make_request("a", prompt(100, 1), 3)).ok());
  ASSERT_TRUE(s.add_request(make_request("b", prompt(100, 2), 3)).ok());
  step(s, runner, rec);
  const SchedulerOutput& out = rec.steps.back();
  ASSERT_EQ(out.scheduled.size(), 2u);  // both prompts progress in the same step
  EXPECT_EQ(out.scheduled[0].num_new_tokens, 20);
  EXPECT_EQ(out.scheduled[1].num_new_tokens, 20);
  run_until_idle(s, runner, rec);
  expect_idle_and_clean(s);
}

TEST(EngineScheduler, ChunkTokensWithinIsTheLargestChunkWhoseWorkFits) {
  SchedulerConfig c = config(512, 8, 200, 16);
  for (double cpt : {1.0, 37.5, 4161.0}) {
    c.context_positions_per_token = cpt;
    for (int64_t context : {0, 1, 100, 5000, 100000})
      for (double work : {0.5, 1.0, 2.0, 77.0, 513.3, 3000.0, 1e6}) {
        const int64_t n = c.chunk_tokens_within(work, context);
        SCOPED_TRACE(std::to_string(cpt) + " " + std::to_string(context) + " " + std::to_string(work));
        EXPECT_GE(n, 0);
        if (n > 0) EXPECT_LE(c.chunk_work(n, context), work);
        EXPECT_GT(c.chunk_work(n + 1, context), work);
      }
  }
  // A token alone: itself plus attention to the context and to itself.
  c.context_positions_per_token = 10.0;
  EXPECT_DOUBLE_EQ(c.chunk_work(1, 99), 1.0 + 100.0 / 10.0);
  EXPECT_DOUBLE_EQ(c.chunk_work(4, 0), 4.0 + 10.0 / 10.0);
  c.context_positions_per_token = -1.0;
  EXPECT_FALSE(c.validate().ok());
}

// Chunks deep in a long prompt shorten so that every step's chunk work stays
// that of a full chunk at position 0, the decodes beside it keep their token
// each step, and the prompt still ends with the reference's outputs.
TEST(EngineScheduler, AttentionAwareChunksShortenWithDepthAndKeepDecodesGoing) {
  SchedulerConfig c = config(64, 8, 400, 16);
  c.context_positions_per_token = 32.0;
  Scheduler s(c);
  FakeRunner runner(s);
  Recorder rec;
  ASSERT_TRUE(s.add_request(make_request("decode", prompt(8, 3), 60)).ok());
  step(s, runner, rec);  // its prompt
  ASSERT_TRUE(s.add_request(make_request("long", prompt(1000, 4), 2)).ok());
  std::vector<int64_t> chunks;
  while (s.find("long") && s.find("long")->num_computed_tokens < 1000) {
    step(s, runner, rec);
    const SchedulerOutput& out = rec.steps.back();
    const ScheduledRequest* d = find_in(out, "decode");
    if (s.find("decode")) ASSERT_NE(d, nullptr) << "step " << out.step << " left the decode out";
    const ScheduledRequest* l = find_in(out, "long");
    ASSERT_NE(l, nullptr);
    chunks.push_back(l->num_new_tokens);
    EXPECT_LE(c.chunk_work(l->num_new_tokens, l->num_computed_tokens), c.chunk_work(64, 0) + 1e-9);
  }
  ASSERT_GE(chunks.size(), 3u);
  EXPECT_EQ(chunks.front(), 63);  // the budget left beside the decode, at position 0
  for (size_t i = 1; i + 1 < chunks.size(); ++i) EXPECT_LE(chunks[i], chunks[i - 1]);
  EXPECT_LT(chunks[chunks.size() - 2], 20);  // near 1000 positions deep: work(n) ~ n (1 + 1000/32)
  run_until_idle(s, runner, rec);
  for (const auto& [id, output] : rec.outputs) {
    SCOPED_TRACE(id);
    EXPECT_EQ(output, reference_output(make_request(id, id == "long" ? prompt(1000, 4) : prompt(8, 3),
                                                    id == "long" ? 2 : 60)));
  }
  expect_idle_and_clean(s);
}

// A prompt so deep that one token costs more than the step's chunk work
// still gets a token each step (the step's first chunk); a second prompt
// waits for a step with work left.
TEST(EngineScheduler, AttentionAwareChunksAlwaysProgressTheFirstChunk) {
  SchedulerConfig c = config(8, 8, 400, 16);
  c.context_positions_per_token = 1.0;  // work(8, 0) = 8 + 36 = 44: one token past 43 positions costs more
  Scheduler s(c);
  FakeRunner runner(s);
  Recorder rec;
  ASSERT_TRUE(s.add_request(make_request("deep", prompt(200, 5), 1)).ok());
  ASSERT_TRUE(s.add_request(make_request("next", prompt(50, 6), 1)).ok());
  int64_t steps_with_both = 0;
  while (s.find("deep") && s.find("deep")->num_computed_tokens < 200) {
    step(s, runner, rec);
    const SchedulerOutput& out = rec.steps.back();
    const ScheduledRequest* d = find_in(out, "deep");
    ASSERT_NE(d, nullptr) << "step " << out.step;
    EXPECT_GE(d->num_new_tokens, 1);
    if (d->num_computed_tokens > 60) {
      EXPECT_EQ(d->num_new_tokens, 1);
      // (The prompt's last token is scheduled as a decode's: no chunk work.)
      if (d->num_computed_tokens + 1 < 200) steps_with_both += find_in(out, "next") != nullptr ? 1 : 0;
    }
  }
  EXPECT_EQ(steps_with_both, 0);  // no work left beside a one-token chunk that overran it
  run_until_idle(s, runner, rec);
  EXPECT_EQ(rec.outputs["deep"], reference_output(make_request("deep", prompt(200, 5), 1)));
  EXPECT_EQ(rec.outputs["next"], reference_output(make_request("next", prompt(50, 6), 1)));
  expect_idle_and_clean(s);
}

TEST(EngineScheduler, PromptLogitsSkipThePrefixCacheAndComeAFewRowsAStep) {
  Scheduler s(config(2048, 8, 200, 16));
  FakeRunner runner(s);
  Recorder rec;
  const std::vector<int32_t> p = prompt(600, 5);
  ASSERT_TRUE(s.add_request(make_request("warm", p, 2)).ok());
  run_until_idle(s, runner, rec);
  Request scored = make_request("scored", p, 2);
  scored.needs_prompt_logits = true;
  ASSERT_TRUE(s.add_request(scored).ok());
  step(s, runner, rec);
  const ScheduledRequest* first = find_in(rec.steps.back(), "scored");
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first->num_cached_tokens, 0);  // the warm blocks have no logits
  EXPECT_EQ(first->num_new_tokens, kMaxPromptLogitRowsPerStep);
  EXPECT_TRUE(first->prompt_logits);
  run_until_idle(s, runner, rec);
  EXPECT_EQ(rec.outputs.at("scored"), rec.outputs.at("warm"));
  // Its decodes have no prompt rows; a request that does not ask still hits the cache.
  for (const SchedulerOutput& out : rec.steps)
    if (const ScheduledRequest* sr = find_in(out, "scored"); sr && sr->num_computed_tokens >= 599) {
      EXPECT_FALSE(sr->prompt_logits);
    }
  ASSERT_TRUE(s.add_request(make_request("again", p, 1)).ok());
  step(s, runner, rec);
  EXPECT_GT(find_in(rec.steps.back(), "again")->num_cached_tokens, 0);
  run_until_idle(s, runner, rec);
  expect_idle_and_clean(s);
}

// Runs the same requests under a config and returns their outputs.
Recorder run_all(const SchedulerConfig& c, const std::vector<Request>& reqs, SchedulerStats* stats,
                 int64_t* prefilled = nullptr) {
  Scheduler s(c);
  FakeRunner runner(s);
  Recorder rec;
  for (const Request& r : reqs) EXPECT_TRUE(s.add_request(r).ok()) << r.id;
  run_until_idle(s, runner, rec);
  expect_idle_and_clean(s);
  *stats = s.stats();
  if (prefilled) *prefilled = runner.prefilled_prompt_tokens;
  return rec;
}

TEST(EngineScheduler, PreemptionWithATinyPoolGivesTheSameOutputs) {
  std::vector<Request> reqs;
  for (int i = 0; i < 16; ++i)
    reqs.push_back(make_request("r" + std::to_string(i), prompt(20 + 7 * i, 50 + i), 60));
  // The largest needs (125 + 59) / 4 = 46 blocks: a 47-block pool (46 usable)
  // holds it and nothing else.
  SchedulerStats big_stats, tiny_stats;
  const Recorder big = run_all(config(128, 16, 1000, 4), reqs, &big_stats);
  const Recorder tiny = run_all(config(128, 16, 47, 4), reqs, &tiny_stats);
  EXPECT_EQ(big_stats.preemptions, 0);
  EXPECT_GT(tiny_stats.preemptions, 0);
  std::printf("tiny pool: %lld preemptions\n", static_cast<long long>(tiny_stats.preemptions));
  for (const Request& r : reqs) {
    EXPECT_EQ(big.outputs.at(r.id), reference_output(r)) << r.id;
    EXPECT_EQ(tiny.outputs.at(r.id), big.outputs.at(r.id)) << r.id;
    EXPECT_EQ(tiny.finished.at(r.id), RequestStatus::kFinishedLength);
  }
  // Without the prefix cache, recomputation is full and outputs still match.
  const Recorder tiny_nocache = run_all(config(128, 16, 47, 4, false), reqs, &tiny_stats);
  EXPECT_GT(tiny_stats.preemptions, 0);
  for (const Request& r : reqs) EXPECT_EQ(tiny_nocache.outputs.at(r.id), big.outputs.at(r.id)) << r.id;
}

// Batches in flight (pipeline parallelism): up to `batches` scheduled batches
// are outstanding; each runs (writes, reads, samples) only after the next one
// is scheduled, as a pipeline's last stage runs batch k while rank 0 has
// already scheduled batch k + 1, and updates come back oldest first.
// Requests arrive at the steps in `arrive_at` (all at step 0 when it is empty).
Recorder run_pipelined(SchedulerConfig c, int32_t batches, const std::vector<Request>& reqs, SchedulerStats* stats,
                       int64_t* most_in_flight = nullptr, const std::vector<int32_t>& arrive_at = {}) {
  c.batches_in_flight = batches;
  Scheduler s(c);
  FakeRunner runner(s);
  Recorder rec;
  size_t arrived = 0;
  auto arrive = [&](int step) {
    for (; arrived < reqs.size() && (arrive_at.empty() || arrive_at[arrived] <= step); ++arrived)
      EXPECT_TRUE(s.add_request(reqs[arrived]).ok()) << reqs[arrived].id;
  };
  arrive(0);
  std::deque<SchedulerOutput> in_flight;
  int64_t most = 0;
  for (int step = 0; step < 100000 && (arrived < reqs.size() || s.has_unfinished_requests() || !in_flight.empty()); ++step) {
    arrive(step);
    SchedulerOutput out;
    if (static_cast<int32_t>(in_flight.size()) < batches && s.has_unfinished_requests()) {
      out = s.schedule();
      expect_step_ok(s, out);
      expect_invariants(s);
      for (const SchedulerOutput& earlier : in_flight)
        for (const ScheduledRequest& sr : out.scheduled)
          EXPECT_EQ(find_in(earlier, sr.request_id), nullptr) << sr.request_id << " is in two batches in flight";
      EXPECT_LE(out.scheduled.size(), (s.num_running() + s.num_waiting() + batches - 1) / batches + 1);
    }
    if (!in_flight.empty() && (out.empty() || static_cast<int32_t>(in_flight.size()) + 1 >= batches)) {
      SchedulerOutput done = std::move(in_flight.front());
      in_flight.pop_front();
      auto updates = s.update(done, runner.execute(done));
      EXPECT_TRUE(updates.ok()) << updates.error().message;
      if (!updates.ok()) break;
      rec.record(*updates);
      expect_invariants(s);
    }
    if (!out.empty()) in_flight.push_back(std::move(out));
    most = std::max<int64_t>(most, static_cast<int64_t>(in_flight.size()));
  }
  EXPECT_TRUE(in_flight.empty());
  expect_idle_and_clean(s);
  if (stats) *stats = s.stats();
  if (most_in_flight) *most_in_flight = most;
  return rec;
}

TEST(EngineScheduler, BatchesInFlightAreDisjointAndGiveTheSameOutputsUnderPreemption) {
  std::vector<Request> reqs;
  for (int i = 0; i < 16; ++i)
    reqs.push_back(make_request("r" + std::to_string(i), prompt(20 + 7 * i, 50 + i), 60));
  for (const int32_t batches : {2, 3}) {
    for (const int32_t n_blocks : {1000, 47}) {  // room for all; room for the largest alone (preemptions)
      SchedulerStats stats;
      int64_t most = 0;
      const Recorder rec = run_pipelined(config(32, 16, n_blocks, 4), batches, reqs, &stats, &most);
      EXPECT_EQ(most, batches - 1) << "batches in flight while the next one is scheduled";
      if (n_blocks < 100) EXPECT_GT(stats.preemptions, 0);
      for (const Request& r : reqs) {
        EXPECT_EQ(rec.outputs.at(r.id), reference_output(r)) << r.id << ", " << batches << " batches, " << n_blocks;
        EXPECT_EQ(rec.finished.at(r.id), RequestStatus::kFinishedLength) << r.id;
      }
    }
  }
}

// Random arrivals over time, prompts sharing prefixes of random length (prefix
// hits), small step budgets (chunked prefill) and small pools (preemption).
TEST(EngineScheduler, BatchesInFlightWithArrivalsAndSharedPrefixesGiveTheSameOutputs) {
  for (uint32_t seed = 0; seed < 200; ++seed) {
    std::mt19937 rng(seed);
    std::vector<Request> reqs;
    std::vector<int32_t> arrive_at;
    const std::vector<int32_t> common = prompt(40, 999);
    int32_t t = 0;
    for (int i = 0; i < 12; ++i) {
      std::vector<int32_t> p = common;
      p.resize(rng() % 41);
      const std::vector<int32_t> tail = prompt(static_cast<int32_t>(5 + rng() % 60), seed * 100 + i);
      p.insert(p.end(), tail.begin(), tail.end());
      reqs.push_back(make_request("r" + std::to_string(i), p, 5 + rng() % 20));
      t += static_cast<int32_t>(rng() % 4);
      arrive_at.push_back(t);
    }
    const Recorder rec = run_pipelined(config(16 + rng() % 32, 8, 40 + rng() % 20, 4), 2, reqs, nullptr, nullptr, arrive_at);
    for (const Request& r : reqs) ASSERT_EQ(rec.outputs.at(r.id), reference_output(r)) << r.id << " seed " << seed;
  }
}

TEST(EngineScheduler, PreemptsTheNewestRunningRequestAndRequeuesItFirst) {
  // 12 usable blocks of 4 tokens. d: a 4-token prompt (1 block); a, b, c:
  // 12-token prompts (3 blocks each). Step 0 prefills all four: 2 blocks left.
  Scheduler s(config(64, 8, 13, 4, /*caching=*/false));
  FakeRunner runner(s);
  Recorder rec;
  ASSERT_TRUE(s.add_request(make_request("d", prompt(4, 9), 2)).ok());
  for (const char* id : {"a", "b", "c"})
    ASSERT_TRUE(s.add_request(make_request(id, prompt(12, id[0]), 30)).ok());
  step(s, runner, rec);
  ASSERT_EQ(rec.steps.back().scheduled.size(), 4u);
  ASSERT_EQ(s.kv_cache().num_free_blocks(), 2);
  // Step 1: every decode crosses into a new block. d and a take the last two;
  // b finds none, so c, the newest, is preempted and b takes one of its blocks.
  step(s, runner, rec);
  const SchedulerOutput& out = rec.steps.back();
  EXPECT_EQ(out.preempted_request_ids, std::vector<std::string>{"c"});
  EXPECT_EQ(find_in(out, "c"), nullptr);
  EXPECT_NE(find_in(out, "a"), nullptr);
  EXPECT_NE(find_in(out, "b"), nullptr);
  EXPECT_NE(find_in(out, "d"), nullptr);  // scheduled before the victim was chosen
  EXPECT_EQ(rec.finished["d"], RequestStatus::kFinishedLength);
  const Request* c = s.find("c");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->status, RequestStatus::kPreempted);
  EXPECT_EQ(c->num_computed_tokens, 0);
  EXPECT_EQ(c->num_preemptions, 1);
  EXPECT_EQ(c->num_output_tokens(), 1);  // kept: recompute covers prompt + output
  EXPECT_FALSE(s.kv_cache().holds_blocks("c"));
  // New arrivals queue behind the preempted request.
  ASSERT_TRUE(s.add_request(make_request("e", prompt(4, 10), 1)).ok());
  run_until_idle(s, runner, rec);
  // c resumed (is_new and resumed) before e was admitted.
  int64_t c_resumed = -1, e_admitted = -1;
  for (const auto& st : rec.steps) {
    if (const auto* sr = find_in(st, "c"); sr && sr->resumed && c_resumed < 0) {
      c_resumed = st.step;
      EXPECT_TRUE(sr->is_new);
      EXPECT_EQ(sr->num_computed_tokens, 0);
      EXPECT_EQ(sr->num_new_tokens, 13);  // 12 prompt + 1 output recomputed together
    }
    if (const auto* sr = find_in(st, "e"); sr && sr->is_new) e_admitted = st.step;
  }
  EXPECT_GE(c_resumed, 0);
  EXPECT_LE(c_resumed, e_admitted);
  for (const char* id : {"a", "b", "c"})
    EXPECT_EQ(rec.outputs[id], reference_output(make_request(id, prompt(12, id[0]), 30))) << id;
  expect_idle_and_clean(s);
}

TEST(EngineScheduler, TheRequestNeedingSpacePreemptsItselfWhenItIsTheNewest) {
  // Two requests in 6 usable blocks of 2 tokens: a (4-token prompt) and b
  // (4-token prompt) fill 4 blocks; decoding they grow one block per 2 tokens.
  Scheduler s(config(64, 8, 7, 2, false));
  FakeRunner runner(s);
  Recorder rec;
  ASSERT_TRUE(s.add_request(make_request("a", prompt(4, 1), 8)).ok());
  ASSERT_TRUE(s.add_request(make_request("b", prompt(4, 2), 8)).ok());
  bool saw_self_preemption = false;
  while (s.has_unfinished_requests()) {
    step(s, runner, rec);
    const SchedulerOutput& out = rec.steps.back();
    if (out.preempted_request_ids == std::vector<std::string>{"b"} && find_in(out, "a")) {
      // a got its block by taking b's; b was scheduled neither before nor after.
      EXPECT_EQ(find_in(out, "b"), nullptr);
      saw_self_preemption = true;
    }
    ASSERT_LT(rec.steps.size(), 200u);
  }
  EXPECT_TRUE(saw_self_preemption);
  EXPECT_EQ(rec.outputs["a"], reference_output(make_request("a", prompt(4, 1), 8)));
  EXPECT_EQ(rec.outputs["b"], reference_output(make_request("b", prompt(4, 2), 8)));
  expect_idle_and_clean(s);
}

TEST(EngineScheduler, SharedPrefixIsComputedOnceWithHitsReported) {
  const std::vector<int32_t> prefix = prompt(600, 77);
  std::vector<Request> reqs;
  for (int i = 0; i < 16; ++i) {
    std::vector<int32_t> p = prefix;
    const std::vector<int32_t> suffix = prompt(20, 1000 + i);
    p.insert(p.end(), suffix.begin(), suffix.end());
    reqs.push_back(make_request("q" + std::to_string(i), p, 8));
  }
  auto run = [&](bool caching, int64_t* prefilled, SchedulerStats* st) {
    Scheduler s(config(512, 32, 1000, 16, caching));
    FakeRunner runner(s);
    Recorder rec;
    // The first request arrives alone; the rest once it is decoding.
    EXPECT_TRUE(s.add_request(reqs[0]).ok());
    while (rec.outputs["q0"].empty()) step(s, runner, rec);
    for (int i = 1; i < 16; ++i) EXPECT_TRUE(s.add_request(reqs[i]).ok());
    run_until_idle(s, runner, rec);
    expect_idle_and_clean(s);
    *prefilled = runner.prefilled_prompt_tokens;
    *st = s.stats();
    // Freed blocks stay findable: a late request with the prefix hits all
    // 37 full prefix blocks although every holder has finished.
    std::vector<int32_t> late_prompt = prefix;
    late_prompt.push_back(5);
    EXPECT_TRUE(s.add_request(make_request("late", late_prompt, 1)).ok());
    SchedulerOutput out = s.schedule();
    EXPECT_EQ(out.scheduled.at(0).num_cached_tokens, caching ? 37 * 16 : 0);
    s.abort("late");
    return rec;
  };
  int64_t prefilled_on = 0, prefilled_off = 0;
  SchedulerStats on, off;
  const Recorder with = run(true, &prefilled_on, &on);
  const Recorder without = run(false, &prefilled_off, &off);

  // 600 prefix tokens = 37 full blocks (592 tokens) + 8 tokens that share a
  // block with each request's own suffix.
  EXPECT_EQ(prefilled_off, 16 * 620);
  EXPECT_EQ(prefilled_on, 620 + 15 * (620 - 592));
  EXPECT_EQ(on.prefix_cache.requests, 16);
  EXPECT_EQ(on.prefix_cache.queried_tokens, 16 * 620);
  EXPECT_EQ(on.prefix_cache.hit_tokens, 15 * 592);
  EXPECT_EQ(off.prefix_cache.hit_tokens, 0);
  for (const Request& r : reqs) {
    EXPECT_EQ(with.outputs.at(r.id), without.outputs.at(r.id)) << r.id;
    EXPECT_EQ(with.outputs.at(r.id), reference_output(r)) << r.id;
  }
}

TEST(EngineScheduler, SimultaneousArrivalsWithASharedPrefixGiveTheSameOutputs) {
  // Arriving together, several requests may compute the prefix in the same
  // step (blocks become findable only once computed); outputs are unaffected
  // and later admissions still hit.
  const std::vector<int32_t> prefix = prompt(100, 5);
  std::vector<Request> reqs;
  for (int i = 0; i < 8; ++i) {
    std::vector<int32_t> p = prefix;
    p.push_back(i);
    reqs.push_back(make_request("s" + std::to_string(i), p, 5));
  }
  SchedulerStats on, off;
  const Recorder with = run_all(config(256, 4, 300, 8), reqs, &on);
  const Recorder without = run_all(config(256, 4, 300, 8, false), reqs, &off);
  EXPECT_GT(on.prefix_cache.hit_tokens, 0);
  for (const Request& r : reqs) EXPECT_EQ(with.outputs.at(r.id), without.outputs.at(r.id)) << r.id;
}

TEST(EngineScheduler, CacheSaltKeepsTenantsApart) {
  Scheduler s(config(512, 8, 200, 8));
  FakeRunner runner(s);
  Recorder rec;
  Request a = make_request("a", prompt(64, 1), 2);
  a.cache_salt = "alice";
  ASSERT_TRUE(s.add_request(a).ok());
  run_until_idle(s, runner, rec);
  Request b = a, c = a;
  b.id = "b";
  b.cache_salt = "bob";
  c.id = "c";
  ASSERT_TRUE(s.add_request(b).ok());
  ASSERT_TRUE(s.add_request(c).ok());
  SchedulerOutput out = s.schedule();
  EXPECT_EQ(find_in(out, "b")->num_cached_tokens, 0);
  EXPECT_EQ(find_in(out, "c")->num_cached_tokens, 56);
  EXPECT_EQ(s.find("c")->num_cached_prompt_tokens, 56);
}

TEST(EngineScheduler, AbortFreesBlocksWithinTheCallInEveryState) {
  Scheduler s(config(64, 8, 100, 16));
  FakeRunner runner(s);
  Recorder rec;
  const int32_t usable = s.kv_cache().num_usable_blocks();
  auto held = [&](const std::string& id) { return s.kv_cache().block_table(id).size(); };

  // Waiting: never scheduled.
  ASSERT_TRUE(s.add_request(make_request("w", prompt(10, 1), 5)).ok());
  EXPECT_TRUE(s.abort("w"));
  EXPECT_EQ(s.find("w"), nullptr);
  EXPECT_FALSE(s.abort("w"));  // already gone
  expect_idle_and_clean(s);

  // Mid-prefill: 200-token prompt, one 64-token chunk done.
  ASSERT_TRUE(s.add_request(make_request("p", prompt(200, 2), 5)).ok());
  step(s, runner, rec);
  ASSERT_EQ(held("p"), 4u);
  EXPECT_EQ(s.kv_cache().num_free_blocks(), usable - 4);
  EXPECT_TRUE(s.abort("p"));
  EXPECT_EQ(held("p"), 0u);
  expect_idle_and_clean(s);

  // Mid-decode.
  ASSERT_TRUE(s.add_request(make_request("d", prompt(30, 3), 50)).ok());
  for (int i = 0; i < 5; ++i) step(s, runner, rec);
  ASSERT_EQ(s.find("d")->num_output_tokens(), 5);
  EXPECT_TRUE(s.abort("d"));
  expect_idle_and_clean(s);

  // Between schedule() and update(): the update skips it, and the next
  // schedule() reports it finished so the runner can drop its state.
  ASSERT_TRUE(s.add_request(make_request("x", prompt(30, 4), 50)).ok());
  ASSERT_TRUE(s.add_request(make_request("y", prompt(30, 5), 50)).ok());
  SchedulerOutput out = s.schedule();
  const std::vector<int32_t> sampled = runner.execute(out);
  EXPECT_TRUE(s.abort("x"));
  auto updates = s.update(out, sampled);
  ASSERT_TRUE(updates.ok()) << updates.error().message;
  ASSERT_EQ(updates->size(), 1u);
  EXPECT_EQ((*updates)[0].request_id, "y");
  expect_invariants(s);
  out = s.schedule();
  EXPECT_EQ(out.finished_request_ids, std::vector<std::string>{"x"});
  EXPECT_TRUE(s.abort("y"));
  expect_idle_and_clean(s);
  EXPECT_EQ(s.stats().aborted, 5);
}

TEST(EngineScheduler, StopConditions) {
  Scheduler s(config(512, 8, 200, 8));
  FakeRunner runner(s);
  Recorder rec;
  const std::vector<int32_t> p = prompt(9, 42);
  const std::vector<int32_t> free_run = reference_output(make_request("ref", p, 20));
  ASSERT_EQ(free_run.size(), 20u);
  const int32_t third = free_run[2];
  // Pick the first position whose token did not occur earlier, so a stop on
  // it fires exactly there.
  ASSERT_EQ(std::count(free_run.begin(), free_run.begin() + 3, third), 1)
      << "pick another prompt seed";

  Request eos = make_request("eos", p, 20);
  eos.eos_token_id = third;
  Request ignore = eos;
  ignore.id = "ignore";
  ignore.ignore_eos = true;
  Request stop_tok = make_request("stop_tok", p, 20);
  stop_tok.stop_token_ids = {third};
  Request stop_tok_ignore = stop_tok;  // stop tokens apply even with ignore_eos
  stop_tok_ignore.id = "stop_tok_ignore";
  stop_tok_ignore.ignore_eos = true;
  Request length = make_request("length", p, 4);
  Request hooked = make_request("hooked", p, 20);
  for (const Request* r : {&eos, &ignore, &stop_tok, &stop_tok_ignore, &length, &hooked})
    ASSERT_TRUE(s.add_request(*r).ok());
  for (int i = 0; i < 2; ++i) step(s, runner, rec);
  // The engine saw a stop string in "hooked" after its second token.
  ASSERT_TRUE(s.finish_request("hooked", RequestStatus::kFinishedStopped).ok());
  EXPECT_FALSE(s.finish_request("hooked", RequestStatus::kFinishedStopped).ok());
  EXPECT_FALSE(s.finish_request("eos", RequestStatus::kRunning).ok());
  run_until_idle(s, runner, rec);

  const std::vector<int32_t> first3(free_run.begin(), free_run.begin() + 3);
  EXPECT_EQ(rec.outputs["eos"], first3);  // the stop token is part of the output
  EXPECT_EQ(rec.finished["eos"], RequestStatus::kFinishedStopped);
  EXPECT_EQ(rec.outputs["ignore"], free_run);
  EXPECT_EQ(rec.finished["ignore"], RequestStatus::kFinishedLength);
  EXPECT_EQ(rec.outputs["stop_tok"], first3);
  EXPECT_EQ(rec.outputs["stop_tok_ignore"], first3);
  EXPECT_EQ(rec.outputs["length"], std::vector<int32_t>(free_run.begin(), free_run.begin() + 4));
  EXPECT_EQ(rec.finished["length"], RequestStatus::kFinishedLength);
  EXPECT_EQ(rec.outputs["hooked"].size(), 2u);
  EXPECT_EQ(rec.finished.count("hooked"), 0u);  // finished by the engine, not by update()
  EXPECT_STREQ(finish_reason(RequestStatus::kFinishedLength), "length");
  expect_idle_and_clean(s);
}

TEST(EngineScheduler, MaxModelLenStopsGeneration) {
  SchedulerConfig c = config(512, 8, 200, 8);
  c.max_model_len = 30;
  Scheduler s(c);
  FakeRunner runner(s);
  Recorder rec;
  EXPECT_FALSE(s.add_request(make_request("too_long", prompt(25, 1), 6)).ok());
  ASSERT_TRUE(s.add_request(make_request("fits", prompt(25, 1), 5)).ok());
  run_until_idle(s, runner, rec);
  EXPECT_EQ(rec.outputs["fits"].size(), 5u);
}

TEST(EngineScheduler, AddRequestRefusesWhatCanNeverRun) {
  // 10 usable blocks of 4 tokens: 40 slots. The last sampled token needs no
  // slot, so prompt + max_tokens may be 41.
  Scheduler s(config(64, 8, 11, 4));
  Status st = s.add_request(make_request("big", prompt(30, 1), 12));
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("needs 11 KV blocks"), std::string::npos) << st.error().message;
  EXPECT_NE(st.error().message.find("only 10"), std::string::npos) << st.error().message;
  EXPECT_TRUE(s.add_request(make_request("exact", prompt(30, 1), 11)).ok());
  EXPECT_FALSE(s.add_request(make_request("exact", prompt(3, 1), 1)).ok());  // duplicate id
  EXPECT_FALSE(s.add_request(make_request("", prompt(3, 1), 1)).ok());
  EXPECT_FALSE(s.add_request(make_request("empty", {}, 1)).ok());
  EXPECT_FALSE(s.add_request(make_request("zero", prompt(3, 1), 0)).ok());
  Request bad_sampling = make_request("bad", prompt(3, 1), 1);
  bad_sampling.sampling.top_p = 2.0f;
  EXPECT_FALSE(s.add_request(bad_sampling).ok());
  EXPECT_EQ(s.num_waiting(), 1);

  // The exact fit really runs, alone, in all 10 blocks.
  FakeRunner runner(s);
  Recorder rec;
  run_until_idle(s, runner, rec);
  EXPECT_EQ(rec.outputs["exact"].size(), 11u);
  expect_idle_and_clean(s);
}

TEST(EngineScheduler, UpdateRefusesAMismatchedOutputAndChangesNothing) {
  Scheduler s(config(64, 8, 100, 16));
  FakeRunner runner(s);
  ASSERT_TRUE(s.add_request(make_request("a", prompt(10, 1), 5)).ok());
  SchedulerOutput out = s.schedule();
  std::vector<int32_t> sampled = runner.execute(out);
  EXPECT_FALSE(s.update(out, std::vector<int32_t>{}).ok());
  EXPECT_EQ(s.find("a")->num_computed_tokens, 0);
  ASSERT_TRUE(s.update(out, sampled).ok());
  EXPECT_EQ(s.find("a")->num_computed_tokens, 10);
  EXPECT_FALSE(s.update(out, sampled).ok());  // applied twice
  EXPECT_EQ(s.find("a")->num_output_tokens(), 1);
  expect_invariants(s);
}

// Thousands of random operations on a small pool: invariants after every
// step, outputs equal to the reference, and a clean pool at the end.
// with_drafts: every running request gets random drafts after each step,
// some right and some wrong, so rejected drafts are rolled back all the time.
// hybrid: a model with recurrent layers (state slots, sometimes fewer than
// max_num_seqs; prefix hits only where a snapshot of the state was kept, in
// 0 to 6 snapshot slots; with drafts, a checkpoint slot per state slot).
void randomized_operations(bool with_drafts, bool hybrid = false) {
  int64_t total_rejected = 0, total_preemptions = 0, total_hits = 0;
  int64_t window_hits = 0;
  for (uint32_t seed : {1u, 2u, 3u, 4u, 5u, 6u, 7u, 8u}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    // A pool of 100-160 tokens: the largest requests (147 tokens) sometimes
    // do not fit at all, and a few running ones fill it.
    const int32_t bs = uniform(1, 3) * 4;
    SchedulerConfig c = config(uniform(8, 96), uniform(2, 8), 1 + uniform(100, 160) / bs, bs,
                               seed != 3);
    if (seed == 2 || seed == 6) c.long_prefill_token_threshold = 24;
    // Attention-aware chunks on some seeds (no draw: the others' streams stay as they were).
    if (seed % 3 == 1) c.context_positions_per_token = 6.0 * seed;
    // Seeds 5-8: a full-attention group beside windowed ones (Gemma 3's shape).
    if (seed >= 5) {
      const int64_t w = uniform(3, 40);
      c.kv.group_windows = {0, w, w};
      if (seed == 8) c.kv.group_windows = {w, w};  // every layer windowed (Mistral's shape)
      c.kv.n_blocks = 1 + uniform(200, 320) / bs;  // about as tight for two or three groups

    }
    if (hybrid) {
      c.kv.n_state_slots = uniform(1, c.max_num_seqs);
      c.kv.n_state_snapshots = uniform(0, 6);
      c.kv.state_snapshot_interval = bs * uniform(0, 3);
      // 1: a checkpoint before the drafts; more: per-position states (fewer than
      // the proposer's drafts at times, so both ways of resuming are taken).
      c.kv.state_checkpoints = with_drafts ? uniform(1, 4) : 0;
    }
    const int64_t max_step = c.max_request_step_tokens();
    Scheduler s(c);
    FakeRunner runner(s);
    Recorder rec;
    const std::vector<int32_t> shared = prompt(48, seed);  // common prefixes make cache hits
    std::mt19937 draft_rng(seed + 100);
    const Proposer propose = with_drafts ? guessing_proposer(draft_rng, 1 + static_cast<int>(seed % 6)) : nullptr;
    std::map<std::string, Request> added;
    std::map<std::string, std::string> ended_early;  // aborted or finished by hook
    int rejected = 0, next_id = 0;

    for (int op = 0; op < 3000; ++op) {
      const int kind = uniform(0, 99);
      if (kind < 25) {
        std::vector<int32_t> p;
        if (uniform(0, 1)) p.assign(shared.begin(), shared.begin() + uniform(1, 48));
        const std::vector<int32_t> tail = prompt(uniform(0, 60), rng());
        p.insert(p.end(), tail.begin(), tail.end());
        if (p.empty()) p.push_back(1);
        Request r = make_request("r" + std::to_string(next_id++), p, uniform(1, 40));
        if (uniform(0, 3) == 0) r.eos_token_id = uniform(0, kVocab - 1);
        if (uniform(0, 5) == 0) r.cache_salt = "salt" + std::to_string(uniform(0, 1));
        const int64_t need =
            seed < 5 ? (static_cast<int64_t>(p.size()) + r.max_tokens - 1 + c.kv.block_size - 1) / c.kv.block_size
                     : kv::max_blocks_held(c.kv, static_cast<int64_t>(p.size()) + r.max_tokens - 1, max_step);
        const bool fits = need <= c.kv.n_blocks - 1;
        Status st = s.add_request(r);
        EXPECT_EQ(st.ok(), fits) << (st.ok() ? "" : st.error().message);
        if (st.ok()) added[r.id] = r; else ++rejected;
      } else if (kind < 30 && !added.empty()) {
        auto it = std::next(added.begin(), uniform(0, static_cast<int>(added.size()) - 1));
        if (s.find(it->first)) {
          if (uniform(0, 1)) {
            EXPECT_TRUE(s.abort(it->first));
          } else {
            EXPECT_TRUE(s.finish_request(it->first, RequestStatus::kFinishedStopped).ok());
          }
          ended_early[it->first] = "";
          // Freed within the call.
          EXPECT_FALSE(s.kv_cache().holds_blocks(it->first));
          expect_invariants(s);
        }
      } else {
        step(s, runner, rec, propose);
      }
      if (testing::Test::HasFatalFailure()) return;
    }
    run_until_idle(s, runner, rec, 100000, propose);
    expect_idle_and_clean(s);
    for (const auto& [id, r] : added) {
      const std::vector<int32_t> ref = reference_output(r);
      const std::vector<int32_t>& got = rec.outputs[id];
      if (ended_early.count(id)) {
        ASSERT_LE(got.size(), ref.size()) << id;
        EXPECT_TRUE(std::equal(got.begin(), got.end(), ref.begin())) << id;
      } else {
        EXPECT_EQ(got, ref) << id;
      }
    }
    const SchedulerStats st = s.stats();
    total_rejected += rejected;
    total_preemptions += st.preemptions;
    total_hits += st.prefix_cache.hit_tokens;
    if (seed >= 5) window_hits += st.prefix_cache.hit_tokens;
    std::printf("seed %u: %lld steps, %lld preemptions, %lld hit tokens, %d refused\n", seed,
                static_cast<long long>(st.steps), static_cast<long long>(st.preemptions),
                static_cast<long long>(st.prefix_cache.hit_tokens), rejected);
  }
  // The operations reached every path they are meant to exercise.
  EXPECT_GT(total_rejected, 0);
  EXPECT_GT(total_preemptions, 0);
  EXPECT_GT(total_hits, 0);
  if (!hybrid) EXPECT_GT(window_hits, 0);
}

TEST(EngineScheduler, DraftsAreVerifiedWithLookaheadSlotsAndRejectedOnesRolledBack) {
  Scheduler s(config(64, 4, 100, 4));
  FakeRunner runner(s);
  Recorder rec;
  const Request a = make_request("a", prompt(6, 1), 20);
  ASSERT_TRUE(s.add_request(a).ok());
  step(s, runner, rec);  // the prompt, and the first token
  const std::vector<int32_t> ref = reference_output(a);
  ASSERT_EQ(s.find("a")->num_tokens(), 7);

  // Five drafts: two right, then wrong ones.
  std::vector<int32_t> drafts = {ref[1], ref[2], (ref[3] + 1) % kVocab, 0, 0};
  ASSERT_TRUE(s.set_draft_tokens("a", drafts));
  SchedulerOutput out = s.schedule();
  ASSERT_EQ(out.scheduled.size(), 1u);
  const ScheduledRequest& sr = out.scheduled[0];
  EXPECT_EQ(sr.num_computed_tokens, 6);
  EXPECT_EQ(sr.num_new_tokens, 6);
  EXPECT_EQ(sr.num_draft_tokens, 5);
  EXPECT_TRUE(sr.sample);
  EXPECT_EQ(std::vector<int32_t>(sr.token_ids.begin() + 1, sr.token_ids.end()), drafts);
  EXPECT_EQ(sr.block_tables[0].size(), 3u);  // slots for positions 0..11: lookahead included
  expect_step_ok(s, out);
  const std::vector<std::vector<int32_t>> sampled = runner.execute_verifying(out);
  EXPECT_EQ(sampled[0], (std::vector<int32_t>{ref[1], ref[2], ref[3]}));
  // An output claiming a draft that was not scheduled is refused.
  EXPECT_FALSE(s.update(out, std::vector<std::vector<int32_t>>{{ref[1], 5, ref[3]}}).ok());
  auto updates = s.update(out, sampled);
  ASSERT_TRUE(updates.ok()) << updates.error().message;
  rec.record(*updates);
  const Request& r = *s.find("a");
  EXPECT_EQ(r.num_computed_tokens, 9);  // the token before the drafts and the two accepted ones
  EXPECT_EQ(r.num_tokens(), 10);
  // Blocks 0 and 1 hold verified tokens and are findable; block 2 holds the
  // rejected drafts' keys at positions 9..11 and is not.
  const kv::BlockPool& pool = s.kv_cache().pool();
  const std::span<const int32_t> table = s.kv_cache().block_table("a");
  ASSERT_EQ(table.size(), 3u);
  EXPECT_TRUE(pool.block_hash(table[1]).has_value());
  EXPECT_FALSE(pool.block_hash(table[2]).has_value());
  expect_invariants(s);

  // Drafts are cut to what max_tokens leaves (the token after them counts too).
  ASSERT_TRUE(s.set_draft_tokens("a", std::vector<int32_t>(40, 1)));
  EXPECT_EQ(s.find("a")->draft_token_ids.size(), 20u - 4u - 1u);
  // And to the step's budget.
  out = s.schedule();
  EXPECT_EQ(out.scheduled[0].num_draft_tokens, 15);
  updates = s.update(out, runner.execute_verifying(out));
  ASSERT_TRUE(updates.ok()) << updates.error().message;
  rec.record(*updates);
  run_until_idle(s, runner, rec);
  EXPECT_EQ(rec.outputs["a"], ref);
  expect_idle_and_clean(s);
  EXPECT_FALSE(s.set_draft_tokens("a", {1}));  // finished: no longer running
}

TEST(EngineScheduler, AStopTokenInsideAcceptedDraftsEndsTheRequestThere) {
  Scheduler s(config(64, 4, 100, 4));
  FakeRunner runner(s);
  Recorder rec;
  Request a = make_request("a", prompt(6, 2), 20);
  const std::vector<int32_t> plain = reference_output(a);
  a.eos_token_id = plain[2];  // the third token stops it
  ASSERT_TRUE(s.add_request(a).ok());
  step(s, runner, rec);
  ASSERT_TRUE(s.set_draft_tokens("a", {plain[1], plain[2], plain[3]}));
  step(s, runner, rec);
  EXPECT_EQ(rec.outputs["a"], (std::vector<int32_t>{plain[0], plain[1], plain[2]}));
  EXPECT_EQ(rec.finished["a"], RequestStatus::kFinishedStopped);
  expect_idle_and_clean(s);
}

TEST(EngineScheduler, RandomizedOperationsKeepInvariants) { randomized_operations(false); }

// The same with drafts: outputs still equal the reference (a rolled-back
// draft never shows), every write lands in an unhashed block of the writer's
// own (FakeRunner: a rejected draft's block is never findable), and the pool
// ends clean.
TEST(EngineScheduler, RandomizedOperationsWithDraftsKeepInvariants) { randomized_operations(true); }

// A hybrid model's cache: every running request holds a state slot (the
// scheduler's invariants check each scheduled request carries its own), the
// slots bound admission, preemption and finishing return them, and the pool
// and the slots end free (expect_idle_and_clean, the manager's invariants).
TEST(EngineScheduler, RandomizedOperationsWithRecurrentStateSlotsKeepInvariants) {
  randomized_operations(false, true);
}

// The same with drafts: rejected ones roll num_computed_tokens back to the
// checkpoint before the drafts, and no slot, snapshot or block leaks.
TEST(EngineScheduler, RandomizedOperationsWithRecurrentStateAndDraftsKeepInvariants) {
  randomized_operations(true, true);
}

TEST(EngineScheduler, AHybridModelRefusesBeamsAndDrafts) {
  SchedulerConfig c = config(64, 4, 100, 4);
  c.kv.n_state_slots = 4;
  Scheduler s(c);
  FakeRunner runner(s);
  Recorder rec;
  Request beams = make_request("b", prompt(6, 1), 5);
  beams.beam_width = 2;
  beams.beam_group = "g";
  const Status st = s.add_request(beams);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("recurrent"), std::string::npos) << st.error().message;
  ASSERT_TRUE(s.add_request(make_request("a", prompt(6, 1), 5)).ok());
  step(s, runner, rec);
  EXPECT_FALSE(s.set_draft_tokens("a", {1, 2}));
  EXPECT_EQ(s.kv_cache().state_slot("a"), 0);
  run_until_idle(s, runner, rec);
  expect_idle_and_clean(s);
  EXPECT_EQ(s.kv_cache().num_free_state_slots(), 4);
}

// Gemma 3's shape in small: one full-attention group and two windowed ones.
SchedulerConfig windowed_config(int64_t budget, int32_t max_seqs, int32_t n_blocks, int32_t block_size,
                                int64_t window, bool caching = true) {
  SchedulerConfig c = config(budget, max_seqs, n_blocks, block_size, caching);
  c.kv.group_windows = {0, window, window};
  return c;
}

TEST(EngineScheduler, WindowedGroupsGiveBackOutOfWindowBlocksAsARequestGrows) {
  // Blocks of 4 tokens, a 10-token window, 8-token chunks: a windowed group
  // holds at most (10 + 8 - 2) / 4 + 2 = 6 blocks, the full group all of them.
  const SchedulerConfig c = windowed_config(8, 1, 400, 4, 10);
  Scheduler s(c);
  FakeRunner runner(s);
  Recorder rec;
  const Request r = make_request("long", prompt(150, 7), 50);
  ASSERT_TRUE(s.add_request(r).ok());
  const kv::KVCacheManager& kv = s.kv_cache();
  int64_t max_windowed = 0;
  while (s.has_unfinished_requests()) {
    step(s, runner, rec);
    ASSERT_FALSE(HasFatalFailure());
    if (!kv.holds_blocks("long")) continue;
    const int64_t n = s.find("long")->num_computed_tokens;
    auto live = [&](int32_t g) {
      const std::span<const int32_t> t = kv.block_table("long", g);
      return std::count_if(t.begin(), t.end(), [](int32_t b) { return b != kv::BlockPool::kNullBlock; });
    };
    EXPECT_EQ(live(0), (n + 3) / 4) << "the full group keeps every block";
    for (int32_t g : {1, 2}) {
      EXPECT_LE(live(g), 6) << "at " << n << " tokens";
      max_windowed = std::max<int64_t>(max_windowed, live(g));
      // Blocks wholly before the window of the next token are null.
      const std::span<const int32_t> t = kv.block_table("long", g);
      for (int64_t i = 0; i < static_cast<int64_t>(t.size()); ++i)
        if ((i + 1) * 4 <= n + 1 - 10 - 8) EXPECT_EQ(t[i], kv::BlockPool::kNullBlock) << "block " << i;
    }
    EXPECT_EQ(kv.num_used_blocks(), kv.num_blocks_held("long"));
  }
  EXPECT_GE(max_windowed, 4);
  EXPECT_EQ(rec.outputs.at("long"), reference_output(r));
  expect_idle_and_clean(s);
}

TEST(EngineScheduler, WindowedGroupsFreeBlocksSoLongRequestsFitWhereFullOnesCannot) {
  // 199 tokens need 50 blocks per group: 150 for three full groups, but with
  // two windowed groups 50 + 2 * 6 = 62, so a 70-block pool runs it.
  const Request r = make_request("long", prompt(150, 8), 50);
  Scheduler full(config(8, 1, 71, 4));
  EXPECT_TRUE(full.add_request(r).ok());  // one full group: 50 blocks
  SchedulerConfig three_full = config(8, 1, 71, 4);
  three_full.kv.group_windows = {0, 0, 0};
  Scheduler refused(three_full);
  EXPECT_FALSE(refused.add_request(r).ok());
  SchedulerStats st;
  const Recorder rec = run_all(windowed_config(8, 1, 71, 4, 10), {r}, &st);
  EXPECT_EQ(rec.outputs.at("long"), reference_output(r));
}

TEST(EngineScheduler, WindowedGroupsKeepOutputsUnderPreemptionAndPrefixCaching) {
  std::vector<Request> reqs;
  const std::vector<int32_t> shared = prompt(40, 99);
  for (int i = 0; i < 16; ++i) {
    std::vector<int32_t> p = i % 2 ? shared : std::vector<int32_t>{};
    const std::vector<int32_t> tail = prompt(20 + 7 * i, 50 + i);
    p.insert(p.end(), tail.begin(), tail.end());
    reqs.push_back(make_request("r" + std::to_string(i), p, 60));
  }
  SchedulerStats big_stats, tiny_stats, nocache_stats;
  // The largest (165 + 59 tokens) holds 56 blocks in the full group and, in
  // 16-token steps, at most (12 + 16 - 2) / 4 + 2 = 8 in each windowed one:
  // a 75-block pool (74 usable) holds it and little else.
  const Recorder big = run_all(windowed_config(16, 16, 3000, 4, 12), reqs, &big_stats);
  const Recorder tiny = run_all(windowed_config(16, 16, 75, 4, 12), reqs, &tiny_stats);
  const Recorder nocache = run_all(windowed_config(16, 16, 75, 4, 12, false), reqs, &nocache_stats);
  EXPECT_EQ(big_stats.preemptions, 0);
  EXPECT_GT(tiny_stats.preemptions, 0);
  EXPECT_GT(nocache_stats.preemptions, 0);
  EXPECT_GT(big_stats.prefix_cache.hit_tokens, 0);
  EXPECT_GT(tiny_stats.prefix_cache.hit_tokens, 0);
  for (const Request& r : reqs) {
    EXPECT_EQ(big.outputs.at(r.id), reference_output(r)) << r.id;
    EXPECT_EQ(tiny.outputs.at(r.id), big.outputs.at(r.id)) << r.id;
    EXPECT_EQ(nocache.outputs.at(r.id), big.outputs.at(r.id)) << r.id;
  }
}

// ---------------------------------------------------------------------------
// Beam search: a request's beams are a group of scheduler requests. The
// driver below applies the engine's rules (a group advances only on a step
// that gave every live beam a row; the first child of a beam continues it,
// others fork it, beams with none are dropped) with the fake model's
// logprobs, and the result must equal the same search run directly over the
// fake model, whatever the batching, budget, preemption and pool size.

// The fake model's logprob of `token` after `history`: a hash spread over
// [-8, 0) in steps of 1/512 (exact in a float, so ties are real ties).
float fake_logprob(std::span<const int32_t> history, int32_t token) {
  uint64_t h = 0x9e3779b97f4a7c15ull;
  for (int32_t t : history) h = (h ^ static_cast<uint32_t>(t)) * 1099511628211ull;
  h = (h ^ static_cast<uint32_t>(token + 1)) * 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return -static_cast<float>(h % 4096) / 512.0f;
}

// The k most likely tokens after `history`, most likely first (lower id on ties).
std::vector<TokenLogprob> fake_candidates(std::span<const int32_t> history, int32_t k) {
  std::vector<TokenLogprob> all;
  for (int32_t t = 0; t < kVocab; ++t) all.push_back({t, fake_logprob(history, t)});
  std::stable_sort(all.begin(), all.end(),
                   [](const TokenLogprob& a, const TokenLogprob& b) { return a.logprob > b.logprob; });
  all.resize(std::min<size_t>(static_cast<size_t>(k), all.size()));
  return all;
}

struct BeamGroupSpec {
  std::string name;
  std::vector<int32_t> prompt;
  int64_t max_tokens = 8;
  BeamSearchParams params;
  std::optional<int32_t> eos;
};

BeamEnd fake_ends(const BeamGroupSpec& g, int32_t token) {
  return g.eos && token == *g.eos ? BeamEnd::kStopToken : BeamEnd::kNone;
}

// The search run directly over the fake model.
std::vector<Beam> reference_beams(const BeamGroupSpec& g) {
  BeamSearch bs(g.params, static_cast<int64_t>(g.prompt.size()), g.max_tokens);
  while (!bs.done()) {
    std::vector<std::vector<TokenLogprob>> rows;
    for (const Beam& b : bs.live()) {
      std::vector<int32_t> history = g.prompt;
      history.insert(history.end(), b.token_ids.begin(), b.token_ids.end());
      rows.push_back(fake_candidates(history, bs.candidates_per_beam()));
    }
    bs.step(rows, [&](int32_t, int32_t t) { return fake_ends(g, t); });
  }
  return bs.finished();
}

class BeamDriver {
 public:
  BeamDriver(Scheduler& s, FakeRunner& runner) : s_(s), runner_(runner) {}

  Status add_group(const BeamGroupSpec& g) {
    Request r = make_request(g.name + "#0", g.prompt, g.max_tokens);
    r.beam_group = g.name;
    r.beam_width = g.params.beam_width;
    r.eos_token_id = g.eos;
    if (Status st = s_.add_request(r); !st) return st;
    groups_.emplace(g.name, Group{g, BeamSearch(g.params, static_cast<int64_t>(g.prompt.size()), g.max_tokens),
                                  {r.id}, 1});
    return {};
  }

  void abort_group(const std::string& name) {
    for (const std::string& id : groups_.at(name).ids) {
      EXPECT_TRUE(s_.abort(id));
      EXPECT_FALSE(s_.kv_cache().holds_blocks(id));
    }
    groups_.erase(name);
  }

  std::vector<std::string> group_names() const {
    std::vector<std::string> names;
    for (const auto& [name, g] : groups_) names.push_back(name);
    return names;
  }

  void step(Recorder& rec) {
    const SchedulerOutput out = s_.schedule();
    expect_step_ok(s_, out);
    expect_invariants(s_);
    runner_.execute_writes_and_reads(out);
    std::map<std::string, size_t> row_of;
    std::vector<std::vector<int32_t>> sampled(out.scheduled.size());
    for (size_t k = 0; k < out.scheduled.size(); ++k) {
      const ScheduledRequest& sr = out.scheduled[k];
      if (!sr.sample) continue;
      const Request* r = s_.find(sr.request_id);
      if (!r->beam_group.empty()) {
        row_of[sr.request_id] = k;
        continue;
      }
      const int64_t n = sr.num_computed_tokens + sr.num_new_tokens;
      sampled[k] = {next_token(std::span<const int32_t>(r->all_token_ids).first(n))};
    }
    struct Advance {
      std::string name;
      std::vector<BeamChild> children;
    };
    std::vector<Advance> advanced;
    for (auto& [name, g] : groups_) {
      const size_t have = std::count_if(g.ids.begin(), g.ids.end(), [&](const std::string& id) { return row_of.count(id); });
      if (have < g.ids.size()) {  // rows of some beams only: none is used
        held_steps += have > 0;
        continue;
      }
      std::vector<std::vector<TokenLogprob>> rows;
      for (const std::string& id : g.ids) rows.push_back(fake_candidates(s_.find(id)->all_token_ids, g.search.candidates_per_beam()));
      const BeamGroupSpec& spec = g.spec;
      std::vector<BeamChild> children = g.search.step(rows, [&](int32_t, int32_t t) { return fake_ends(spec, t); });
      std::vector<bool> continued(g.ids.size(), false);
      for (const BeamChild& c : children)
        if (!continued[c.parent]) {
          continued[c.parent] = true;
          sampled[row_of.at(g.ids[c.parent])] = {c.token};
        }
      advanced.push_back({name, std::move(children)});
    }
    auto updates = s_.update(out, sampled);
    ASSERT_TRUE(updates.ok()) << updates.error().message;
    for (const RequestUpdate& u : *updates) {
      const Request* r = s_.find(u.request_id);
      if (r && !r->beam_group.empty()) EXPECT_FALSE(is_finished(u.status)) << "a beam ended by the scheduler";
    }
    rec.record(*updates);
    for (const Advance& a : advanced) {
      Group& g = groups_.at(a.name);
      std::vector<bool> continued(g.ids.size(), false);
      for (const BeamChild& c : a.children) continued[c.parent] = true;
      for (size_t p = 0; p < g.ids.size(); ++p)
        if (!continued[p]) EXPECT_TRUE(s_.drop_beam(g.ids[p]));
      std::fill(continued.begin(), continued.end(), false);
      std::vector<std::string> ids;
      for (const BeamChild& c : a.children) {
        if (!continued[c.parent]) {
          continued[c.parent] = true;
          ids.push_back(g.ids[c.parent]);
          continue;
        }
        ids.push_back(a.name + "#" + std::to_string(g.next++));
        Status st = s_.fork(g.ids[c.parent], ids.back(), c.token);
        ASSERT_TRUE(st.ok()) << st.error().message;
        ++forks;
      }
      g.ids = std::move(ids);
      if (g.search.done()) {
        EXPECT_TRUE(g.ids.empty());
        results[a.name] = g.search.finished();
        groups_.erase(a.name);
      }
    }
    expect_invariants(s_);
  }

  std::map<std::string, std::vector<Beam>> results;
  int64_t held_steps = 0;  // steps where a group had rows for some of its beams only
  int64_t forks = 0;

 private:
  struct Group {
    BeamGroupSpec spec;
    BeamSearch search;
    std::vector<std::string> ids;  // live beam i's request
    int next;
  };
  Scheduler& s_;
  FakeRunner& runner_;
  std::map<std::string, Group> groups_;
};

void expect_same_beams(const std::vector<Beam>& got, const std::vector<Beam>& want, const std::string& name) {
  ASSERT_EQ(got.size(), want.size()) << name;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].token_ids, want[i].token_ids) << name << " beam " << i;
    EXPECT_EQ(got[i].cumulative_logprob, want[i].cumulative_logprob) << name << " beam " << i;
    EXPECT_EQ(got[i].end, want[i].end) << name << " beam " << i;
  }
}

BeamGroupSpec beam_spec(std::string name, std::vector<int32_t> p, int64_t max_tokens, int32_t width,
                        std::optional<int32_t> eos = std::nullopt) {
  BeamGroupSpec g;
  g.name = std::move(name);
  g.prompt = std::move(p);
  g.max_tokens = max_tokens;
  g.params.beam_width = width;
  g.eos = eos;
  return g;
}

// Admits the first beam "g#0" of a width-2 group and computes its prompt,
// which samples `first_token`.
void run_beam_root(Scheduler& s, FakeRunner& runner, std::vector<int32_t> prompt_ids, int32_t first_token) {
  Request root = make_request("g#0", std::move(prompt_ids), 10);
  root.beam_group = "g";
  root.beam_width = 2;
  ASSERT_TRUE(s.add_request(root).ok());
  SchedulerOutput out = s.schedule();
  runner.execute_writes_and_reads(out);
  ASSERT_TRUE(s.update(out, std::vector<int32_t>{first_token}).ok());
}

TEST(EngineSchedulerBeams, AForkSharesBlocksAndItsFirstWriteOfTheSharedBlockIsACopy) {
  Scheduler s(config(64, 4, 100, 4));
  FakeRunner runner(s);
  ASSERT_NO_FATAL_FAILURE(run_beam_root(s, runner, prompt(6, 1), 5));
  SchedulerOutput out;

  ASSERT_TRUE(s.fork("g#0", "g#1", 9).ok());
  const Request* child = s.find("g#1");
  ASSERT_NE(child, nullptr);
  EXPECT_EQ(child->output_token_ids, std::vector<int32_t>{9});
  EXPECT_EQ(child->num_computed_tokens, 6);
  EXPECT_EQ(child->status, RequestStatus::kRunning);
  const std::vector<int32_t> parent_table(s.kv_cache().block_table("g#0").begin(), s.kv_cache().block_table("g#0").end());
  ASSERT_EQ(parent_table.size(), 2u);  // positions 0..5: block 1 holds 4 and 5
  for (int32_t b : parent_table) EXPECT_EQ(s.kv_cache().pool().ref_count(b), 2);
  EXPECT_EQ(s.num_running(), 2);
  expect_invariants(s);
  // Refused: an id in use, a parent that is not a beam, a stop token.
  EXPECT_FALSE(s.fork("g#0", "g#1", 9).ok());
  Request plain = make_request("p", prompt(3, 2), 4);
  plain.eos_token_id = 63;
  ASSERT_TRUE(s.add_request(plain).ok());
  EXPECT_FALSE(s.fork("p", "p2", 1).ok());

  // Both write position 6, in the shared block 1: the first gets a copy.
  out = s.schedule();
  expect_step_ok(s, out);
  ASSERT_EQ(out.block_copies.size(), 1u);
  EXPECT_EQ(out.block_copies[0].src, parent_table[1]);
  runner.execute_writes_and_reads(out);  // every read sees its own tokens
  const std::span<const int32_t> a = s.kv_cache().block_table("g#0"), b = s.kv_cache().block_table("g#1");
  EXPECT_EQ(a[0], b[0]);
  EXPECT_NE(a[1], b[1]);
  for (const char* id : {"g#0", "g#1", "p"}) EXPECT_TRUE(s.abort(id));
  expect_idle_and_clean(s);
}

TEST(EngineSchedulerBeams, ARowNotUsedFeedsTheLastTokenAgain) {
  Scheduler s(config(64, 4, 100, 4));
  FakeRunner runner(s);
  ASSERT_NO_FATAL_FAILURE(run_beam_root(s, runner, prompt(5, 3), 7));
  SchedulerOutput out = s.schedule();
  ASSERT_EQ(out.scheduled.size(), 1u);
  EXPECT_EQ(out.scheduled[0].num_computed_tokens, 5);
  runner.execute_writes_and_reads(out);
  auto updates = s.update(out, std::vector<std::vector<int32_t>>{{}});
  ASSERT_TRUE(updates.ok()) << updates.error().message;
  EXPECT_TRUE(updates->empty());
  EXPECT_EQ(s.find("g#0")->num_computed_tokens, 5);
  EXPECT_EQ(s.find("g#0")->num_tokens(), 6);
  expect_invariants(s);
  out = s.schedule();
  ASSERT_EQ(out.scheduled.size(), 1u);
  EXPECT_EQ(out.scheduled[0].num_computed_tokens, 5);
  EXPECT_EQ(out.scheduled[0].token_ids, std::vector<int32_t>{7});
  EXPECT_TRUE(out.scheduled[0].sample);
  EXPECT_TRUE(s.abort("g#0"));
  expect_idle_and_clean(s);
}

TEST(EngineSchedulerBeams, AGroupTakesBeamWidthSeatsAndIsRefusedWhatItCanNeverRun) {
  Scheduler s(config(64, 4, 100, 4));
  FakeRunner runner(s);
  Recorder rec;
  BeamDriver driver(s, runner);
  ASSERT_TRUE(driver.add_group(beam_spec("g", prompt(5, 4), 6, 3)).ok());
  for (const char* id : {"a", "b"}) ASSERT_TRUE(s.add_request(make_request(id, prompt(4, id[0]), 6)).ok());
  driver.step(rec);
  // The root alone holds 3 seats of 4: "a" fits beside it, "b" waits.
  EXPECT_EQ(s.num_running(), 2 + 2);  // the root forked into 3 beams; and "a"
  EXPECT_EQ(s.num_waiting(), 1);
  EXPECT_EQ(s.find("b")->status, RequestStatus::kWaiting);
  EXPECT_EQ(s.stats().num_running_requests, 2);  // the group counts once
  EXPECT_EQ(s.stats().num_waiting_requests, 1);

  Request wide = make_request("w#0", prompt(4, 5), 4);
  wide.beam_group = "w";
  wide.beam_width = 5;
  Status st = Scheduler::validate_request(wide, s.config());
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("max_num_seqs"), std::string::npos) << st.error().message;
  // 3 beams of 4 + 30 - 1 tokens (9 blocks each) need 27 blocks of the 99.
  wide.beam_width = 3;
  wide.max_tokens = 30;
  EXPECT_TRUE(Scheduler::validate_request(wide, s.config()).ok());
  wide.max_tokens = 130;  // 34 blocks each
  st = Scheduler::validate_request(wide, s.config());
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("for each of 3 beams"), std::string::npos) << st.error().message;
  Request nameless = make_request("n", prompt(4, 6), 4);
  nameless.beam_width = 2;
  EXPECT_FALSE(Scheduler::validate_request(nameless, s.config()).ok());
  while (s.has_unfinished_requests()) driver.step(rec);
  expect_idle_and_clean(s);
}

// Random groups (widths 1-4), plain requests and aborts under small budgets,
// few seats and tight pools: groups are split by the budget (their rows are
// then not used), preempted whole and re-admitted whole, share and copy
// blocks; every finished search equals the direct one, every plain request its
// reference, and the pool ends with every reference count at zero.
TEST(EngineSchedulerBeams, RandomizedGroupsPlainRequestsAndAbortsGiveTheDirectSearchesBeams) {
  int64_t total_held = 0, total_preemptions = 0, total_copies = 0, total_forks = 0, total_compared = 0;
  for (uint32_t seed = 1; seed <= 8; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    const int32_t bs = uniform(1, 2) * 2;
    SchedulerConfig c = config(uniform(4, 12), uniform(4, 8), 1 + uniform(50, 90) / bs, bs, seed % 3 != 0);
    if (seed % 2 == 0) c.long_prefill_token_threshold = 3;
    if (seed % 3 == 1) c.context_positions_per_token = 2.0 * seed;  // attention-aware chunks
    if (seed >= 6) {
      const int64_t w = uniform(3, 12);
      c.kv.group_windows = {0, w};
      c.kv.n_blocks = 1 + uniform(90, 160) / bs;
    }
    Scheduler s(c);
    FakeRunner runner(s);
    Recorder rec;
    BeamDriver driver(s, runner);
    const std::vector<int32_t> shared = prompt(12, seed);
    std::map<std::string, BeamGroupSpec> specs;
    std::map<std::string, Request> plain;
    std::set<std::string> aborted;
    int next_id = 0;
    for (int op = 0; op < 600; ++op) {
      const int kind = uniform(0, 99);
      if (kind < 8) {
        std::vector<int32_t> p(shared.begin(), shared.begin() + uniform(1, 12));
        const std::vector<int32_t> tail = prompt(uniform(0, 8), rng());
        p.insert(p.end(), tail.begin(), tail.end());
        const int32_t width = std::min<int32_t>({uniform(1, 4), c.max_num_seqs, static_cast<int32_t>(c.max_num_batched_tokens)});
        BeamGroupSpec g = beam_spec("g" + std::to_string(next_id++), p, uniform(1, 12), width);
        if (uniform(0, 1)) g.eos = uniform(0, kVocab - 1);
        g.params.length_penalty = static_cast<float>(uniform(-2, 4)) / 2.0f;
        g.params.early_stopping = static_cast<EarlyStopping>(uniform(0, 2));
        if (driver.add_group(g).ok()) specs[g.name] = g;
      } else if (kind < 14) {
        Request r = make_request("r" + std::to_string(next_id++), prompt(uniform(1, 30), rng()), uniform(1, 12));
        if (s.add_request(r).ok()) plain[r.id] = r;
      } else if (kind < 16) {
        const std::vector<std::string> names = driver.group_names();
        if (!names.empty()) {
          const std::string name = names[uniform(0, static_cast<int>(names.size()) - 1)];
          driver.abort_group(name);
          aborted.insert(name);
          expect_invariants(s);
        }
      } else {
        driver.step(rec);
      }
      if (testing::Test::HasFatalFailure()) return;
    }
    for (int i = 0; i < 100000 && s.has_unfinished_requests(); ++i) {
      driver.step(rec);
      if (testing::Test::HasFatalFailure()) return;
    }
    ASSERT_FALSE(s.has_unfinished_requests());
    expect_idle_and_clean(s);
    for (const auto& [name, g] : specs) {
      if (aborted.count(name)) continue;
      ASSERT_TRUE(driver.results.count(name)) << name;
      expect_same_beams(driver.results.at(name), reference_beams(g), name);
      ++total_compared;
    }
    for (const auto& [id, r] : plain) EXPECT_EQ(rec.outputs[id], reference_output(r)) << id;
    total_held += driver.held_steps;
    total_preemptions += s.stats().preemptions;
    total_copies += runner.copied_blocks;
    total_forks += driver.forks;
  }
  std::printf("beam groups: %lld compared, %lld forks, %lld copies, %lld preemptions, %lld steps with a group's rows unused\n",
              static_cast<long long>(total_compared), static_cast<long long>(total_forks),
              static_cast<long long>(total_copies), static_cast<long long>(total_preemptions),
              static_cast<long long>(total_held));
  EXPECT_GT(total_compared, 50);
  EXPECT_GT(total_forks, 0);
  EXPECT_GT(total_copies, 0);
  EXPECT_GT(total_preemptions, 0);
  EXPECT_GT(total_held, 0);
}

}  // namespace
}  // namespace inferd

namespace inferd {
namespace {

// ---------------------------------------------------------------------------
// Deferred connector loads (a KV transfer): a fake remote holds prompts'
// blocks by key; a load it starts stays in flight until the test finishes it,
// writing the tokens into the fake runner's cache, or failing it.

namespace loading {

class RemoteConnector : public kv::KVConnector {
 public:
  RemoteConnector(FakeRunner& runner, int32_t bs) : runner_(runner), bs_(bs) {}
  // Offers a prompt's full blocks, as a producer's transfer parameters do.
  void offer(const std::vector<int32_t>& prompt) {
    kv::BlockHash parent = kv::kRootBlockHash;
    for (size_t i = 0; i + bs_ <= prompt.size(); i += bs_) {
      parent = kv::hash_block(parent, std::span(prompt).subspan(i, bs_), 0);
      blocks_[parent] = {prompt, static_cast<int64_t>(i)};
    }
  }
  bool contains(kv::BlockHash key) const override { return blocks_.count(key) > 0; }
  std::vector<bool> load(std::span<const kv::BlockTransfer> loads, bool) override {
    return std::vector<bool>(loads.size(), false);  // nothing here completes at once
  }
  std::optional<std::vector<bool>> start_load(const std::string& id, std::span<const kv::BlockTransfer> loads, bool,
                                              bool may_defer) override {
    if (!may_defer) return std::vector<bool>(loads.size(), false);
    EXPECT_FALSE(in_flight.count(id)) << id << " loads twice at once";
    in_flight[id].assign(loads.begin(), loads.end());
    ++started;
    return std::nullopt;
  }
  std::vector<kv::FinishedLoad> take_finished_loads() override { return std::exchange(finished_, {}); }
  bool has_unfinished_loads() const override { return !in_flight.empty(); }
  void save_evicted(std::span<const kv::BlockTransfer>) override {}
  void save_computed(std::span<const kv::BlockTransfer>) override {}

  // Ends a load: its blocks filled (ok) or not.
  void finish(const std::string& id, bool ok) {
    auto it = in_flight.find(id);
    ASSERT_NE(it, in_flight.end()) << id;
    for (const kv::BlockTransfer& l : it->second) {
      const auto& [tokens, first] = blocks_.at(l.key);
      if (ok) runner_.fill_block(l.block, tokens, first);
      else runner_.scribble(l.block);  // a failed transfer may leave anything behind
    }
    in_flight.erase(it);
    finished_.push_back({id, ok});
  }

  std::map<std::string, std::vector<kv::BlockTransfer>> in_flight;
  int64_t started = 0;

 private:
  FakeRunner& runner_;
  int32_t bs_;
  std::map<kv::BlockHash, std::pair<std::vector<int32_t>, int64_t>> blocks_;
  std::vector<kv::FinishedLoad> finished_;
};

// A scheduler with the fake remote as its connector.
struct Rig {
  explicit Rig(const SchedulerConfig& c) : s(c), runner(s), remote(runner, c.kv.block_size) {
    s.set_connector(&remote);
  }
  // Offers the prompt at the remote and runs a step: the request then waits for its blocks.
  void start_loading(const std::string& id, const std::vector<int32_t>& p, int64_t max_tokens) {
    remote.offer(p);
    ASSERT_TRUE(s.add_request(make_request(id, p, max_tokens)).ok());
    step(s, runner, rec);
    ASSERT_EQ(s.find(id)->status, RequestStatus::kLoadingRemoteKV);
  }
  Scheduler s;
  FakeRunner runner;
  RemoteConnector remote;
  Recorder rec;
};

}  // namespace loading

TEST(EngineSchedulerLoading, OthersKeepSteppingWhileARequestLoadsAndItsBlocksAreUsedNotComputed) {
  loading::Rig rig(config(64, 8, 64, 4));
  auto& [s, runner, remote, rec] = rig;
  const std::vector<int32_t> p = prompt(30, 7);  // 7 full blocks
  remote.offer(p);
  ASSERT_TRUE(s.add_request(make_request("remote", p, 5)).ok());
  ASSERT_TRUE(s.add_request(make_request("local", prompt(9, 8), 20)).ok());
  step(s, runner, rec);
  EXPECT_EQ(remote.started, 1);
  EXPECT_EQ(s.num_loading(), 1);
  EXPECT_EQ(s.find("remote")->status, RequestStatus::kLoadingRemoteKV);
  EXPECT_EQ(find_in(rec.steps.back(), "remote"), nullptr);
  // The other request steps on while the load is in flight.
  for (int i = 0; i < 5; ++i) step(s, runner, rec);
  EXPECT_EQ(rec.outputs["local"].size(), 6u);  // one from the first step, one a step since
  EXPECT_EQ(s.stats().num_loading, 1);
  const int64_t prefilled = runner.prefilled_prompt_tokens;
  remote.finish("remote", true);
  step(s, runner, rec);
  // Admitted on the loaded blocks: only the last prompt token is computed.
  const ScheduledRequest* sr = find_in(rec.steps.back(), "remote");
  ASSERT_NE(sr, nullptr);
  EXPECT_EQ(sr->num_computed_tokens, 28);
  EXPECT_EQ(runner.prefilled_prompt_tokens - prefilled, 2);
  EXPECT_EQ(s.find("remote")->num_cached_prompt_tokens, 28);
  run_until_idle(s, runner, rec);
  EXPECT_EQ(rec.outputs["remote"], reference_output(make_request("remote", p, 5)));
  EXPECT_EQ(rec.outputs["local"], reference_output(make_request("local", prompt(9, 8), 20)));
  EXPECT_EQ(s.stats().loads_finished, 1);
  EXPECT_EQ(s.stats().loads_failed, 0);
  expect_idle_and_clean(s);
}

TEST(EngineSchedulerLoading, AFailedLoadFreesItsBlocksAndTheRequestRecomputes) {
  loading::Rig rig(config(64, 8, 64, 4));
  auto& [s, runner, remote, rec] = rig;
  const std::vector<int32_t> p = prompt(22, 3);
  rig.start_loading("r", p, 6);
  const int32_t used_while_loading = s.kv_cache().num_used_blocks();
  EXPECT_GT(used_while_loading, 0);
  remote.finish("r", false);  // the blocks hold garbage now
  step(s, runner, rec);
  const ScheduledRequest* sr = find_in(rec.steps.back(), "r");
  ASSERT_NE(sr, nullptr);
  EXPECT_EQ(sr->num_computed_tokens, 0);  // recomputed from the start, never from the failed blocks
  EXPECT_EQ(remote.started, 1);           // and not pulled again
  run_until_idle(s, runner, rec);
  EXPECT_EQ(rec.outputs["r"], reference_output(make_request("r", p, 6)));
  EXPECT_EQ(s.stats().loads_failed, 1);
  expect_idle_and_clean(s);
}

TEST(EngineSchedulerLoading, AnAbortWhileLoadingHoldsTheBlocksUntilTheLoadEnds) {
  loading::Rig rig(config(64, 8, 24, 4));
  auto& [s, runner, remote, rec] = rig;
  const std::vector<int32_t> p = prompt(40, 11);
  rig.start_loading("r", p, 4);
  const int32_t held = s.kv_cache().num_used_blocks();
  ASSERT_TRUE(s.abort("r"));
  EXPECT_EQ(s.find("r"), nullptr);
  EXPECT_TRUE(s.has_loads_in_flight());
  EXPECT_EQ(s.kv_cache().num_used_blocks(), held);  // still held: the load may write them
  EXPECT_FALSE(s.add_request(make_request("r", p, 4)).ok());  // its id is not free yet
  expect_invariants(s);
  // Other requests run in the remaining blocks meanwhile, never in the held ones.
  ASSERT_TRUE(s.add_request(make_request("other", prompt(12, 5), 8)).ok());
  run_until_idle(s, runner, rec);
  EXPECT_EQ(rec.outputs["other"], reference_output(make_request("other", prompt(12, 5), 8)));
  EXPECT_EQ(s.kv_cache().num_used_blocks(), held);
  remote.finish("r", false);  // late, and writing: nobody else holds these blocks
  SchedulerOutput out = s.schedule();
  EXPECT_TRUE(out.scheduled.empty());
  EXPECT_FALSE(s.has_loads_in_flight());
  expect_idle_and_clean(s);
}

// A beam search's first beam, alone in its group, loads its prompt's blocks
// as a request alone does; its group then runs on them.
TEST(EngineSchedulerLoading, ABeamSearchsFirstBeamWaitsForItsLoadAlone) {
  loading::Rig rig(config(64, 8, 64, 4));
  auto& [s, runner, remote, rec] = rig;
  const std::vector<int32_t> p = prompt(20, 3);
  remote.offer(p);
  Request a = make_request("g#0", p, 3);
  a.beam_group = "g";
  a.beam_width = 2;
  ASSERT_TRUE(s.add_request(a).ok());
  step(s, runner, rec);
  EXPECT_EQ(s.num_loading(), 1);
  EXPECT_EQ(remote.started, 1);
  EXPECT_EQ(find_in(rec.steps.back(), "g#0"), nullptr);
  expect_invariants(s);
  remote.finish("g#0", true);
  step(s, runner, rec);
  const ScheduledRequest* sr = find_in(rec.steps.back(), "g#0");
  ASSERT_NE(sr, nullptr);
  EXPECT_EQ(sr->num_computed_tokens, 16);  // on the loaded blocks: the prompt's last block is computed
  expect_invariants(s);
}

// Another choice of the same prompt (n > 1) while the first loads its blocks:
// it waits for them, holding nothing, instead of computing the prompt again.
TEST(EngineSchedulerLoading, AChoiceWhosePrefixAnotherLoadsWaitsForItInsteadOfComputingIt) {
  loading::Rig rig(config(64, 8, 64, 4));
  auto& [s, runner, remote, rec] = rig;
  const std::vector<int32_t> p = prompt(30, 7);  // 7 full blocks
  rig.start_loading("c0", p, 5);
  ASSERT_TRUE(s.add_request(make_request("c1", p, 5)).ok());
  ASSERT_TRUE(s.add_request(make_request("other", prompt(9, 8), 6)).ok());
  for (int i = 0; i < 3; ++i) {
    step(s, runner, rec);
    EXPECT_EQ(find_in(rec.steps.back(), "c1"), nullptr);  // neither computed
    EXPECT_EQ(s.num_waiting_for_loads(), 1);
    expect_invariants(s);
  }
  EXPECT_NE(rec.outputs.count("other"), 0u);  // behind it in the queue, and not held up
  EXPECT_EQ(remote.started, 1);                // nor loaded twice
  EXPECT_EQ(s.stats().waited_for_loads, 1);
  EXPECT_EQ(s.stats().num_waiting_requests, 1);
  const int64_t prefilled = runner.prefilled_prompt_tokens;
  remote.finish("c0", true);
  step(s, runner, rec);
  // Both on the loaded blocks: each computes only the tokens after them.
  for (const char* id : {"c0", "c1"}) {
    const ScheduledRequest* sr = find_in(rec.steps.back(), id);
    ASSERT_NE(sr, nullptr) << id;
    EXPECT_EQ(sr->num_computed_tokens, 28) << id;
  }
  EXPECT_EQ(runner.prefilled_prompt_tokens - prefilled, 4);
  run_until_idle(s, runner, rec);
  EXPECT_EQ(rec.outputs["c0"], reference_output(make_request("c0", p, 5)));
  EXPECT_EQ(rec.outputs["c1"], reference_output(make_request("c1", p, 5)));
  EXPECT_EQ(remote.started, 1);
  expect_idle_and_clean(s);
}

// A waiting choice aborted, or the loading one aborted (its blocks then go
// unused): nothing is held or lost, and the other still completes.
TEST(EngineSchedulerLoading, AbortingTheLoadOrTheChoiceWaitingForItLeavesNothingBehind) {
  for (const char* aborted : {"c1", "c0"}) {
    SCOPED_TRACE(aborted);
    loading::Rig rig(config(64, 8, 64, 4));
    auto& [s, runner, remote, rec] = rig;
    const std::vector<int32_t> p = prompt(26, 3);
    rig.start_loading("c0", p, 4);
    ASSERT_TRUE(s.add_request(make_request("c1", p, 4)).ok());
    step(s, runner, rec);
    ASSERT_EQ(s.num_waiting_for_loads(), 1);
    ASSERT_TRUE(s.abort(aborted));
    expect_invariants(s);
    EXPECT_EQ(s.num_waiting_for_loads(), std::string(aborted) == "c1" ? 0 : 1);
    remote.finish("c0", true);
    // The survivor runs to the end (loading its own blocks where the fake remote offers them).
    for (int n = 0; n < 1000 && (s.has_unfinished_requests() || s.has_loads_in_flight()); ++n) {
      std::vector<std::string> ids;
      for (const auto& [id, loads] : remote.in_flight) ids.push_back(id);
      for (const std::string& id : ids) remote.finish(id, true);
      step(s, runner, rec);
    }
    const std::string survivor = std::string(aborted) == "c1" ? "c0" : "c1";
    EXPECT_EQ(rec.outputs[survivor], reference_output(make_request(survivor, p, 4)));
    expect_idle_and_clean(s);
  }
}

TEST(EngineSchedulerLoading, ManyRequestsLoadingFinishingAndAbortingInAnyOrderLeakNothing) {
  std::mt19937 rng(5);
  loading::Rig rig(config(48, 6, 80, 4));
  auto& [s, runner, remote, rec] = rig;
  std::map<std::string, Request> reqs;
  std::set<std::string> aborted;
  for (int i = 0; i < 24; ++i) {
    const std::string id = "r" + std::to_string(i);
    Request r = make_request(id, prompt(5 + static_cast<int32_t>(rng() % 40), 100 + i), 1 + rng() % 6);
    // Some share an earlier request's prompt (choices of one prompt): they wait for its load.
    if (i > 0 && rng() % 4 == 0) r.prompt_token_ids = reqs.at("r" + std::to_string(rng() % i)).prompt_token_ids;
    if (rng() % 3) remote.offer(r.prompt_token_ids);
    reqs.emplace(id, r);
    ASSERT_TRUE(s.add_request(r).ok());
  }
  for (int n = 0; n < 5000 && (s.has_unfinished_requests() || s.has_loads_in_flight()); ++n) {
    // Finish or fail some loads, abort now and then.
    std::vector<std::string> ids;
    for (const auto& [id, loads] : remote.in_flight) ids.push_back(id);
    for (const std::string& id : ids)
      if (rng() % 3 == 0) remote.finish(id, rng() % 4 != 0);
    if (rng() % 17 == 0 && !reqs.empty()) {
      auto it = std::next(reqs.begin(), static_cast<long>(rng() % reqs.size()));
      if (s.abort(it->first)) aborted.insert(it->first);
    }
    step(s, runner, rec);
    if (testing::Test::HasFatalFailure()) return;
  }
  ASSERT_FALSE(s.has_unfinished_requests());
  ASSERT_FALSE(s.has_loads_in_flight());
  for (const auto& [id, r] : reqs)
    if (!aborted.count(id)) EXPECT_EQ(rec.outputs[id], reference_output(r)) << id;
  EXPECT_GT(s.stats().waited_for_loads, 0);  // the shared prompts did wait for each other's loads
  expect_idle_and_clean(s);
}

TEST(EngineSchedulerLeases, AFinishedPrefillHoldsItsPromptsFullBlocksUntilTheLeaseEnds) {
  Scheduler s(config(64, 8, 32, 4));
  FakeRunner runner(s);
  Recorder rec;
  Request r = make_request("p", prompt(18, 4), 1);  // 4 full blocks, 2 tokens over
  r.kv_lease_id = 77;
  ASSERT_TRUE(s.add_request(r).ok());
  Request aborted = make_request("q", prompt(18, 5), 50);
  aborted.kv_lease_id = 78;
  ASSERT_TRUE(s.add_request(aborted).ok());
  step(s, runner, rec);
  ASSERT_TRUE(s.abort("q"));  // an aborted prefill holds nothing
  run_until_idle(s, runner, rec);
  const std::vector<std::vector<int32_t>> blocks = s.lease_blocks(77);
  ASSERT_EQ(blocks.size(), 1u);
  ASSERT_EQ(blocks[0].size(), 4u);
  for (int32_t b : blocks[0]) EXPECT_EQ(s.kv_cache().pool().ref_count(b), 1);
  EXPECT_TRUE(s.lease_blocks(78).empty());
  EXPECT_EQ(s.stats().kv_leases, 1);
  expect_invariants(s);
  // Later requests cannot evict them: fill the pool with others.
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(s.add_request(make_request("f" + std::to_string(i), prompt(16, 40 + i), 9)).ok());
  run_until_idle(s, runner, rec);
  for (size_t i = 0; i < blocks[0].size(); ++i) EXPECT_EQ(s.kv_cache().pool().ref_count(blocks[0][i]), 1);
  EXPECT_TRUE(s.end_lease(77));
  EXPECT_FALSE(s.end_lease(77));
  expect_idle_and_clean(s);
}

}  // namespace
}  // namespace inferd
