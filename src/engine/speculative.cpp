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
  return {};
}

std::vector<int32_t> propose_ngram(std::span<const int32_t> tokens, int32_t min_n, int32_t max_n, int32_t k) {
  const int64_t len = static_cast<int64_t>(tokens.size());
  if (k < 1 || min_n < 1) return {};
  for (int64_t n = std::min<int64_t>(max_n, len - 1); n >= min_n; --n) {
    const std::span<const int32_t> suffix = tokens.subspan(len - n);
    // The latest earlier occurrence: it is the most likely to go on the same
    // way (the text being copied or edited now).
    for (int64_t start = len - n - 1; start >= 0; --start) {
      if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + start)) continue;
      const int64_t from = start + n, to = std::min(len, from + k);
      return {tokens.begin() + from, tokens.begin() + to};
    }
  }
  return {};
}

}  // namespace inferd
