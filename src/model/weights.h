// Views of a model's weight tensors inside the memory-mapped GGUF file
// (backend-neutral: executors repack or upload them as they need).
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/result.h"
#include "gguf/gguf.h"
#include "model/config.h"
#include "model/layer_program.h"

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
  // The selection bias (exp_probs_b.bias, n_expert), else empty.
  WeightView selection_bias;
  // The shared expert's gated MLP (MoeFfnPhase::shared_expert), else empty.
  WeightView gate_shexp, up_shexp, down_shexp;
  // Its gate (ffn_gate_inp_shexp: one row of n_embd; MoeFfnPhase::shared_expert_gate), else empty.
  WeightView gate_inp_shexp;
  explicit operator bool() const { return static_cast<bool>(router); }
};

// Latent attention's weights (MlaQkvPhase, MlaAttentionPhase), else empty:
// the query's projection (q) or its compression (q_a, q_a_norm, q_b); the
// compressed KV's (kv_a: latent then RoPE key) and its latent's norm; per
// head, k_b (kv_lora_rank rows of qk_nope: a head's no-RoPE query into the
// latent space) and v_b (v_head rows of kv_lora_rank: the latent out to the
// head's value), as stacks of one matrix per head.
struct MlaWeights {
  WeightView q, q_a, q_a_norm, q_b, kv_a, kv_a_norm;
  ExpertsView k_b, v_b;
  explicit operator bool() const { return static_cast<bool>(kv_a); }
};

// A Gated DeltaNet layer's weights (DeltaNetPhase), else empty: the
// projections of the norm's output (qkv: the conv channels; z: the output
// gate; beta and alpha: one row per value head), the convolution's kernel (F32,
// GGML shape [taps, channels]), the decay's bias (ssm_dt.bias) and scale
// (ssm_a, -exp(A_log)), the per-head output norm and the output projection.
struct DeltaNetWeights {
  WeightView qkv, z, beta, alpha, conv, dt_bias, a, norm, out;
  explicit operator bool() const { return static_cast<bool>(qkv); }
};

// A Mamba-2 layer's weights (Mamba2Phase), else empty: the input projection
// (in: z, the conv channels, the time steps), the convolution's kernel (F32,
// GGML shape [taps, channels]) and its bias where the file has one, the time
// steps' bias, the decays (ssm_a, -exp(A_log)) and skip weights (ssm_d), one
// per head; the grouped output norm (inner / n_groups per group) and the
// output projection.
struct Mamba2Weights {
  WeightView in, conv, conv_b, dt_bias, a, d, norm, out;
  explicit operator bool() const { return static_cast<bool>(in); }
};

// A layer's projections (the phases of its program that read them, model/
// layer_program.h): Q, K, V (QkvPhase), O (OutputPhase), and a dense FFN's
// gate, up and down (DenseFfnPhase). A mixture-of-experts layer has the first
// four only; its router and experts are MoeWeights.
enum class Projection : int { kQ, kK, kV, kO, kGate, kUp, kDown };
constexpr int kNumProjections = 7;
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
  MlaWeights mla;                             // latent attention, else empty (no Q/K/V projections then)
  DeltaNetWeights delta_net;                  // a Gated DeltaNet layer's, else empty (no attention then)
  Mamba2Weights mamba2;                       // a Mamba-2 layer's, else empty (no attention then)
  // An encoder's: its LayerNorms' biases (LayerNormPhase; the weights are
  // attn_norm and ffn_norm) and its plain MLP's biases (PlainFfnPhase).
  WeightView attn_norm_b, ffn_norm_b, b_up, b_down;
  const WeightView& operator[](Projection p) const { return proj[static_cast<int>(p)]; }
};

struct ModelWeights {
  WeightView tok_embd;
  WeightView output_norm;
  WeightView output;  // == tok_embd when embeddings are tied
  bool tied_embeddings = false;
  WeightView rope_freqs;  // Llama 3's per-dimension RoPE factors, else empty
  std::vector<LayerWeights> layers;
  // An encoder's (ModelConfig::is_encoder; it has no output norm nor output):
  // learned absolute positions, token-type rows (row 0 is added to every
  // token, as llama.cpp does), the embeddings' LayerNorm; with rank pooling
  // the classification head: cls (n_embd -> n_embd, then tanh) where the
  // file has it, and cls.output (-> the scores).
  WeightView position_embd, token_types, token_embd_norm, token_embd_norm_b;
  WeightView cls, cls_b, cls_out, cls_out_b;
  // Weights derived at load rather than read from the file (an older
  // deepseek2 file's attn_kv_b split: model/mla_kv_b_split.h); views above
  // point into them. Shared, so a copy of these weights keeps them alive.
  std::vector<std::shared_ptr<const std::vector<std::byte>>> derived;

  // Finds every tensor the layers' programs read and checks its type and
  // shape; the error names the offending tensor.
  static Result<ModelWeights> from_gguf(const gguf::File& file, const ModelConfig& config,
                                        const std::vector<LayerProgram>& programs);
  // The same with the programs built from config (inferd info).
  static Result<ModelWeights> from_gguf(const gguf::File& file, const ModelConfig& config);
};

}  // namespace inferd
