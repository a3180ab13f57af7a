#include "kernels/cpu/hadamard.h"

#include <cmath>

namespace inferd::kernels {

void hadamard_rotate(float* x, int64_t n, int64_t chunk) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(chunk));
  for (int64_t c = 0; c < n; c += chunk) {
    float* v = x + c;
    // The fast transform: log2(chunk) rounds of butterflies (a + b, a - b).
    for (int64_t half = 1; half < chunk; half *= 2) {
      for (int64_t i = 0; i < chunk; i += 2 * half) {
        for (int64_t j = i; j < i + half; ++j) {
          const float a = v[j], b = v[j + half];
          v[j] = a + b;
          v[j + half] = a - b;
        }
      }
    }
    for (int64_t i = 0; i < chunk; ++i) v[i] *= scale;
  }
}

}  // namespace inferd::kernels
