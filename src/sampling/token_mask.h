// An allowed-token mask (structured outputs): one bit per token id, bit
// i % 32 of word i / 32, as llguidance computes it. Applied to a row of logits
// before the sampler, so every sampling parameter sees the allowed tokens only.
#pragma once
#include <cstdint>
#include <span>

namespace inferd {

// Sets logits[i] = -inf for every token the mask does not allow, including
// every id at or past `mask_vocab` (a model may have more logits than its
// tokenizer has tokens). Returns how many tokens stay allowed. No allocation.
int64_t apply_token_mask(std::span<const uint32_t> mask, int32_t mask_vocab, float* logits, int64_t n_logits);

inline bool token_allowed(std::span<const uint32_t> mask, int32_t token) {
  return token >= 0 && static_cast<size_t>(token) / 32 < mask.size() &&
         (mask[static_cast<size_t>(token) / 32] >> (token % 32) & 1u);
}

}  // namespace inferd
