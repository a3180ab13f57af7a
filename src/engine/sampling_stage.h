// The sampling stage: turns a step's logits into what the engine needs of
// them (a few integers per request), where the logits are. The model runner
// runs it right after the forward pass, so the full rows of n_vocab floats
// never leave the executor; a tensor- or pipeline-parallel executor runs it on
// the rank that holds the last logits, a GPU executor on the device, and
// sends back only SampledRequest.
//
// It keeps what sampling needs across steps per request (the seeded random
// stream, the prompt and output for the penalties, the prompt positions
// already scored): the engine registers a request once (add_request) and
// removes it when the scheduler no longer runs it. What changes every step
// and is decided by the engine (a grammar's allowed tokens) comes with the
// step (StepSamplingInputs), as vLLM's structured-output bitmask comes with
// its scheduler output.
//
// Per scheduled request, in the order of its rows (ModelRunner::build_batch):
//  - prompt logprobs for each prompt row (positions scored before a
//    preemption are not scored again);
//  - a sampling request samples its last row; one that verifies drafts
//    samples its rows in order while each sampled token equals the draft it
//    follows (vLLM's rejection sampler, for the exact-match case speculative.h
//    describes), so it returns 1..k+1 tokens;
//  - a beam returns the top candidates (log-softmax of the raw logits) of its
//    row, from which its beam search (a client of the engine) picks;
//  - a pooled request returns its row, which is its embedding or score.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/request_output.h"
#include "engine/scheduler_output.h"
#include "sampling/sampler.h"

namespace inferd {

// What the sampling stage is told of a request once, when it joins.
struct SamplingRequest {
  enum class Kind { kSample, kBeam, kPooled };
  Kind kind = Kind::kSample;
  SamplingParams params;                  // kSample
  std::vector<int32_t> prompt_token_ids;  // the penalties' and prompt logprobs' prompt
  int32_t logprobs = -1;                  // >= 0: each sampled token's logprob and this many alternatives
  int32_t prompt_logprobs = -1;           // >= 0: the same for each prompt token after the first
  int32_t beam_candidates = 0;            // kBeam: candidates returned per row
  // Its rows come masked by a grammar: alternatives the mask removed (-inf)
  // are left out of its logprobs.
  bool constrained = false;
};

// The tokens a request may sample this step (structured output): bit i % 32
// of word i / 32 allows token i (token_mask.h); empty: no constraint.
struct AllowedTokens {
  std::span<const uint32_t> mask;
  int32_t mask_vocab = 0;  // tokens the mask describes; ids past it are not allowed
};

// What the engine decides for a step's sampling, beside the SchedulerOutput.
struct StepSamplingInputs {
  // Per scheduled request (out.scheduled's order), or empty: none constrained.
  std::vector<AllowedTokens> allowed;
};

// What the sampling stage returns for one scheduled request.
struct SampledRequest {
  std::vector<int32_t> tokens;                   // kSample: 1..num_draft_tokens + 1 tokens, if it sampled
  std::vector<SampledLogprobs> logprobs;         // one per token, if asked for
  std::vector<SampledLogprobs> prompt_logprobs;  // prompt tokens scored this step, in order
  std::vector<TokenLogprob> beam_candidates;     // kBeam, if it sampled: most likely first
  std::vector<float> pooled;                     // kPooled, if it sampled: its output row
};

struct ModelRunnerOutput {
  std::vector<SampledRequest> requests;  // per scheduled request, in out.scheduled's order
};

class SamplingStage {
 public:
  // A request's id must not be registered already (remove_request first).
  void add_request(const std::string& id, SamplingRequest request);
  // Forgets a request (no-op for an unknown id).
  void remove_request(const std::string& id);
  bool has_request(const std::string& id) const { return states_.count(id) > 0; }
  size_t num_requests() const { return states_.size(); }

  // Samples a step. `logits` holds the rows ModelRunner::execute computed
  // for `out` (n_vocab each; modified in place). Fills `result`, reusing its
  // storage.
  void sample(const SchedulerOutput& out, const StepSamplingInputs& inputs, float* logits, int64_t n_vocab,
              ModelRunnerOutput& result);

 private:
  struct State {
    explicit State(SamplingRequest r) : request(std::move(r)), sampler(request.params) {}
    SamplingRequest request;
    Sampler sampler;
    // The output so far as the penalties see it: every token this stage
    // sampled (the engine appends them all while the request runs).
    std::vector<int32_t> output;
    int64_t prompt_tokens_scored = 1;  // the first prompt token is never scored
  };
  void score_prompt(State& state, const ScheduledRequest& s, const float* logits, int64_t rows, int64_t n_vocab,
                    std::vector<SampledLogprobs>& scored);
  void sample_tokens(State& state, const ScheduledRequest& s, const AllowedTokens* allowed, float* logits,
                     int64_t n_vocab, SampledRequest& result);

  std::unordered_map<std::string, State> states_;
  std::vector<float> logprob_row_;  // the row before penalties and temperature, for logprobs; reused
};

}  // namespace inferd
