#include "engine/sampling_stage.h"

#include <cassert>
#include <cmath>

#include "engine/model_runner.h"
#include "sampling/token_mask.h"

namespace inferd {

void SamplingStage::add_request(const std::string& id, SamplingRequest request) {
  assert(!states_.count(id));
  states_.emplace(id, State(std::move(request)));
}

void SamplingStage::remove_request(const std::string& id) { states_.erase(id); }

void SamplingStage::sample(const SchedulerOutput& out, const StepSamplingInputs& inputs, float* logits,
                           int64_t n_vocab, ModelRunnerOutput& result) {
  result.requests.resize(out.scheduled.size());
  int64_t row = 0;
  for (size_t i = 0; i < out.scheduled.size(); ++i) {
    const ScheduledRequest& s = out.scheduled[i];
    SampledRequest& r = result.requests[i];
    r.tokens.clear();
    r.logprobs.clear();
    r.prompt_logprobs.clear();
    r.beam_candidates.clear();
    r.pooled.clear();
    const int64_t prompt_rows = ModelRunner::prompt_logit_rows(s);
    if (!s.sample && prompt_rows == 0) continue;
    State& state = states_.at(s.request_id);
    if (prompt_rows > 0) {
      score_prompt(state, s, logits + row * n_vocab, prompt_rows, n_vocab, r.prompt_logprobs);
      row += prompt_rows;
    }
    if (!s.sample) continue;
    float* first = logits + row * n_vocab;
    row += s.num_draft_tokens + 1;
    switch (state.request.kind) {
      case SamplingRequest::Kind::kPooled:
        r.pooled.assign(first, first + n_vocab);
        break;
      case SamplingRequest::Kind::kBeam:
        r.beam_candidates = top_logprobs(first, n_vocab, state.request.beam_candidates);
        break;
      case SamplingRequest::Kind::kSample:
        sample_tokens(state, s, inputs.allowed.empty() ? nullptr : &inputs.allowed[i], first, n_vocab, r);
        break;
    }
  }
}

void SamplingStage::score_prompt(State& state, const ScheduledRequest& s, const float* logits, int64_t rows,
                                 int64_t n_vocab, std::vector<SampledLogprobs>& scored) {
  const std::vector<int32_t>& prompt = state.request.prompt_token_ids;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t target = s.num_computed_tokens + r + 1;  // the prompt token this row scores
    if (target != state.prompt_tokens_scored) continue;     // scored before a preemption
    const float* lg = logits + r * n_vocab;
    SampledLogprobs& lp = scored.emplace_back();
    lp.token = prompt[target];
    lp.logprob = token_logprob(lg, n_vocab, lp.token);
    lp.rank = token_rank(lg, n_vocab, lp.token);
    lp.top = top_logprobs(lg, n_vocab, state.request.prompt_logprobs);
    ++state.prompt_tokens_scored;
  }
}

void SamplingStage::sample_tokens(State& state, const ScheduledRequest& s, const AllowedTokens* allowed,
                                  float* logits, int64_t n_vocab, SampledRequest& result) {
  const SamplingRequest& req = state.request;
  const bool masked = allowed && !allowed->mask.empty();
  assert(!(masked && s.num_draft_tokens > 0));  // requests with a grammar do not speculate
  std::vector<int32_t>& tokens = result.tokens;
  const int32_t* drafts = s.token_ids.data() + (s.num_new_tokens - s.num_draft_tokens);
  for (int64_t j = 0; j <= s.num_draft_tokens; ++j) {
    float* lg = logits + j * n_vocab;
    // Row j follows draft j - 1: used only while every draft so far was accepted.
    if (j > 0 && (static_cast<int64_t>(tokens.size()) != j || tokens.back() != drafts[j - 1])) break;
    // Tokens the grammar does not allow get -inf before anything else sees
    // the row, so every sampling parameter (penalties, temperature, top-k/p,
    // min-p, seed) works on the allowed tokens only.
    if (masked) apply_token_mask(allowed->mask, allowed->mask_vocab, lg, n_vocab);
    // Logprobs describe the model's distribution before the penalties and
    // temperature (which change the row in place, so the values are kept
    // first) but after the grammar's mask: for a structured output they are
    // the constrained distribution, and disallowed tokens never appear among
    // the alternatives.
    if (req.logprobs >= 0) logprob_row_.assign(lg, lg + n_vocab);
    // The penalties see the drafts accepted so far as output, as plain steps would have.
    const int32_t token = state.sampler.sample(lg, n_vocab, req.prompt_token_ids, state.output);
    tokens.push_back(token);
    state.output.push_back(token);
    if (req.logprobs >= 0) {
      SampledLogprobs& lp = result.logprobs.emplace_back();
      lp.token = token;
      lp.logprob = token_logprob(logprob_row_.data(), n_vocab, token);
      lp.rank = token_rank(logprob_row_.data(), n_vocab, token);
      lp.top = top_logprobs(logprob_row_.data(), n_vocab, req.logprobs);
      if (req.constrained)  // fewer tokens may be allowed than alternatives asked for
        std::erase_if(lp.top, [](const TokenLogprob& t) { return std::isinf(t.logprob); });
    }
  }
}

}  // namespace inferd
