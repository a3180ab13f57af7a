// A layer of a decoder-only transformer as data: the phases a forward pass
// runs, in order, each with what differs between architectures and layers.
// One builder per layer skeleton turns the model's metadata (ModelConfig and
// its architecture row) into each layer's program; the weight loader (which
// tensors a layer has, and their shapes: model/weights.cpp), the CPU
// executor's weight-prefetch plan and its fused pass (model/cpu_executor.cpp)
// all walk the same program, so a phase cannot be loaded and not run, or run
// and not prefetched.
//
// The residual stream runs through the phases: a norm phase first adds the
// output of the branch before it (through that branch's own norm, where the
// architecture has sandwich norms), then normalizes the stream for the next
// branch, whose last phase leaves its output pending for the next norm.
#pragma once
#include <cstdint>
#include <variant>
#include <vector>

#include "model/config.h"

namespace inferd {

// The residual add of the pending branch output, then an RMSNorm of the
// stream whose result the next phase's projections take as input.
struct NormPhase {
  enum class Branch { kAttention, kFfn } branch;  // the branch it feeds (LayerWeights::attn_norm, ffn_norm)
  const char* weight;                             // the norm's tensor, after "blk.N."
};

// Post-norm (encoders): the residual add of the pending branch output, then a
// LayerNorm (weight and bias) of the stream itself, which is then both the
// residual and the next branch's input.
struct LayerNormPhase {
  NormPhase::Branch after;  // the branch it closes (LayerWeights::attn_norm(_b), ffn_norm(_b))
  const char* weight;       // tensors after "blk.N."
  const char* bias;
};

// The Q, K and V projections, with their biases where the file has them
// (required_bias: this architecture's files always do), the per-head
// RMSNorm of Q and K, RoPE of table `rope` in `rope_style`, Q times
// query_scale; the keys and values go to the cache.
struct QkvPhase {
  bool required_bias;
  bool qk_norm;
  int rope;  // index into ModelConfig::ropes; kNoRope: positions are in the embeddings (encoders)
  static constexpr int kNoRope = -1;
  RopeStyle rope_style;
  float query_scale;  // 1: none
  // attn_q holds each head's query then its output gate (ModelConfig::
  // attn_output_gate); the gates, through a sigmoid, wait for the attention phase.
  bool output_gate = false;
};

// Attention over the paged KV cache: every position, or the last `window`
// (the token's own included); with a sink logit per query head
// (attn_sinks.weight) when `sinks`.
struct AttentionPhase {
  int64_t window;  // 0: full attention
  bool sinks;
  float kq_scale;
  bool causal = true;  // false: every token attends to its whole sequence (encoders)
  bool output_gate = false;  // each head's output times its gate's sigmoid (QkvPhase::output_gate)
};

// Multi-head latent attention's projections (ModelConfig::mla): the queries
// (attn_q; or attn_q_a, its RMSNorm attn_q_a_norm, attn_q_b), the compressed
// KV (attn_kv_a_mqa: the latent, RMS-normalized by attn_kv_a_norm, and one
// RoPE key for every head), which go to the latent cache; each head's query
// RoPE'd in its last qk_rope dims and its first qk_nope dims taken into the
// latent space by attn_k_b (llama.cpp's absorbed form): the queries the
// attention phase reads.
struct MlaQkvPhase {
  bool q_lora;  // attn_q_a/attn_q_b (DeepSeek V3) rather than attn_q (V2-Lite)
  int rope;     // index into ModelConfig::ropes
  RopeStyle rope_style;
};

// Attention of every head over the latent cache (one head of latent + RoPE
// key per token; the latent is also the value), each head's output then
// taken out of the latent space by attn_v_b: the output projection's input.
struct MlaAttentionPhase {
  float kq_scale;
};

// The output projection, with its bias where the file has one. With a
// post-branch norm (sandwich norms) the branch output is RMS-normalized by it
// before the residual add.
struct OutputPhase {
  const char* post_norm;  // tensor after "blk.N.", or null
};

// A gated MLP: down(act(gate x) * up x); or, not gated, down(act(up x))
// (nemotron_h's squared ReLU; no ffn_gate).
struct DenseFfnPhase {
  Activation activation;
  const char* post_norm;  // as OutputPhase's
  bool gated = true;
};

// A mixture of experts routed as ModelConfig::moe says: the router (with its
// bias where the file has one), the top k (chosen on the probabilities plus
// exp_probs_b.bias when selection_bias), each chosen expert's gated MLP
// (with per-expert biases where present), the weighted sum; with a shared
// expert, a dense gated MLP of every token (ffn_{gate,up,down}_shexp) whose
// output is added to that sum, as llama.cpp adds it: (routed + shared), then
// the residual.
struct MoeFfnPhase {
  Activation activation;
  const char* post_norm;  // as OutputPhase's
  bool selection_bias = false;
  bool shared_expert = false;
  // The shared expert's output times sigmoid(ffn_gate_inp_shexp . x) per
  // token before the add (qwen35moe).
  bool shared_expert_gate = false;
};

// A plain (non-gated) MLP with biases: down(act(up x + b_up)) + b_down (encoders).
struct PlainFfnPhase {
  Activation activation;
};

// A Gated DeltaNet layer's mixer (ModelConfig::delta_net) in place of
// attention, as llama.cpp's qwen35 graph runs it: from the norm's output the
// projections attn_qkv (queries, keys, values: the conv channels), attn_gate
// (z), ssm_beta and ssm_alpha; the causal short convolution over the
// sequence's window (ssm_conv1d), SiLU; queries and keys L2-normalized per
// head; write strengths sigmoid(beta), decays softplus(alpha + ssm_dt.bias) *
// ssm_a; the gated delta rule over the sequence's recurrent state; each value
// head RMS-normalized (ssm_norm) times silu(z); then ssm_out, whose output is
// the branch's. The state lives in the sequence's state slot (KVCache).
struct DeltaNetPhase {};

// A Mamba-2 layer's mixer (ModelConfig::mamba2) in place of attention, as
// llama.cpp's build_mamba2_layer runs it: from the norm's output one
// projection ssm_in into z, the conv channels (x, B, C) and the time steps;
// the causal short convolution over the sequence's window (ssm_conv1d, plus
// its bias), SiLU; the selective scan over the sequence's state (time steps
// plus ssm_dt.bias, decays ssm_a); y + x * ssm_d per head; y * silu(z); an
// RMSNorm of each group of channels (ssm_norm); then ssm_out, whose output is
// the branch's. The state lives in the sequence's state slot (KVCache), as a
// Gated DeltaNet layer's does.
struct Mamba2Phase {};

using Phase = std::variant<NormPhase, QkvPhase, AttentionPhase, OutputPhase, DenseFfnPhase, MoeFfnPhase, MlaQkvPhase,
                           MlaAttentionPhase, LayerNormPhase, PlainFfnPhase, DeltaNetPhase, Mamba2Phase>;

struct LayerProgram {
  std::vector<Phase> phases;
};

// Every layer's program for a model inferd runs (config.traits set).
std::vector<LayerProgram> build_layer_programs(const ModelConfig& config);

// A phase's name for messages and tests: "norm", "qkv", "attention",
// "output", "dense_ffn", "moe_ffn", "mla_qkv", "mla_attention", "layer_norm",
// "plain_ffn", "delta_net", "mamba2".
const char* phase_name(const Phase& phase);

}  // namespace inferd
