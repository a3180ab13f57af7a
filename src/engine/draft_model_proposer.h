// The draft-model proposer of speculative decoding: a second, smaller model
// with the target's vocabulary proposes each speculating request's next
// tokens, greedily, in batched forward passes of its own.
//
// It runs in the engine's process and on the target's threads (the two models
// run one after the other, never at once), with a paged KV cache of its own:
// a KVCacheManager and a ModelRunner, as the target has. Per request it
// remembers which tokens its cache holds. Each step, a request's draft cache
// first catches up with the target's sequence: the tokens it holds that the
// target did not accept (rejected drafts) are dropped by moving back, as the
// target's scheduler does, and the tokens it has not seen (the prompt, the
// first time; then the last accepted draft and the target's own token) are
// fed in one pass, every request together. Then one pass per draft token
// feeds each request's latest draft. A request stops drafting at its length,
// or at a token the draft is unsure of (below draft_p_min).
//
// Drafts are the draft's argmax, so the target's verification (speculative.h)
// keeps exactly the tokens a plain decode would have sampled: the draft model
// changes the speed, never the output.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/result.h"
#include "engine/model_runner.h"
#include "kv/kv_cache_manager.h"
#include "model/model.h"

namespace inferd {

struct DraftProposerConfig {
  int32_t block_size = 16;
  int32_t n_blocks = 0;               // the draft's KV blocks (the null block included)
  int64_t max_batch_tokens = 2048;    // tokens per catch-up pass at most
  double p_min = 0.75;                // see SpeculativeConfig::draft_p_min
  bool enable_prefix_caching = true;  // requests sharing a prompt prefix share draft KV too
  bool warm_up = true;
};

// What one request asks of the proposer.
struct DraftInput {
  const std::string* request_id;
  std::span<const int32_t> tokens;  // prompt and output so far, all verified
  int32_t max_drafts = 0;
  uint64_t cache_key = 0;  // the request's prefix-cache key (its cache salt's hash)
};

// Why a draft model cannot draft for a target, or an empty string: the same
// tokenizer kind, BOS and EOS ids, vocabularies at most 128 tokens apart in size
// and every token's text equal from id 5 on (llama.cpp's check).
std::string draft_vocabulary_mismatch(const Tokenizer& target, const Tokenizer& draft);

class DraftModelProposer {
 public:
  // Takes the loaded draft model; fails naming the problem for a draft that
  // cannot generate, whose vocabulary does not match the target's, or whose
  // KV budget is too small.
  static Result<std::unique_ptr<DraftModelProposer>> create(const Model& target, std::unique_ptr<Model> draft,
                                                            const DraftProposerConfig& config);

  // drafts[i] for inputs[i]: at most max_drafts tokens, fewer where the draft
  // is unsure, none where its cache has no room.
  std::vector<std::vector<int32_t>> propose(std::span<const DraftInput> inputs);

  // Drops what is kept for a request (its draft KV blocks). No-op if unknown.
  void forget(const std::string& request_id);

  const Model& model() const { return *model_; }
  std::vector<std::string> sequence_ids() const;  // requests it keeps KV for
  // The draft KV manager's invariants, and every block held by a kept sequence.
  Status check_invariants() const;
  const kv::KVCacheManager& kv_cache() const { return kv_; }
  double forward_seconds() const { return forward_seconds_; }  // in the draft's passes

 private:
  DraftModelProposer(std::unique_ptr<Model> draft, std::unique_ptr<ModelRunner> runner,
                     const DraftProposerConfig& config, const kv::KVCacheConfig& kv_config);

  // One request's progress in a propose() call.
  struct Work {
    const DraftInput* input;
    std::vector<int32_t>* cached;  // tokens whose keys/values the draft holds, in order
    int64_t fed = 0;               // of input->tokens, in the cache after this call's passes
    std::vector<int32_t> drafts;
    bool drafting = true;
  };
  // Slots for the request's tokens and drafts; false if the cache is full
  // even after dropping the sequences no input of this call uses.
  bool reserve(Work& w, std::span<const DraftInput> inputs);
  // Runs one pass over `out`; returns its logits rows.
  std::vector<float>& run(SchedulerOutput& out);
  // Takes row `logits` as the request's next draft if the draft is sure enough.
  void take_draft(Work& w, const float* logits);

  std::unique_ptr<Model> model_;
  std::unique_ptr<ModelRunner> runner_;
  DraftProposerConfig config_;
  kv::KVCacheManager kv_;
  std::unordered_map<std::string, std::vector<int32_t>> seqs_;  // per request: its cached tokens
  int32_t n_target_vocab_ = 0;
  int64_t steps_ = 0;
  double forward_seconds_ = 0.0;
};

}  // namespace inferd
