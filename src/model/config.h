// Hyper-parameters of a decoder-only transformer, read from GGUF metadata
// through the table of architectures (model/architecture.h), with what
// differs between layers spelled out per layer.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/result.h"
#include "gguf/gguf.h"
#include "model/architecture.h"

namespace inferd {

// One set of rotary angles: theta_i = pos * base^(-2i / rope_dim) / factor_i * scale.
struct RopeConfig {
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;    // linear scaling: 1 / rope.scaling.factor
  bool freq_factors = false;  // divide by the per-dimension factors of rope_freqs.weight (Llama 3)
  // YaRN (ext_factor != 0): dimensions below corr_dims[0] keep the
  // unscaled angle, those above corr_dims[1] the scaled one, a linear ramp
  // between; cos and sin are multiplied by mscale. GGML's rope_yarn.
  float ext_factor = 0.0f;
  float attn_factor = 1.0f;  // llama.cpp's yarn_attn_factor, as its context computes it
  float corr_dims[2] = {0.0f, 0.0f};
};

// What differs between layers.
struct LayerConfig {
  int64_t sliding_window = 0;  // attend to the last this-many positions (the token's own included); 0: all
  int rope = 0;                // index into ModelConfig::ropes
  FfnKind ffn = FfnKind::kDense;
  // A Gated DeltaNet or Mamba-2 layer (ModelConfig::delta_net, mamba2) in
  // place of attention: no KV cache, a fixed state per sequence.
  bool recurrent = false;
  // A layer of one branch (ArchitectureTraits::mamba2_single_branch_layers):
  // only the FFN (no KV cache, no state), or no FFN after its attention or
  // recurrent mixer.
  bool ffn_only = false;
  bool no_ffn = false;
  // Whether the layer keeps keys and values per token (joins a KV group).
  bool keeps_kv() const { return !recurrent && !ffn_only; }
};

// A mixture-of-experts FFN's hyper-parameters (llama.cpp's build_moe_ffn).
struct MoeConfig {
  int64_t n_expert = 0;       // experts per layer
  int64_t n_expert_used = 0;  // chosen per token
  int64_t n_ff_exp = 0;       // each expert's hidden width
  ExpertGating gating = ExpertGating::kSoftmax;
  bool normalize_weights = false;  // chosen weights divided by their sum
  float weights_scale = 0.0f;      // chosen weights times this (0 or 1: left as they are)
  int64_t n_leading_dense = 0;     // the first this-many layers have a dense FFN
  bool selection_bias = false;     // exp_probs_b.bias per MoE layer (MoeTraits)
  int64_t n_expert_shared = 0;     // shared experts (one MLP n_ff_exp times this wide); 0: none
  int64_t n_ff_shared = 0;         // the shared MLP's width where the file gives it (else as above)
  bool gated_shared_expert = false;  // its output times sigmoid(ffn_gate_inp_shexp . x) (MoeTraits)
  int64_t shared_width() const { return n_ff_shared > 0 ? n_ff_shared : n_ff_exp * n_expert_shared; }
};

// Multi-head latent attention (DeepSeek V2/V3, llama.cpp's MLA with the
// attn_k_b/attn_v_b split): each token's keys and values are one latent of
// kv_lora_rank (attn_kv_a_mqa, then attn_kv_a_norm) plus one RoPE key of
// qk_rope dims shared by every head, which is all the cache keeps; a head's
// key is its qk_nope dims expanded from the latent (attn_k_b) and the RoPE key,
// its value v_head dims expanded from the latent (attn_v_b).
struct MlaConfig {
  int64_t q_lora_rank = 0;   // the query's compression (attn_q_a/attn_q_b); 0: attn_q straight from the norm
  int64_t kv_lora_rank = 0;  // 0: not latent attention
  int64_t qk_nope = 0;       // query/key dims per head without RoPE
  int64_t qk_rope = 0;       // with RoPE (ModelConfig::rope_dim)
  int64_t v_head = 0;        // value dims per head
  float yarn_log_mul = 0.0f;  // mscale_all_dim (rope.scaling.yarn_log_multiplier / 0.1), 0: none
  // An older file's attn_kv_b in place of attn_k_b and attn_v_b (split at load).
  bool kv_b_unsplit = false;
  int64_t q_head() const { return qk_nope + qk_rope; }
  // One token's cache slot per layer: the normalized latent, then the RoPE key.
  int64_t latent_width() const { return kv_lora_rank + qk_rope; }
  explicit operator bool() const { return kv_lora_rank > 0; }
};
// A Gated DeltaNet layer's sizes (llama.cpp's ssm_* hyper-parameters of
// qwen35): a short convolution of conv_kernel taps over the concatenated
// queries, keys and values (the conv channels), then the gated delta rule
// with n_k_heads query/key heads and n_v_heads value heads, all of head_size.
struct DeltaNetConfig {
  int64_t conv_kernel = 0;  // ssm.conv_kernel
  int64_t head_size = 0;    // ssm.state_size
  int64_t n_k_heads = 0;    // ssm.group_count
  int64_t n_v_heads = 0;    // ssm.time_step_rank (a multiple of n_k_heads)
  int64_t key_dim() const { return n_k_heads * head_size; }
  int64_t value_dim() const { return n_v_heads * head_size; }  // ssm.inner_size
  int64_t conv_channels() const { return 2 * key_dim() + value_dim(); }
  // One sequence's state in one layer: the convolution's window of the last
  // conv_kernel - 1 inputs, and a head_size x head_size matrix per value head.
  int64_t conv_state_elements() const { return (conv_kernel - 1) * conv_channels(); }
  int64_t recurrent_state_elements() const { return n_v_heads * head_size * head_size; }
  explicit operator bool() const { return conv_kernel > 0; }
};

// A Mamba-2 layer's sizes (llama.cpp's ssm_* hyper-parameters of
// nemotron_h): in_proj (ssm_in) gives per token z (inner), the conv channels
// x, B, C (inner + 2 n_groups d_state) and one time step per head; a causal
// short convolution of conv_kernel taps over the conv channels, SiLU; the
// selective scan of n_heads heads of head_dim() over a d_state-wide state,
// B and C shared by the heads of a group.
struct Mamba2Config {
  int64_t conv_kernel = 0;  // ssm.conv_kernel
  int64_t inner = 0;        // ssm.inner_size
  int64_t d_state = 0;      // ssm.state_size
  int64_t n_heads = 0;      // ssm.time_step_rank
  int64_t n_groups = 0;     // ssm.group_count (divides n_heads and inner)
  int64_t head_dim() const { return inner / n_heads; }
  int64_t conv_channels() const { return inner + 2 * n_groups * d_state; }
  int64_t in_proj_rows() const { return inner + conv_channels() + n_heads; }
  // One sequence's state in one layer: the convolution's window of the last
  // conv_kernel - 1 inputs, and d_state values per inner channel.
  int64_t conv_state_elements() const { return (conv_kernel - 1) * conv_channels(); }
  int64_t recurrent_state_elements() const { return inner * d_state; }
  explicit operator bool() const { return conv_kernel > 0; }
};

// How a sequence's hidden states become one output (llama.cpp's
// llama_pooling_type, `<arch>.pooling_type` in a GGUF, same numbering).
enum class PoolingType : int { kNone = 0, kMean = 1, kCls = 2, kLast = 3, kRank = 4 };
// "none", "mean", "cls", "last", "rank".
const char* pooling_name(PoolingType p);

struct ModelConfig {
  std::string architecture;  // "llama", "gemma3", ...
  std::string name;          // general.name, for display
  // The architecture's row, or null when inferd cannot run it (the model still
  // loads for `info` and tokenizing).
  const ArchitectureTraits* traits = nullptr;
  int64_t n_layer = 0;       // the layers the model runs
  int64_t n_layer_nextn = 0;  // NextN blocks after them in the file, not run (ArchitectureTraits::nextn_layers)
  int64_t n_embd = 0;
  int64_t n_ff = 0;
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;      // key/value length per head (latent attention: the latent cache's slot)
  int64_t n_vocab = 0;
  int64_t context_length = 0;
  int64_t rope_dim = 0;      // dimensions rotated per head (<= head_dim)
  float rope_freq_base = 10000.0f;  // of the global layers
  float rms_eps = 1e-5f;
  RopeStyle rope_style = RopeStyle::kInterleaved;
  Activation activation = Activation::kSwiGLU;
  bool qk_norm = false;
  bool sandwich_norms = false;
  float embedding_scale = 0.0f;  // multiply token embeddings by this (0: leave them)
  float query_scale = 1.0f;      // multiply Q by this after RoPE (1: leave it)
  float kq_scale = 1.0f;         // softmax scale of the attention scores
  int64_t sliding_window = 0;    // the window of the windowed layers (0: none)
  std::vector<RopeConfig> ropes;    // the distinct rotary tables, one or two
  std::vector<LayerConfig> layers;  // n_layer entries
  MoeConfig moe;                    // n_expert 0 for a dense model
  MlaConfig mla;                    // kv_lora_rank 0 unless the layers attend through a latent
  // Gated DeltaNet layers (LayerConfig::recurrent; ArchitectureTraits::
  // gated_delta_net), else empty; then the attention layers' query projection
  // is each head's query followed by its output gate (q_proj_dim()).
  DeltaNetConfig delta_net;
  bool attn_output_gate = false;
  // Mamba-2 layers (LayerConfig::recurrent; ArchitectureTraits::
  // mamba2_single_branch_layers), else empty.
  Mamba2Config mamba2;
  // An embedding or reranking model's pooling (kNone: a generative model's
  // logits), and an encoder's LayerNorm epsilon (`attention.layer_norm_epsilon`).
  PoolingType pooling = PoolingType::kNone;
  float layer_norm_eps = 1e-12f;

  int64_t q_dim() const { return n_head * head_dim; }
  // The query projection's rows: the queries, and each head's gate after its query where there is one.
  int64_t q_proj_dim() const { return attn_output_gate ? 2 * q_dim() : q_dim(); }
  // Whether some layers keep a recurrent state per sequence rather than keys and values per token.
  bool has_recurrent_layers() const { return static_cast<bool>(delta_net) || static_cast<bool>(mamba2); }
  int64_t n_recurrent_layers() const {
    int64_t n = 0;
    for (const LayerConfig& l : layers) n += l.recurrent ? 1 : 0;
    return n;
  }
  // One recurrent layer's state per sequence: its convolution window and its
  // recurrent state (floats), whichever mixer the model's recurrent layers are.
  int64_t conv_state_elements() const {
    return mamba2 ? mamba2.conv_state_elements() : delta_net.conv_state_elements();
  }
  int64_t recurrent_state_elements() const {
    return mamba2 ? mamba2.recurrent_state_elements() : delta_net.recurrent_state_elements();
  }
  // Layers that keep keys and values per token (LayerConfig::keeps_kv).
  int64_t n_kv_layers() const {
    int64_t n = 0;
    for (const LayerConfig& l : layers) n += l.keeps_kv() ? 1 : 0;
    return layers.empty() ? n_layer : n;
  }
  int64_t kv_dim() const { return n_head_kv * head_dim; }
  // The attention output's width, the output projection's input.
  int64_t attn_out_dim() const { return mla ? n_head * mla.v_head : q_dim(); }
  bool can_generate() const { return traits != nullptr; }
  // An encoder (ArchitectureTraits::encoder): pooled outputs only, no tokens.
  bool is_encoder() const { return traits && traits->encoder; }
  // Whether its forward pass returns one pooled vector per sequence instead
  // of logits: an encoder, or a decoder embedding GGUF (e.g. Qwen3-Embedding,
  // qwen3 with last-token pooling), whose final-normed hidden states are pooled
  // and whose LM head is never run. Such a model cannot generate text.
  bool returns_pooled() const { return traits && pooling != PoolingType::kNone; }
  bool can_embed() const { return returns_pooled() && pooling != PoolingType::kRank; }
  bool can_rank() const { return is_encoder() && pooling == PoolingType::kRank; }

  static Result<ModelConfig> from_gguf(const gguf::File& file);
};

}  // namespace inferd
