// Views of a model's weight tensors inside the memory-mapped GGUF file.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/result.h"
#include "gguf/gguf.h"
#include "model/config.h"

namespace inferd {

// A 2-D (or 1-D) weight: `rows` rows of `cols` elements, GGML layout.
struct WeightView {
  DType dtype = DType::F32;
  const void* data = nullptr;
  int64_t cols = 0;
  int64_t rows = 0;
  explicit operator bool() const { return data != nullptr; }
  const float* f32() const { return static_cast<const float*>(data); }
};

struct LayerWeights {
  WeightView attn_norm, wq, wk, wv, wo;
  WeightView bq, bk, bv;              // optional biases (qwen2)
  WeightView q_norm, k_norm;          // optional per-head norms (gemma3, qwen3)
  WeightView post_attn_norm, post_ffn_norm;  // optional sandwich norms (gemma)
  WeightView ffn_norm, w_gate, w_up, w_down;
};

struct ModelWeights {
  WeightView tok_embd;
  WeightView output_norm;
  WeightView output;  // == tok_embd when embeddings are tied
  bool tied_embeddings = false;
  std::vector<LayerWeights> layers;

  // Finds every tensor the architecture needs and checks its type and shape;
  // the error names the offending tensor.
  static Result<ModelWeights> from_gguf(const gguf::File& file, const ModelConfig& config);
};

}  // namespace inferd
