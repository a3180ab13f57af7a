// The architectures inferd runs, as data: one row per GGUF
// `general.architecture`. Everything that differs between them (norm
// placement, biases, per-head norms, activation, RoPE style, sliding-window
// layers, embedding scale) is a field here; the forward pass reads the fields
// once per phase and never compares architecture names. A new model of a known
// shape is a row here and a reference test.
#pragma once
#include <string>
#include <string_view>

namespace inferd {

enum class RopeStyle {
  kInterleaved,  // rotate pairs (2i, 2i+1): llama GGUFs (Q/K rows permuted at conversion)
  kNeox,         // rotate pairs (i, i + d/2): qwen2, qwen3, gemma3
};

enum class Activation {
  kSwiGLU,  // silu(gate) * up
  kGeGLU,   // gelu(gate) * up (GELU's tanh approximation, as GGML computes it)
  // gpt-oss's clamped SwiGLU (GGML's swiglu_oai, alpha 1.702, limit 7):
  // min(gate, 7) * sigmoid(1.702 min(gate, 7)) * (clamp(up, -7, 7) + 1)
  kSwiGLUOai,
  // The non-gated FFN of an encoder (PlainFfnPhase): gelu(up) as GGML computes
  // it (kernels::gelu: the tanh approximation through its f16 table), as
  // llama.cpp runs BERT; within 1e-6 cosine of BERT's exact (erf) GELU on
  // all-MiniLM-L6-v2 (model_encoder_reference_test).
  kGelu,
  // The non-gated FFN of nemotron_h (DenseFfnPhase::gated false): relu(up)^2,
  // as llama.cpp's LLM_FFN_RELU_SQR (a relu, then a square: two GGML ops).
  kReluSquared,
};

// The feed-forward block of a layer: one gated MLP, or a mixture of experts
// (a router picks n_expert_used of n_expert gated MLPs per token).
enum class FfnKind { kDense, kMixtureOfExperts };

// How router logits become expert probabilities (llama.cpp's
// llama_expert_gating_func_type).
enum class ExpertGating {
  kSoftmax,  // softmax over all experts, then the top k
  kSigmoid,  // sigmoid of each logit (DeepSeek V3)
  kSoftmaxOfChosen,  // the top k logits, then a softmax over them (gpt-oss)
};

// The mixture-of-experts block of an architecture, as llama.cpp's
// build_moe_ffn takes it.
struct MoeTraits {
  ExpertGating gating = ExpertGating::kSoftmax;
  bool normalize_weights = false;  // divide the chosen experts' weights by their sum
  // The file's `<arch>.expert_gating_func` and `<arch>.expert_weights_norm`
  // override the two above when present (llama.cpp's loader reads them for
  // this architecture; for the others its graph fixes them).
  bool routing_from_file = false;
  // Each MoE layer has a per-expert selection bias (exp_probs_b.bias, added
  // to the probabilities for choosing only: DeepSeek V3, GLM-4.5) and
  // `<arch>.expert_shared_count` shared experts: one dense gated MLP
  // (ffn_{gate,up,down}_shexp, n_ff_exp times that count wide) run for every
  // token, its output added to the routed experts' sum.
  bool selection_bias = false;
  bool shared_experts = false;
  // The selection bias where the file has one (decided by the first MoE
  // layer's exp_probs_b.bias: DeepSeek V3 has it, V2 not).
  bool selection_bias_if_present = false;
  // One shared expert `<arch>.expert_shared_feed_forward_length` wide
  // (feed_forward_length when absent) whose output is scaled per token by
  // sigmoid(ffn_gate_inp_shexp . x) before it joins the routed sum (qwen35moe).
  bool gated_shared_expert = false;
};

struct ArchitectureTraits {
  std::string_view name;
  RopeStyle rope_style;
  Activation activation;
  bool qkv_bias;          // attn_q/k/v.bias are required (qwen2); other rows take them when present
  bool qk_norm;           // per-head RMSNorm of Q and K before RoPE (qwen3, gemma3)
  bool sandwich_norms;    // RMSNorm of the attention and FFN outputs before each residual add (gemma)
  bool scale_embeddings;  // token embeddings times sqrt(n_embd) (gemma)
  bool scale_queries;     // Q times the attention scale before attention, softmax scale 1 (gemma)
  // With `<arch>.attention.sliding_window` set: every n-th layer attends
  // globally and the others within the window (0: every layer within it), and
  // the windowed layers' RoPE base when the file does not give one.
  int sliding_window_pattern;
  float sliding_window_rope_base;
  // The chat template for files of this architecture that carry none (empty: none).
  std::string_view default_chat_template = {};
  // The layers' FFN kind, and for a mixture of experts how it routes (layers
  // before `<arch>.leading_dense_block_count` stay dense).
  FfnKind ffn = FfnKind::kDense;
  MoeTraits moe = {};
  // gpt-oss: every layer's attention has a sink per query head
  // (attn_sinks.weight), and the FFN's norm is stored as post_attention_norm.
  bool attention_sinks = false;
  std::string_view ffn_norm_tensor = "ffn_norm.weight";
  // Per-head Q/K RMSNorms where the file has them (GLM-4.5 355B has them,
  // GLM-4.5-Air not): decided by layer 0's attn_q_norm.weight.
  bool qk_norm_if_present = false;
  // block_count includes `<arch>.nextn_predict_layers` trailing NextN (multi-
  // token prediction) blocks, which the main model does not run (glm4moe).
  bool nextn_layers = false;
  // Multi-head latent attention (deepseek2: ModelConfig::mla), in place of
  // the Q/K/V projections and the per-head KV cache.
  bool latent_attention = false;
  // An encoder (BERT): every token attends to the whole input, learned
  // absolute positions and token types are added to the embeddings (then a
  // LayerNorm), each branch's output is added and then LayerNorm'd (post-norm,
  // with biases), a plain GELU FFN, and no LM head: the output is pooled
  // (ModelConfig::pooling). Runs on the encoder executor (model/cpu_encoder_executor.h).
  bool encoder = false;
  // Hybrid linear attention (qwen35): of every `<arch>.full_attention_interval`
  // layers (or as `<arch>.attention.recurrent_layers` lists them) all but the
  // last are Gated DeltaNet layers (ModelConfig::delta_net, DeltaNetPhase) with
  // a fixed state per sequence instead of a KV cache; the attention layers'
  // query projection carries a per-head output gate (attn_q: each head's query
  // then its gate), and their output is multiplied by the gate's sigmoid.
  bool gated_delta_net = false;
  // The last layer runs on every token, and only the final norm's output is
  // cut to the rows whose logits are wanted (qwen35's graph), rather than
  // the last layer's FFN running on those rows alone: which rows a
  // projection runs on can pick GGML's kernel, so its rounding.
  bool last_layer_on_every_token = false;
  // A Mamba-2 hybrid whose every layer has one branch (nemotron_h): a Mamba-2
  // mixer (ModelConfig::mamba2, Mamba2Phase), attention without RoPE, or a
  // non-gated MLP, told apart per layer by the per-layer arrays
  // `<arch>.attention.head_count_kv` and `<arch>.feed_forward_length` (both 0:
  // Mamba-2; head_count_kv > 0: attention; feed_forward_length > 0: the MLP).
  bool mamba2_single_branch_layers = false;
};

// The row for an architecture name, or null when inferd does not run it.
const ArchitectureTraits* find_architecture(std::string_view name);
// "llama, mistral, ...": for messages that say what would load.
std::string supported_architectures();
// "architecture 'x' is not supported (inferd runs llama, ...)".
std::string unsupported_architecture_message(std::string_view name);

}  // namespace inferd
