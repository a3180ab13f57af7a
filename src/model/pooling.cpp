#include "model/pooling.h"

#include <algorithm>
#include <cassert>
#include <cmath>

namespace inferd {

void pool_rows(PoolingType pooling, const float* rows, int64_t n_rows, int64_t width, float* out) {
  assert(n_rows >= 1);
  switch (pooling) {
    case PoolingType::kMean: {
      std::fill(out, out + width, 0.0f);
      for (int64_t j = 0; j < n_rows; ++j)
        for (int64_t i = 0; i < width; ++i) out[i] += rows[j * width + i];
      const float inv = 1.0f / static_cast<float>(n_rows);
      for (int64_t i = 0; i < width; ++i) out[i] *= inv;
      return;
    }
    case PoolingType::kLast:
      std::copy(rows + (n_rows - 1) * width, rows + n_rows * width, out);
      return;
    case PoolingType::kCls:
    case PoolingType::kNone:  // a model without pooling never gets here (ModelConfig::returns_pooled)
    case PoolingType::kRank:  // the classification head's input: the [CLS] row
      std::copy(rows, rows + width, out);
      return;
  }
}

std::vector<float> l2_normalized(std::vector<float> v) {
  double sum = 0.0;
  for (float x : v) sum += static_cast<double>(x) * x;
  if (sum <= 0.0) return v;
  const float inv = static_cast<float>(1.0 / std::sqrt(sum));
  for (float& x : v) x *= inv;
  return v;
}

}  // namespace inferd
