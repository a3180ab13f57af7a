// Speculative decoding: what proposes draft tokens, and how many.
//
// The engine verifies a request's drafts in its next step (vLLM v1's way): the
// scheduler feeds the request's last token and its k drafts together, the
// runner returns k + 1 rows of logits, each computed with a decode step's
// arithmetic, and the engine samples the rows in order, keeping each draft
// while the token sampled at its position equals it. The first position that
// differs gives the sampled token instead, and the rest are dropped by moving
// num_computed_tokens back (scheduler). A draft that is a single token (the
// n-gram proposer's, q one-hot) is accepted with probability p(draft), and on
// rejection the token comes from p without it, renormalised: exactly
// Leviathan et al.'s rejection sampling for a one-hot q. Sampling first and
// comparing after draws each position's token from the same random stream a
// plain step would, so greedy and seeded outputs are token-identical with
// speculation and without.
//
// Proposers are pure functions of a request's token ids and run outside the
// scheduler.
#pragma once
#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/result.h"

namespace inferd {

struct SpeculativeConfig {
  enum class Method { kNone, kNgram, kDraftModel };
  Method method = Method::kNone;
  int32_t num_speculative_tokens = 0;  // k, drafts per step at most
  // Draft model (draft_model_proposer.h): a smaller GGUF with the target's
  // vocabulary, run greedily. Its drafts stop at the first token whose
  // probability under the draft is below draft_p_min (llama.cpp's
  // --draft-p-min): an unsure draft is seldom accepted, and each costs a pass.
  std::string draft_model;
  double draft_p_min = 0.75;
  // > 0: the draft proposes only token ids below this, and its output matrix
  // is read for those rows only (LoadOptions::max_output_rows). BPE and
  // SentencePiece vocabularies put frequent tokens first, so the first 32k
  // of Qwen's 152k ids cover nearly every token of ordinary text and code,
  // while the full head is a third of a 0.5B draft's bytes per step (as
  // FR-Spec and EAGLE-3's reduced draft vocabularies do). 0: every id.
  int64_t draft_vocab_size = 0;
  // N-gram (prompt lookup): the longest suffix of the sequence of between
  // prompt_lookup_min and prompt_lookup_max tokens that occurred earlier
  // proposes the tokens that followed its latest earlier occurrence.
  int32_t prompt_lookup_min = 1;
  int32_t prompt_lookup_max = 4;
  // No drafts while this many requests or more run (speculation spends
  // compute that a large batch already uses); 0: always speculate.
  int32_t disable_by_batch_size = 0;
  // The most drafts of a request's first proposal (DraftLength); 0: the
  // default, first_drafts(). Before any verification nothing says whether an
  // answer copies its prompt, and a wholly rejected proposal of n drafts
  // costs n times what a draft adds to a step: 0.2 of a decode step for
  // Qwen2.5-Coder 1.5B on two cores, 0.43 for SmolLM2-135M, whose weights sit
  // in a large L3 (docs/benchmarks.md). A copy gets back to k in two steps.
  int32_t first_draft_tokens = 0;

  // 3 (at most k) for the n-gram method; k for a draft model, whose
  // confidence cut (draft_p_min) already shortens unsure proposals.
  int32_t first_drafts() const {
    if (first_draft_tokens > 0) return std::min(first_draft_tokens, num_speculative_tokens);
    return method == Method::kNgram ? std::min(kNgramFirstDrafts, num_speculative_tokens) : num_speculative_tokens;
  }
  static constexpr int32_t kNgramFirstDrafts = 3;

  // Beside recurrent layers (Gated DeltaNet, Mamba-2), whose state cannot be
  // cut back, how a verification that rejects drafts returns the state to
  // its last accepted token:
  // - kCheckpoint: the verifying step keeps the state before the drafts; the
  //   next step starts from it and computes the accepted drafts again. One
  //   state slot per running request.
  // - kPerPosition: it keeps the state before each draft; the next step
  //   starts from the one after the last accepted draft and computes nothing
  //   again. k state slots per running request.
  // Both give the same tokens (the state is the same bits); they differ in
  // memory and in the work of a partial acceptance. Checkpoint is the
  // default: on two CPU cores the two are within a few percent of each
  // other (per-position ahead when verifications accept some drafts, behind
  // when they accept all or none, for its k - 1 more state copies a step),
  // while per-position keeps k times the slots (docs/benchmarks.md).
  enum class StateRollback { kCheckpoint, kPerPosition };
  StateRollback state_rollback = StateRollback::kCheckpoint;
  // State slots per running request that the rollback keeps (KVCacheConfig::state_checkpoints).
  int32_t state_checkpoints() const {
    if (!enabled()) return 0;
    return state_rollback == StateRollback::kPerPosition ? num_speculative_tokens : 1;
  }

  bool enabled() const { return method != Method::kNone && num_speculative_tokens > 0; }
  Status validate() const;  // error naming the first bad field
};

// One request's n-gram proposer. Prompt lookup: up to k tokens that followed
// the latest earlier occurrence of the longest suffix of the sequence that is
// between min_n and max_n tokens long (longer suffixes first), with two
// additions for answers that are edited copies of their prompt (a renamed
// identifier, corrected spelling), where plain lookup loses the copy at every
// edit and finds it again only n tokens later:
// - Substitutions. A prompt token the target replaced by the same other token
//   twice (a rename) is read as its replacement from then on, in lookups and
//   in drafts; one rejected substituted draft forgets it.
// - Resync. When no suffix occurs earlier, the copy is looked for where it
//   left the prompt: the n-gram just before the last j tokens (j <= 4) is
//   found, and the last token within a few tokens after that point gives the
//   drafts (a word corrected into other tokens, then the copy goes on).
// Both act on the prompt only, so a free answer that repeats itself drafts as
// with plain lookup. Drafts never change the output (speculative.h's
// verification), only how many tokens a step gains.
class NgramProposer {
 public:
  NgramProposer(int32_t min_n, int32_t max_n) : min_n_(min_n), max_n_(max_n) {}
  // Up to k drafts to follow `tokens` (prompt, then output), whose first
  // num_prompt_tokens are the prompt.
  std::vector<int32_t> propose(std::span<const int32_t> tokens, int64_t num_prompt_tokens, int32_t k);
  // The last proposal's verification: its first `accepted` drafts were kept,
  // and where the next one was rejected the target chose `target_token`.
  void verified(int64_t accepted, int32_t target_token);

 private:
  struct Substitution {
    int32_t from, to;
  };
  static constexpr int kResyncBack = 4;     // edited tokens since the copy left the prompt, at most
  static constexpr int kResyncWindow = 6;   // prompt tokens past that point searched for the last token
  static constexpr int kConfirmations = 2;  // the same replacement seen this often becomes a substitution
  static constexpr size_t kMaxCandidates = 256;

  int32_t copied(int32_t token) const;  // the token as drafts copy it (its substitution, if any)
  // Latest s < limit with copied(tokens[s + i]) == pattern[i] for every i, or -1.
  int64_t find_latest(std::span<const int32_t> tokens, std::span<const int32_t> pattern, int64_t limit) const;
  std::vector<int32_t> drafts_from(std::span<const int32_t> tokens, int64_t from, int32_t k);

  int32_t min_n_, max_n_;
  std::vector<Substitution> substitutions_;
  std::vector<std::pair<Substitution, int32_t>> candidates_;  // replacements seen, and how often
  // The last proposal: where its drafts were copied from, and the tokens there.
  int64_t last_from_ = -1, last_num_prompt_tokens_ = 0;
  std::vector<int32_t> last_source_;
};

// How many drafts one request proposes next. `first` at first
// (SpeculativeConfig::first_drafts); after a verification, doubled back
// towards k when every draft was accepted, the accepted count + 1 when some
// were, halved when none was; below 1, no drafts for a pause of 4 steps,
// doubling to 64 while probes (of 1 draft) keep failing. A request whose
// output does not follow its prompt so spends little compute on drafts, and
// one that copies gets back to k in a few steps.
class DraftLength {
 public:
  DraftLength(int32_t k, int32_t first) : k_(k), len_(std::clamp(first, 1, std::max(k, 1))) {}
  // The most drafts to propose this step; 0 while paused. One call a step.
  int32_t next();
  // The last proposal's `drafted` drafts were verified and the first
  // `accepted` kept (a draft model that was unsure of its first draft
  // proposes none: verified(0, n) backs off the same way).
  void verified(int64_t accepted, int64_t drafted);

 private:
  int32_t k_, len_;
  int32_t pause_ = 0, pause_left_ = 0;  // steps of the current pause, and those left
};

// Acceptance counters, vLLM's spec_decode metrics.
struct SpeculativeStats {
  int64_t drafts = 0;                // steps that verified drafts (one per request)
  int64_t draft_tokens = 0;          // drafts proposed and verified
  int64_t accepted_tokens = 0;       // drafts accepted
  std::vector<int64_t> accepted_per_position;  // [i]: drafts accepted at position i
  // One verification of `drafted` drafts, the first `accepted` of them kept.
  void record(int64_t drafted, int64_t accepted) {
    ++drafts;
    draft_tokens += drafted;
    accepted_tokens += accepted;
    if (accepted_per_position.size() < static_cast<size_t>(drafted)) accepted_per_position.resize(static_cast<size_t>(drafted));
    for (int64_t j = 0; j < accepted; ++j) ++accepted_per_position[static_cast<size_t>(j)];
  }
  // Mean tokens a verifying request gains per step (accepted + the sampled one).
  double mean_acceptance_length() const {
    return drafts ? 1.0 + static_cast<double>(accepted_tokens) / static_cast<double>(drafts) : 0.0;
  }
};

}  // namespace inferd
