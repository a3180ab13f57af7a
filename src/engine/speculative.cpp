#include "engine/speculative.h"

#include <algorithm>

namespace inferd {

Status SpeculativeConfig::validate() const {
  if (method == Method::kNone) return {};
  if (num_speculative_tokens < 1 || num_speculative_tokens > 64)
    return make_error("num_speculative_tokens must be between 1 and 64");
  if (method == Method::kDraftModel && draft_model.empty()) return make_error("the draft model's path ('model') is empty");
  if (!(draft_p_min >= 0.0 && draft_p_min <= 1.0)) return make_error("draft_p_min must be between 0 and 1");
  if (draft_vocab_size < 0) return make_error("draft_vocab_size must be >= 0");
  if (prompt_lookup_min < 1) return make_error("prompt_lookup_min must be at least 1");
  if (prompt_lookup_max < prompt_lookup_min)
    return make_error("prompt_lookup_max must be at least prompt_lookup_min");
  if (disable_by_batch_size < 0) return make_error("disable_by_batch_size must be >= 0");
  if (first_draft_tokens < 0) return make_error("first_draft_tokens must be >= 0");
  return {};
}

int32_t NgramProposer::copied(int32_t token) const {
  for (const Substitution& s : substitutions_)
    if (s.from == token) return s.to;
  return token;
}

int64_t NgramProposer::find_latest(std::span<const int32_t> tokens, std::span<const int32_t> pattern,
                                   int64_t limit) const {
  const int64_t n = static_cast<int64_t>(pattern.size());
  for (int64_t s = limit - 1; s >= 0; --s) {
    int64_t i = 0;
    while (i < n && copied(tokens[static_cast<size_t>(s + i)]) == pattern[static_cast<size_t>(i)]) ++i;
    if (i == n) return s;
  }
  return -1;
}

std::vector<int32_t> NgramProposer::drafts_from(std::span<const int32_t> tokens, int64_t from, int32_t k) {
  const int64_t to = std::min<int64_t>(static_cast<int64_t>(tokens.size()), from + k);
  last_from_ = from;
  last_source_.assign(tokens.begin() + from, tokens.begin() + to);
  std::vector<int32_t> drafts(last_source_.size());
  std::transform(last_source_.begin(), last_source_.end(), drafts.begin(), [&](int32_t t) { return copied(t); });
  return drafts;
}

std::vector<int32_t> NgramProposer::propose(std::span<const int32_t> tokens, int64_t num_prompt_tokens, int32_t k) {
  last_from_ = -1;
  last_source_.clear();
  last_num_prompt_tokens_ = num_prompt_tokens;
  const int64_t len = static_cast<int64_t>(tokens.size());
  if (k < 1 || min_n_ < 1) return {};
  // The longest suffix that occurred earlier. The latest earlier occurrence
  // is the most likely to go on the same way (the text being copied now).
  for (int64_t n = std::min<int64_t>(max_n_, len - 1); n >= min_n_; --n) {
    const int64_t s = find_latest(tokens, tokens.subspan(static_cast<size_t>(len - n)), len - n);
    if (s >= 0) return drafts_from(tokens, s + n, k);
  }
  // Resync: the last j tokens are an edit; the n-gram before them anchors the
  // copy in the prompt, and the last token, found just after the anchor, is
  // where the copy goes on.
  const int32_t last = tokens.empty() ? 0 : tokens.back();
  for (int64_t j = 1; j <= kResyncBack; ++j) {
    for (int64_t n = max_n_; n >= min_n_; --n) {
      if (len - j - n < 0) continue;
      const int64_t s = find_latest(tokens, tokens.subspan(static_cast<size_t>(len - j - n), static_cast<size_t>(n)),
                                    len - j - n);
      if (s < 0) continue;
      const int64_t anchor_end = s + n;
      if (anchor_end >= num_prompt_tokens) return {};
      const int64_t window_end = std::min(anchor_end + j + kResyncWindow, len - j);
      for (int64_t r = anchor_end; r < window_end; ++r)
        if (copied(tokens[static_cast<size_t>(r)]) == last) return drafts_from(tokens, r + 1, k);
      return {};
    }
  }
  return {};
}

void NgramProposer::verified(int64_t accepted, int32_t target_token) {
  if (last_from_ < 0 || accepted < 0 || accepted >= static_cast<int64_t>(last_source_.size())) return;
  const int32_t source = last_source_[static_cast<size_t>(accepted)];
  const int32_t drafted = copied(source);
  const int64_t position = last_from_ + accepted;  // of the rejected draft's source
  last_from_ = -1;
  if (drafted != source) {
    // A substituted draft was rejected: the rename does not hold here.
    std::erase_if(substitutions_, [&](const Substitution& s) { return s.from == source; });
    std::erase_if(candidates_, [&](const auto& c) { return c.first.from == source && c.first.to == drafted; });
    return;
  }
  if (target_token == source || position >= last_num_prompt_tokens_) return;
  auto it = std::find_if(candidates_.begin(), candidates_.end(),
                         [&](const auto& c) { return c.first.from == source && c.first.to == target_token; });
  if (it == candidates_.end()) {
    if (candidates_.size() >= kMaxCandidates) candidates_.clear();
    candidates_.push_back({{source, target_token}, 0});
    it = candidates_.end() - 1;
  }
  if (++it->second == kConfirmations) {
    std::erase_if(substitutions_, [&](const Substitution& s) { return s.from == source; });
    substitutions_.push_back(it->first);
  }
}

int32_t DraftLength::next() {
  if (pause_left_ > 0 && --pause_left_ > 0) return 0;
  if (len_ == 0) len_ = 1;  // the pause is over: a probe
  return len_;
}

void DraftLength::verified(int64_t accepted, int64_t drafted) {
  if (accepted == drafted) {
    len_ = std::min(k_, len_ * 2);
    pause_ = 0;
  } else if (accepted > 0) {
    len_ = static_cast<int32_t>(std::min<int64_t>(k_, accepted + 1));
    pause_ = 0;
  } else if ((len_ /= 2) == 0) {
    pause_ = pause_ == 0 ? 4 : std::min(64, pause_ * 2);
    pause_left_ = pause_;
  }
}

}  // namespace inferd
