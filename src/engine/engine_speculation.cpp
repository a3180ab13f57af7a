// Speculative decoding, a client of the engine's step loop: drafts ride on
// the scheduled request (Scheduler::set_draft_tokens), the sampling stage
// accepts 1..k+1 tokens of a verification, and update() rolls back the
// rejected ones by moving num_computed_tokens. Here: what a proposer learns
// from a verification, and the next drafts of the requests that go on.
#include "engine/engine.h"

namespace inferd {

void Engine::drafts_verified(Live& live, int64_t num_drafts, const std::vector<int32_t>& tokens) {
  const int64_t accepted = static_cast<int64_t>(tokens.size()) - 1;
  if (live.draft_length) live.draft_length->verified(accepted, num_drafts);
  if (live.ngram) live.ngram->verified(accepted, tokens.back());
  live.metrics.speculative.record(num_drafts, accepted);
  spec_stats_.record(num_drafts, accepted);
}

void Engine::propose_drafts(const std::vector<RequestUpdate>& updates) {
  const SpeculativeConfig& spec = config_.speculative;
  if (!spec.enabled()) return;
  if (spec.disable_by_batch_size > 0 && scheduler_.num_running() >= spec.disable_by_batch_size) return;
  std::vector<DraftInput> inputs;
  for (const RequestUpdate& u : updates) {
    const Request* r = scheduler_.find(u.request_id);
    if (!r || r->status != RequestStatus::kRunning) continue;
    auto it = live_.find(u.request_id);
    // A grammar's mask follows each token, a beam search picks each beam's
    // token itself: no drafts for either.
    if (it == live_.end() || it->second.matcher || it->second.beams) continue;
    Live& live = it->second;
    if (!live.draft_length) live.draft_length.emplace(spec.num_speculative_tokens, spec.first_drafts());
    const int32_t n = live.draft_length->next();
    if (n == 0) continue;  // paused
    inputs.push_back({&r->id, r->all_token_ids, n, r->cache_key});
  }
  if (inputs.empty()) return;
  if (drafter_) {
    // Every request's drafts in the same batched passes of the draft model.
    std::vector<std::vector<int32_t>> drafts = drafter_->propose(inputs);
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (!drafts[i].empty()) {
        scheduler_.set_draft_tokens(*inputs[i].request_id, std::move(drafts[i]));
      } else {
        // The draft was unsure of its first token: its pass bought nothing,
        // so back off as after a verification that accepted none (the
        // n-gram proposer's empty proposal costs nothing and does not).
        live_.at(*inputs[i].request_id).draft_length->verified(0, inputs[i].max_drafts);
      }
    }
    return;
  }
  for (const DraftInput& in : inputs) {
    Live& live = live_.at(*in.request_id);
    if (!live.ngram) live.ngram.emplace(spec.prompt_lookup_min, spec.prompt_lookup_max);
    const int64_t num_prompt_tokens = static_cast<int64_t>(scheduler_.find(*in.request_id)->prompt_token_ids.size());
    std::vector<int32_t> drafts = live.ngram->propose(in.tokens, num_prompt_tokens, in.max_drafts);
    if (!drafts.empty()) scheduler_.set_draft_tokens(*in.request_id, std::move(drafts));
  }
}

}  // namespace inferd
