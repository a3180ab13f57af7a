// Speculative decoding beside recurrent layers: the two ways a verification
// that rejects drafts takes the state back to its last accepted token
// (SpeculativeConfig::StateRollback), measured as decode tokens/s of one
// greedy request on a hybrid model (qwen35, qwen35moe, nemotron_h), beside
// plain decoding:
//   checkpoint    the state before the drafts is kept; the accepted drafts
//                 are computed again in the next step
//   per-position  the state before each draft is kept; the next step starts
//                 from the one after the last accepted draft
// Workloads (each a prompt and where the drafts come from):
//   ngram-repeat  n-gram drafts (prompt lookup 1..3, the engine's draft
//                 lengths), a prompt of 32 random tokens said four times
//   ngram-random  the same proposer, a prompt of 128 random tokens
//   accept-J      the greedy output computed beforehand gives k drafts with
//                 the one at index J made wrong: every verification accepts J
//                 drafts (J = k: all of them). A random-weight model's own
//                 outputs seldom follow its prompt, so these are what show
//                 the methods' costs when drafts are accepted.
// Every speculative run must give the plain greedy output (checked). The
// scheduler and the runner are driven as the engine drives them, without
// the output processing.
//
//   ./build/state_rollback_bench MODEL.gguf [--threads 2] [--tokens 128] [--k 4] [--reps 3]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "engine/model_runner.h"
#include "engine/scheduler.h"
#include "engine/speculative.h"
#include "model/kv_cache.h"
#include "model/model.h"

using namespace inferd;

namespace {

struct Run {
  std::vector<int32_t> output;
  double decode_s = 0;  // after the first token
  int64_t drafted = 0, accepted = 0, steps = 0;
};

// Drafts for the next step, given the tokens so far (prompt then output), or none.
using Proposer = std::function<std::vector<int32_t>(const std::vector<int32_t>& tokens, int64_t num_prompt)>;
// Told how many of the last proposal's drafts were accepted, and the token sampled after them.
using Verified = std::function<void(int64_t accepted, int64_t drafted, int32_t target)>;

// One greedy request of max_tokens through a scheduler and a runner keeping
// `checkpoints` state checkpoints per slot (0: no speculation).
Result<Run> run(Model& model, const std::vector<int32_t>& prompt, int64_t max_tokens, int32_t checkpoints,
                const Proposer& propose, const Verified& verified) {
  const KVLayout layout = KVLayout::plan(model.config(), 16);
  kv::KVCacheConfig kv{.n_blocks = 0, .block_size = 16, .group_windows = layout.group_windows, .n_state_slots = 1,
                       .state_checkpoints = checkpoints};
  ModelRunnerConfig rc;
  rc.n_state_slots = kv::state_slots_in_cache(kv);
  const int64_t blocks = (static_cast<int64_t>(prompt.size()) + max_tokens + 64) / 16 + 2;
  rc.kv_cache_bytes = blocks * static_cast<int64_t>(KVCache::block_bytes(model.config(), 16)) +
                      int64_t{rc.n_state_slots + 1} * static_cast<int64_t>(layout.state_slot_bytes());
  rc.warm_up = false;
  auto runner = ModelRunner::create(model, rc);
  if (!runner) return runner.error();
  SchedulerConfig sc;
  sc.max_num_batched_tokens = 512;
  sc.max_num_seqs = 1;
  kv.n_blocks = (*runner)->n_blocks();
  sc.kv = kv;
  Scheduler scheduler(sc);
  Request r;
  r.id = "a";
  r.prompt_token_ids = prompt;
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  if (Status s = scheduler.add_request(r); !s) return s.error();
  SamplingRequest sr;
  sr.params.temperature = 0.0f;
  sr.prompt_token_ids = prompt;
  (*runner)->add_request("a", sr);

  Run out;
  std::vector<int32_t> tokens = prompt;
  std::chrono::steady_clock::time_point first_token;
  while (scheduler.has_unfinished_requests()) {
    const SchedulerOutput step = scheduler.schedule();
    const int64_t n_drafts = step.scheduled.at(0).num_draft_tokens;
    ModelRunnerOutput& sampled = (*runner)->execute(step, {});
    std::vector<std::vector<int32_t>> sampled_tokens;
    for (const SampledRequest& q : sampled.requests) sampled_tokens.push_back(q.tokens);
    auto updates = scheduler.update(step, sampled_tokens);
    if (!updates) return updates.error();
    for (const RequestUpdate& u : *updates) tokens.insert(tokens.end(), u.new_token_ids.begin(), u.new_token_ids.end());
    if (n_drafts > 0 && !sampled_tokens[0].empty()) {
      const int64_t accepted = static_cast<int64_t>(sampled_tokens[0].size()) - 1;
      out.drafted += n_drafts;
      out.accepted += accepted;
      if (verified) verified(accepted, n_drafts, sampled_tokens[0].back());
    }
    if (++out.steps == 1) first_token = std::chrono::steady_clock::now();
    if (!scheduler.find("a")) break;
    if (checkpoints > 0)
      if (std::vector<int32_t> d = propose(tokens, static_cast<int64_t>(prompt.size())); !d.empty())
        scheduler.set_draft_tokens("a", std::move(d));
  }
  out.decode_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - first_token).count();
  out.output.assign(tokens.begin() + static_cast<int64_t>(prompt.size()), tokens.end());
  return out;
}

std::vector<int32_t> random_tokens(const Model& model, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  const Tokenizer& tok = model.tokenizer();
  std::uniform_int_distribution<int32_t> dist(0, tok.n_vocab() - 1);
  std::vector<int32_t> p;
  while (static_cast<int64_t>(p.size()) < n)
    if (const int32_t t = dist(rng); !tok.is_control(t) && !tok.is_eog(t)) p.push_back(t);
  return p;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL.gguf [--threads N] [--tokens N] [--k K] [--reps N]\n", argv[0]);
    return 2;
  }
  int threads = 2, k = 4, reps = 3;
  int64_t max_tokens = 128;
  for (int i = 2; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--tokens")) max_tokens = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--k")) k = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
  }
  LoadOptions options;
  options.n_threads = threads;
  auto loaded = Model::load(argv[1], options);
  if (!loaded) {
    std::fprintf(stderr, "error: %s\n", loaded.error().message.c_str());
    return 1;
  }
  Model& model = **loaded;
  if (!model.config().has_recurrent_layers()) {
    std::fprintf(stderr, "error: %s has no recurrent layers: both methods are the same there\n", argv[1]);
    return 1;
  }
  const KVLayout layout = KVLayout::plan(model.config(), 16);
  std::printf("%s, %d threads, %lld output tokens, k = %d, median of %d; a state slot is %.2f MiB: "
              "checkpoint keeps 1 more per request, per-position %d\n",
              argv[1], threads, static_cast<long long>(max_tokens), k, reps,
              static_cast<double>(layout.state_slot_bytes()) / (1 << 20), k);

  struct Workload {
    std::string name;
    std::vector<int32_t> prompt;
    int accept;  // the oracle's accepted drafts a step, or -1: n-gram drafts
  };
  std::vector<int32_t> repeat = random_tokens(model, 32, 1);
  for (int i = 0; i < 3; ++i) repeat.insert(repeat.end(), repeat.begin(), repeat.begin() + 32);
  std::vector<Workload> workloads = {{"ngram-repeat", repeat, -1}, {"ngram-random", random_tokens(model, 128, 2), -1}};
  for (int j : {k, k / 2, 1, 0}) workloads.push_back({"accept-" + std::to_string(j), random_tokens(model, 128, 3), j});

  std::printf("| workload | plain tok/s | checkpoint tok/s | per-position tok/s | per-position / checkpoint | "
              "drafts accepted | steps (plain, checkpoint, per-position) |\n|---|---:|---:|---:|---:|---:|---|\n");
  for (const Workload& w : workloads) {
    std::vector<double> tps[3];
    Run last[3];
    for (int rep = 0; rep < reps; ++rep) {
      // Interleaved, so that a host whose speed drifts affects the three alike.
      for (int m = 0; m < 3; ++m) {
        const int32_t checkpoints = m == 0 ? 0 : m == 1 ? 1 : k;
        NgramProposer ngram(1, 3);
        SpeculativeConfig sc;
        sc.method = SpeculativeConfig::Method::kNgram;
        sc.num_speculative_tokens = k;
        DraftLength length(k, sc.first_drafts());
        const std::vector<int32_t>& expected = last[0].output;
        Proposer propose = [&](const std::vector<int32_t>& tokens, int64_t num_prompt) {
          if (w.accept < 0) return ngram.propose(tokens, num_prompt, length.next());
          std::vector<int32_t> d;
          for (size_t i = tokens.size() - static_cast<size_t>(num_prompt); i < expected.size() && d.size() < static_cast<size_t>(k); ++i)
            d.push_back(expected[i]);
          if (w.accept < static_cast<int>(d.size()))
            d[static_cast<size_t>(w.accept)] = (d[static_cast<size_t>(w.accept)] + 1) % static_cast<int32_t>(model.config().n_vocab);
          return d;
        };
        Verified verified = [&](int64_t accepted, int64_t drafted, int32_t target) {
          if (w.accept < 0) {
            length.verified(accepted, drafted);
            ngram.verified(accepted, target);
          }
        };
        auto r = run(model, w.prompt, max_tokens, checkpoints, propose, verified);
        if (!r) {
          std::fprintf(stderr, "error: %s\n", r.error().message.c_str());
          return 1;
        }
        if (m > 0 && r->output != last[0].output) {
          std::fprintf(stderr, "error: %s: the %s output differs from plain greedy decoding\n", w.name.c_str(),
                       m == 1 ? "checkpoint" : "per-position");
          return 1;
        }
        tps[m].push_back(static_cast<double>(r->output.size() - 1) / r->decode_s);
        last[m] = std::move(*r);
      }
    }
    const double plain = median(tps[0]), checkpoint = median(tps[1]), per_position = median(tps[2]);
    std::printf("| %s | %.1f | %.1f | %.1f | %.3f | %lld of %lld | %lld, %lld, %lld |\n", w.name.c_str(), plain,
                checkpoint, per_position, per_position / checkpoint, static_cast<long long>(last[2].accepted),
                static_cast<long long>(last[2].drafted), static_cast<long long>(last[0].steps),
                static_cast<long long>(last[1].steps), static_cast<long long>(last[2].steps));
    std::fflush(stdout);
  }
  return 0;
}
