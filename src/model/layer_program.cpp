#include "model/layer_program.h"

namespace inferd {

namespace {

// The attention branch every skeleton shares: norm, Q/K/V, attention.
void attention_branch(const ModelConfig& c, int64_t l, std::vector<Phase>& out) {
  const LayerConfig& layer = c.layers[l];
  const ArchitectureTraits& t = *c.traits;
  out.push_back(NormPhase{NormPhase::Branch::kAttention, "attn_norm.weight"});
  if (c.mla) {
    out.push_back(MlaQkvPhase{c.mla.q_lora_rank > 0, layer.rope, c.rope_style});
    out.push_back(MlaAttentionPhase{c.kq_scale});
    return;
  }
  out.push_back(QkvPhase{t.qkv_bias, c.qk_norm, layer.rope, c.rope_style, c.query_scale, c.attn_output_gate});
  out.push_back(AttentionPhase{layer.sliding_window, t.attention_sinks, c.kq_scale, true, c.attn_output_gate});
}

// The FFN branch: its norm, then a gated MLP or a mixture of experts.
void ffn_branch(const ModelConfig& c, int64_t l, const char* post_norm, std::vector<Phase>& out) {
  out.push_back(NormPhase{NormPhase::Branch::kFfn, c.traits->ffn_norm_tensor.data()});
  if (c.layers[l].ffn == FfnKind::kMixtureOfExperts) {
    out.push_back(MoeFfnPhase{c.activation, post_norm, c.moe.selection_bias, c.moe.n_expert_shared > 0,
                              c.moe.gated_shared_expert});
  } else {
    out.push_back(DenseFfnPhase{c.activation, post_norm});
  }
}

// Pre-norm (llama, mistral, qwen2/3, qwen3moe, gpt-oss, glm4moe, deepseek2): each branch's
// output is added to the stream as it is.
LayerProgram pre_norm_layer(const ModelConfig& c, int64_t l) {
  LayerProgram p;
  attention_branch(c, l, p.phases);
  p.phases.push_back(OutputPhase{nullptr});
  ffn_branch(c, l, nullptr, p.phases);
  return p;
}

// A hybrid model's recurrent layer (qwen35): its norm and the Gated DeltaNet
// mixer in place of attention, then the FFN branch.
LayerProgram delta_net_layer(const ModelConfig& c, int64_t l) {
  LayerProgram p;
  p.phases.push_back(NormPhase{NormPhase::Branch::kAttention, "attn_norm.weight"});
  p.phases.push_back(DeltaNetPhase{});
  ffn_branch(c, l, nullptr, p.phases);
  return p;
}

// A layer of one branch (nemotron_h), each after the layer's attn_norm: a
// Mamba-2 mixer, attention without RoPE and its output projection, or a
// non-gated MLP.
LayerProgram single_branch_layer(const ModelConfig& c, int64_t l) {
  const LayerConfig& layer = c.layers[l];
  LayerProgram p;
  if (layer.ffn_only) {
    p.phases.push_back(NormPhase{NormPhase::Branch::kFfn, "attn_norm.weight"});
    p.phases.push_back(DenseFfnPhase{c.activation, nullptr, /*gated=*/false});
    return p;
  }
  p.phases.push_back(NormPhase{NormPhase::Branch::kAttention, "attn_norm.weight"});
  if (layer.recurrent) {
    p.phases.push_back(Mamba2Phase{});
    return p;
  }
  p.phases.push_back(QkvPhase{c.traits->qkv_bias, c.qk_norm, QkvPhase::kNoRope, c.rope_style, c.query_scale});
  p.phases.push_back(AttentionPhase{layer.sliding_window, false, c.kq_scale});
  p.phases.push_back(OutputPhase{nullptr});
  return p;
}

// Sandwich norms (gemma3): each branch's output is RMS-normalized by a norm of
// its own before it is added.
LayerProgram sandwich_norm_layer(const ModelConfig& c, int64_t l) {
  LayerProgram p;
  attention_branch(c, l, p.phases);
  p.phases.push_back(OutputPhase{"post_attention_norm.weight"});
  ffn_branch(c, l, "post_ffw_norm.weight", p.phases);
  return p;
}

// Post-norm encoder (bert): attention over the whole input, the output
// projection, add and LayerNorm; a plain MLP, add and LayerNorm.
LayerProgram post_norm_encoder_layer(const ModelConfig& c) {
  using Branch = NormPhase::Branch;
  LayerProgram p;
  p.phases.push_back(QkvPhase{c.traits->qkv_bias, false, QkvPhase::kNoRope, c.rope_style, 1.0f});
  p.phases.push_back(AttentionPhase{0, false, c.kq_scale, /*causal=*/false});
  p.phases.push_back(OutputPhase{nullptr});
  p.phases.push_back(LayerNormPhase{Branch::kAttention, "attn_output_norm.weight", "attn_output_norm.bias"});
  p.phases.push_back(PlainFfnPhase{c.activation});
  p.phases.push_back(LayerNormPhase{Branch::kFfn, "layer_output_norm.weight", "layer_output_norm.bias"});
  return p;
}

}  // namespace

std::vector<LayerProgram> build_layer_programs(const ModelConfig& c) {
  std::vector<LayerProgram> programs;
  if (!c.traits) return programs;
  for (int64_t l = 0; l < c.n_layer; ++l) {
    if (c.is_encoder()) {
      programs.push_back(post_norm_encoder_layer(c));
    } else if (c.traits->mamba2_single_branch_layers) {
      programs.push_back(single_branch_layer(c, l));
    } else if (c.layers[l].recurrent) {
      programs.push_back(delta_net_layer(c, l));
    } else {
      programs.push_back(c.sandwich_norms ? sandwich_norm_layer(c, l) : pre_norm_layer(c, l));
    }
  }
  return programs;
}

const char* phase_name(const Phase& phase) {
  static constexpr const char* kNames[] = {"norm",    "qkv",     "attention", "output",     "dense_ffn",
                                           "moe_ffn", "mla_qkv", "mla_attention", "layer_norm", "plain_ffn",
                                           "delta_net", "mamba2"};
  static_assert(std::variant_size_v<Phase> == std::size(kNames));
  return kNames[phase.index()];
}

}  // namespace inferd
