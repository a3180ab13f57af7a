#include "engine/beam_search.h"

#include <algorithm>
#include <cmath>

namespace inferd {

Status BeamSearchParams::validate() const {
  if (beam_width < 1) return make_error("the beam width must be at least 1");
  if (!std::isfinite(length_penalty)) return make_error("length_penalty must be a finite number");
  return {};
}

double beam_search_score(double cumulative_logprob, int64_t length, double length_penalty) {
  return cumulative_logprob / std::pow(static_cast<double>(length), length_penalty);
}

BeamSearch::BeamSearch(const BeamSearchParams& params, int64_t prompt_len, int64_t max_tokens)
    : params_(params), prompt_len_(prompt_len), max_tokens_(max_tokens), live_(1) {}

void BeamSearch::add_finished(Beam beam) {
  // After every beam of at least its score: earlier finishers win ties.
  auto at = std::upper_bound(finished_.begin(), finished_.end(), beam.score,
                             [](double score, const Beam& b) { return score > b.score; });
  if (at - finished_.begin() >= params_.beam_width) return;
  finished_.insert(at, std::move(beam));
  if (static_cast<int32_t>(finished_.size()) > params_.beam_width) finished_.pop_back();
}

bool BeamSearch::can_stop(double best_live_cumulative, int64_t live_length) const {
  if (static_cast<int32_t>(finished_.size()) < params_.beam_width) return false;
  const double worst_finished = finished_.back().score;
  int64_t length = live_length;
  switch (params_.early_stopping) {
    case EarlyStopping::kTrue:
      return true;
    case EarlyStopping::kFalse:
      break;  // the heuristic: the best live beam as it is now
    case EarlyStopping::kNever:
      // A cumulative logprob only falls; with a positive penalty a longer beam
      // divides it by more, so its best score is at the longest length it can
      // reach (vLLM v0 bounds that by max(prompt + max_tokens, max_model_len);
      // no beam here outgrows prompt + max_tokens). Otherwise, at its length now.
      if (params_.length_penalty > 0.0f) length = prompt_len_ + max_tokens_;
      break;
  }
  return worst_finished >= beam_search_score(best_live_cumulative, length, params_.length_penalty);
}

std::vector<BeamChild> BeamSearch::step(std::span<const std::vector<TokenLogprob>> candidates,
                                        const std::function<BeamEnd(int32_t beam, int32_t token)>& ends) {
  if (done_ || candidates.size() != live_.size()) return {};
  struct Candidate {
    double cumulative;
    int32_t parent, token;
  };
  std::vector<Candidate> all;
  for (size_t i = 0; i < candidates.size(); ++i)
    for (const TokenLogprob& t : candidates[i])
      all.push_back({live_[i].cumulative_logprob + t.logprob, static_cast<int32_t>(i), t.token});
  // Stable: equal scores keep the order of the beams, then of their tokens.
  std::stable_sort(all.begin(), all.end(),
                   [](const Candidate& a, const Candidate& b) { return a.cumulative > b.cumulative; });

  const int64_t length = static_cast<int64_t>(live_.empty() ? 0 : live_[0].token_ids.size()) + 1;
  std::vector<BeamChild> children;
  std::vector<Beam> next;
  for (const Candidate& c : all) {
    BeamEnd end = ends(c.parent, c.token);
    if (end == BeamEnd::kNone && length >= max_tokens_) end = BeamEnd::kLength;
    if (end == BeamEnd::kNone && static_cast<int32_t>(children.size()) == params_.beam_width) continue;
    Beam beam;
    beam.token_ids = live_[c.parent].token_ids;
    beam.token_ids.push_back(c.token);
    beam.cumulative_logprob = c.cumulative;
    beam.end = end;
    if (end == BeamEnd::kNone) {
      children.push_back({c.parent, c.token});
      next.push_back(std::move(beam));
    } else {
      // The stop token itself is not counted in the score's length.
      const int64_t scored_length = prompt_len_ + length - (end == BeamEnd::kStopToken ? 1 : 0);
      beam.score = beam_search_score(c.cumulative, scored_length, params_.length_penalty);
      add_finished(std::move(beam));
    }
  }
  live_ = std::move(next);
  if (live_.empty() || can_stop(live_[0].cumulative_logprob, prompt_len_ + length)) {
    done_ = true;
    live_.clear();
    return {};
  }
  return children;
}

}  // namespace inferd
