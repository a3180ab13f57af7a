// Beam search (vLLM's use_beam_search) as pure bookkeeping: which beams live,
// which finished, how they score, when the search ends. No model and no KV
// cache: the engine runs each live beam as a scheduler request, gives this
// class every live beam's candidates once per step, and forks or drops the
// requests as the step's result says (engine.cpp; docs/design.md, "Beam
// search").
//
// One step, given each live beam's 2 * beam_width most likely next tokens by
// the log-softmax of its raw logits (vLLM's beam search asks the engine for
// 2 * beam_width logprobs per beam and step):
//  - each candidate (beam, token) scores the beam's cumulative logprob plus
//    the token's;
//  - a candidate that ends its beam (a stop token, a stop string, max_tokens)
//    joins the finished beams, whichever its rank; the beam_width best of
//    those by score are kept (no others can be returned);
//  - of the other candidates, the beam_width best by cumulative logprob live
//    on (one step's candidates all have the same length, so that is also the
//    order of their scores); ties keep the order of the beams, then of the
//    tokens (most likely first, lower id on equal logits);
//  - the search ends when no beam lives on, or when `early_stopping` says no
//    live beam can beat the beam_width finished ones any more (Hugging Face's
//    and vLLM v0's true / false / "never").
// The result is the finished beams, best score first.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "core/result.h"
#include "sampling/sampler.h"

namespace inferd {

// When the search may stop before every beam has ended (HF's early_stopping).
enum class EarlyStopping {
  kFalse,  // when the best live beam, scored at its current length, cannot beat the worst kept finished one
  kTrue,   // as soon as beam_width beams have finished
  kNever,  // only when no live beam can beat them at any length it may still reach (exact)
};

struct BeamSearchParams {
  int32_t beam_width = 1;      // beams kept, and beams returned
  float length_penalty = 1.0f;  // > 0 favours longer beams, < 0 shorter ones
  EarlyStopping early_stopping = EarlyStopping::kFalse;

  Status validate() const;  // error naming the first bad field
};

// vLLM's get_beam_search_score (vllm/beam_search.py): cumulative logprob /
// length ^ length_penalty, where the length counts the prompt too (vLLM's
// sequences hold prompt and output tokens) but not a stop token that ended the
// beam (as Hugging Face, which does not count EOS).
double beam_search_score(double cumulative_logprob, int64_t length, double length_penalty);

// How appending a token ends a beam (kNone: it lives on).
enum class BeamEnd { kNone, kStopToken, kStopString, kLength };

struct Beam {
  std::vector<int32_t> token_ids;  // output tokens (a stop token that ended it included)
  double cumulative_logprob = 0.0;
  BeamEnd end = BeamEnd::kNone;  // finished beams: why
  double score = 0.0;            // finished beams: beam_search_score
};

// A live beam of the next step: live beam `parent` of this step followed by `token`.
struct BeamChild {
  int32_t parent = 0;
  int32_t token = 0;
};

class BeamSearch {
 public:
  // max_tokens: output tokens at most (a beam that reaches it ends with kLength).
  BeamSearch(const BeamSearchParams& params, int64_t prompt_len, int64_t max_tokens);

  // The beams that live, in order (the first step has one, with no tokens).
  const std::vector<Beam>& live() const { return live_; }
  // The finished beams kept, best score first (at most beam_width).
  const std::vector<Beam>& finished() const { return finished_; }
  bool done() const { return done_; }
  // How many candidates a step wants per live beam.
  int32_t candidates_per_beam() const { return 2 * params_.beam_width; }
  const BeamSearchParams& params() const { return params_; }

  // One step. candidates[i]: live beam i's most likely next tokens with their
  // logprobs, most likely first. ends(i, token): kStopToken or kStopString if
  // that token would end beam i (the length limit is this class's), else
  // kNone. Returns the next step's live beams (empty once done()), best first.
  std::vector<BeamChild> step(std::span<const std::vector<TokenLogprob>> candidates,
                              const std::function<BeamEnd(int32_t beam, int32_t token)>& ends);

 private:
  void add_finished(Beam beam);
  bool can_stop(double best_live_cumulative, int64_t live_length) const;

  BeamSearchParams params_;
  int64_t prompt_len_, max_tokens_;
  std::vector<Beam> live_, finished_;
  bool done_ = false;
};

}  // namespace inferd
