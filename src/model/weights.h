// Views of a model's weight tensors inside the memory-mapped GGUF file
// (backend-neutral: executors repack or upload them as they need).
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <utility>
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

// A stack of equally shaped matrices, one per expert (a 3-D GGUF tensor of
// GGML shape [cols, rows, n_expert]): expert e's rows follow expert e-1's.
struct ExpertsView {
  DType dtype = DType::F32;
  const void* data = nullptr;
  int64_t cols = 0;
  int64_t rows = 0;
  int64_t n_expert = 0;
  explicit operator bool() const { return data != nullptr; }
  // Expert e's matrix.
  WeightView expert(int64_t e) const {
    const size_t bytes = row_bytes(dtype, cols) * static_cast<size_t>(rows);
    return WeightView{dtype, static_cast<const uint8_t*>(data) + bytes * static_cast<size_t>(e), cols, rows};
  }
};

// A mixture-of-experts FFN's weights: the router (n_expert rows of n_embd,
// F32 in the common files) and each expert's gated MLP.
struct MoeWeights {
  WeightView router;  // ffn_gate_inp
  ExpertsView gate, up, down;
  // Biases (gpt-oss), else empty: the router's (n_expert), and each expert's
  // gate, up and down outputs' (row e is expert e's).
  WeightView router_bias, gate_bias, up_bias, down_bias;
  explicit operator bool() const { return static_cast<bool>(router); }
};

// The layer plan: a layer's projections in the order a forward pass reads
// them. Loading, the CPU executor's weight prefetch and its forward pass all
// walk this one list, so a projection cannot be in one and missing in another.
// A layer with a mixture-of-experts FFN has the attention projections only
// (ffn_projection() says which are the FFN's); its experts are MoeWeights.
enum class Projection : int { kQ, kK, kV, kO, kGate, kUp, kDown };
constexpr int kNumProjections = 7;
struct ProjectionSpec {
  Projection id;
  const char* tensor;  // GGUF name after "blk.N."
};
constexpr ProjectionSpec kLayerPlan[kNumProjections] = {
    {Projection::kQ, "attn_q.weight"},      {Projection::kK, "attn_k.weight"},
    {Projection::kV, "attn_v.weight"},      {Projection::kO, "attn_output.weight"},
    {Projection::kGate, "ffn_gate.weight"}, {Projection::kUp, "ffn_up.weight"},
    {Projection::kDown, "ffn_down.weight"},
};
constexpr bool ffn_projection(Projection p) {
  return p == Projection::kGate || p == Projection::kUp || p == Projection::kDown;
}
// Whether layer `layer` of a model has projection p (dense FFN projections
// only in dense-FFN layers).
bool layer_has(Projection p, const ModelConfig& c, int64_t layer);
// {input columns, output rows} of a projection.
std::pair<int64_t, int64_t> projection_shape(Projection p, const ModelConfig& c);

struct LayerWeights {
  std::array<WeightView, kNumProjections> proj;
  WeightView attn_norm, ffn_norm;
  WeightView bq, bk, bv;                      // QKV biases (qwen2), else empty
  WeightView bo;                              // the output projection's bias (gpt-oss), else empty
  WeightView attn_sinks;                      // per query head (gpt-oss), else empty
  WeightView q_norm, k_norm;                  // per-head norms (qwen3, gemma3), else empty
  WeightView post_attn_norm, post_ffn_norm;   // sandwich norms (gemma), else empty
  MoeWeights moe;                             // a mixture-of-experts FFN, else empty
  const WeightView& operator[](Projection p) const { return proj[static_cast<int>(p)]; }
};

struct ModelWeights {
  WeightView tok_embd;
  WeightView output_norm;
  WeightView output;  // == tok_embd when embeddings are tied
  bool tied_embeddings = false;
  WeightView rope_freqs;  // Llama 3's per-dimension RoPE factors, else empty
  std::vector<LayerWeights> layers;

  // Finds every tensor the architecture needs and checks its type and shape;
  // the error names the offending tensor.
  static Result<ModelWeights> from_gguf(const gguf::File& file, const ModelConfig& config);
};

}  // namespace inferd
