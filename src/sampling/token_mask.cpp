#include "sampling/token_mask.h"

#include <algorithm>
#include <bit>
#include <limits>

namespace inferd {

int64_t apply_token_mask(std::span<const uint32_t> mask, int32_t mask_vocab, float* logits, int64_t n_logits) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const int64_t n = std::min<int64_t>(std::min<int64_t>(mask_vocab, n_logits), static_cast<int64_t>(mask.size()) * 32);
  int64_t allowed = 0;
  for (int64_t i = 0; i < n; i += 32) {
    const int64_t width = std::min<int64_t>(32, n - i);
    const uint32_t word = mask[i / 32] & (width == 32 ? ~0u : (1u << width) - 1u);
    float* row = logits + i;
    const int ones = std::popcount(word);
    allowed += ones;
    if (ones == width) continue;  // all allowed: most words inside a JSON string
    // Few allowed (most words elsewhere): keep them aside, fill, put them back.
    // Many allowed: clear the others one by one. Either way the work is the
    // smaller of the two bit counts, and whole-word fills vectorize.
    if (ones <= 16) {
      float kept[32];
      int k = 0;
      for (uint32_t w = word; w; w &= w - 1) kept[k++] = row[std::countr_zero(w)];
      std::fill(row, row + width, kNegInf);
      k = 0;
      for (uint32_t w = word; w; w &= w - 1) row[std::countr_zero(w)] = kept[k++];
    } else {
      const uint32_t valid = width == 32 ? ~0u : (1u << width) - 1u;
      for (uint32_t w = ~word & valid; w; w &= w - 1) row[std::countr_zero(w)] = kNegInf;
    }
  }
  for (int64_t j = std::max<int64_t>(n, 0); j < n_logits; ++j) logits[j] = kNegInf;
  return allowed;
}

}  // namespace inferd
