// One sequence's hidden-state rows made into one vector, by the GGUF's
// pooling type (ModelConfig::pooling): shared by the encoder's pass and the
// decoder pass of an embedding model. Not normalized: callers that return
// embeddings L2-normalize them (the server, the Python LLM.embed).
#pragma once
#include <cstdint>
#include <vector>

#include "model/config.h"

namespace inferd {

// rows: n_rows x width floats, the sequence's rows in order (n_rows >= 1).
// kMean averages them, kCls takes the first, kLast the last. Rank pooling runs
// a classification head and is the encoder executor's own.
void pool_rows(PoolingType pooling, const float* rows, int64_t n_rows, int64_t width, float* out);

// v / |v| (a zero vector stays zero): how embeddings are returned.
std::vector<float> l2_normalized(std::vector<float> v);

}  // namespace inferd
