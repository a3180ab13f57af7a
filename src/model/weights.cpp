#include "model/weights.h"

#include <variant>

#include "kernels/cpu/quants.h"
#include "model/mla_kv_b_split.h"

namespace inferd {

std::pair<int64_t, int64_t> projection_shape(Projection p, const ModelConfig& c) {
  switch (p) {
    case Projection::kQ: return {c.n_embd, c.q_proj_dim()};
    case Projection::kK: return {c.n_embd, c.kv_dim()};
    case Projection::kV: return {c.n_embd, c.kv_dim()};
    case Projection::kO: return {c.attn_out_dim(), c.n_embd};
    case Projection::kGate: return {c.n_embd, c.n_ff};
    case Projection::kUp: return {c.n_embd, c.n_ff};
    case Projection::kDown: return {c.n_ff, c.n_embd};
  }
  return {0, 0};
}

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

std::string supported_weight_types() {
  std::string out;
  for (uint32_t t = 0; t < 64; ++t) {
    if (!dtype_info(t) || !kernels::is_supported_weight_type(static_cast<DType>(t))) continue;
    if (!out.empty()) out += ", ";
    out += dtype_name(static_cast<DType>(t));
  }
  return out;
}

// Looks up `name` and checks it has exactly `shape` (GGML order).
Result<WeightView> find(const gguf::File& f, const std::string& name,
                        std::vector<int64_t> shape, bool required = true) {
  const gguf::TensorInfo* t = f.find_tensor(name);
  if (!t) {
    if (!required) return WeightView{};
    return make_error("model file is missing tensor '" + name + "'");
  }
  if (t->shape != shape)
    return make_error("tensor '" + name + "' has shape " + shape_str(t->shape) + ", expected " +
                      shape_str(shape));
  if (!kernels::is_supported_weight_type(t->dtype))
    return make_error("tensor '" + name + "' has type " + dtype_name(t->dtype) +
                      ", which inferd does not run (it runs " + supported_weight_types() + ")");
  if (shape.size() == 1 && t->dtype != DType::F32)
    return make_error("tensor '" + name + "' is a vector and must be F32");
  WeightView w;
  w.dtype = t->dtype;
  w.data = f.tensor_data(*t);
  w.cols = shape[0];
  w.rows = shape.size() > 1 ? shape[1] : 1;
  return w;
}

// A 3-D expert tensor of GGML shape [cols, rows, n_expert].
Result<ExpertsView> find_experts(const gguf::File& f, const std::string& name, int64_t cols, int64_t rows,
                                 int64_t n_expert) {
  auto w = find(f, name, {cols, rows, n_expert});
  if (!w) return w.error();
  return ExpertsView{w->dtype, w->data, cols, rows, n_expert};
}

// Per-expert biases, GGML shape [n, n_expert], F32, or absent.
Result<WeightView> find_bias(const gguf::File& f, const std::string& name, int64_t n, int64_t n_expert) {
  const gguf::TensorInfo* t = f.find_tensor(name);
  if (t && t->dtype != DType::F32) return make_error("tensor '" + name + "' is a bias and must be F32");
  return find(f, name, {n, n_expert}, /*required=*/false);
}

// Each phase's tensors of layer `i` (prefix p = "blk.i.") into L.
class LayerLoader {
 public:
  LayerLoader(const gguf::File& f, const ModelConfig& c, const std::string& p, LayerWeights& L,
              std::vector<std::shared_ptr<const std::vector<std::byte>>>& derived)
      : f_(f), c_(c), p_(p), L_(L), derived_(derived) {}
  Status operator()(const NormPhase& ph) {
    WeightView& w = ph.branch == NormPhase::Branch::kAttention ? L_.attn_norm : L_.ffn_norm;
    return set(w, find(f_, p_ + ph.weight, {c_.n_embd}));
  }
  Status operator()(const QkvPhase& ph) {
    if (Status s = projection(Projection::kQ, "attn_q.weight"); !s) return s;
    if (Status s = projection(Projection::kK, "attn_k.weight"); !s) return s;
    if (Status s = projection(Projection::kV, "attn_v.weight"); !s) return s;
    if (Status s = set(L_.bq, find(f_, p_ + "attn_q.bias", {c_.q_dim()}, ph.required_bias)); !s) return s;
    if (Status s = set(L_.bk, find(f_, p_ + "attn_k.bias", {c_.kv_dim()}, ph.required_bias)); !s) return s;
    if (Status s = set(L_.bv, find(f_, p_ + "attn_v.bias", {c_.kv_dim()}, ph.required_bias)); !s) return s;
    if (!ph.qk_norm) return {};
    if (Status s = set(L_.q_norm, find(f_, p_ + "attn_q_norm.weight", {c_.head_dim})); !s) return s;
    return set(L_.k_norm, find(f_, p_ + "attn_k_norm.weight", {c_.head_dim}));
  }
  Status operator()(const AttentionPhase& ph) {
    if (!ph.sinks) return {};
    return set(L_.attn_sinks, find(f_, p_ + "attn_sinks.weight", {c_.n_head}));
  }
  Status operator()(const MlaQkvPhase& ph) {
    const MlaConfig& m = c_.mla;
    const int64_t E = c_.n_embd, H = c_.n_head, Q = H * m.q_head();
    MlaWeights& w = L_.mla;
    if (ph.q_lora) {
      if (Status s = set(w.q_a, find(f_, p_ + "attn_q_a.weight", {E, m.q_lora_rank})); !s) return s;
      if (Status s = set(w.q_a_norm, find(f_, p_ + "attn_q_a_norm.weight", {m.q_lora_rank})); !s) return s;
      if (Status s = set(w.q_b, find(f_, p_ + "attn_q_b.weight", {m.q_lora_rank, Q})); !s) return s;
    } else if (Status s = set(w.q, find(f_, p_ + "attn_q.weight", {E, Q})); !s) {
      return s;
    }
    if (Status s = set(w.kv_a, find(f_, p_ + "attn_kv_a_mqa.weight", {E, m.latent_width()})); !s) return s;
    if (Status s = set(w.kv_a_norm, find(f_, p_ + "attn_kv_a_norm.weight", {m.kv_lora_rank})); !s) return s;
    if (m.kv_b_unsplit) {  // an older file: attn_k_b and attn_v_b from attn_kv_b
      auto split = split_attn_kv_b(f_, p_ + "attn_kv_b.weight", m, H);
      if (!split) return split.error();
      w.k_b = split->k_b;
      w.v_b = split->v_b;
      derived_.push_back(std::move(split->storage));
      return {};
    }
    return set(w.k_b, find_experts(f_, p_ + "attn_k_b.weight", m.qk_nope, m.kv_lora_rank, H));
  }
  Status operator()(const MlaAttentionPhase&) {
    const MlaConfig& m = c_.mla;
    if (m.kv_b_unsplit) return {};  // split with attn_k_b (MlaQkvPhase)
    return set(L_.mla.v_b, find_experts(f_, p_ + "attn_v_b.weight", m.kv_lora_rank, m.v_head, c_.n_head));
  }
  Status operator()(const OutputPhase& ph) {
    if (Status s = projection(Projection::kO, "attn_output.weight"); !s) return s;
    if (Status s = set(L_.bo, find(f_, p_ + "attn_output.bias", {c_.n_embd}, false)); !s) return s;
    return post_norm(L_.post_attn_norm, ph.post_norm);
  }
  Status operator()(const DenseFfnPhase& ph) {
    if (!ph.gated) {
      for (const char* bias : {"ffn_up.bias", "ffn_down.bias"})
        if (f_.find_tensor(p_ + bias))
          return make_error("tensor '" + p_ + bias + "': inferd runs a non-gated MLP without biases");
    } else if (Status s = projection(Projection::kGate, "ffn_gate.weight"); !s) {
      return s;
    }
    if (Status s = projection(Projection::kUp, "ffn_up.weight"); !s) return s;
    if (Status s = projection(Projection::kDown, "ffn_down.weight"); !s) return s;
    return post_norm(L_.post_ffn_norm, ph.post_norm);
  }
  Status operator()(const LayerNormPhase& ph) {
    const bool attn = ph.after == NormPhase::Branch::kAttention;
    if (Status s = set(attn ? L_.attn_norm : L_.ffn_norm, find(f_, p_ + ph.weight, {c_.n_embd})); !s) return s;
    return set(attn ? L_.attn_norm_b : L_.ffn_norm_b, find(f_, p_ + ph.bias, {c_.n_embd}));
  }
  Status operator()(const PlainFfnPhase&) {
    if (Status s = projection(Projection::kUp, "ffn_up.weight"); !s) return s;
    if (Status s = projection(Projection::kDown, "ffn_down.weight"); !s) return s;
    if (Status s = set(L_.b_up, find(f_, p_ + "ffn_up.bias", {c_.n_ff})); !s) return s;
    return set(L_.b_down, find(f_, p_ + "ffn_down.bias", {c_.n_embd}));
  }
  Status operator()(const DeltaNetPhase&) {
    const DeltaNetConfig& d = c_.delta_net;
    const int64_t E = c_.n_embd, C = d.conv_channels(), V = d.value_dim(), HV = d.n_v_heads;
    DeltaNetWeights& w = L_.delta_net;
    if (Status s = set(w.qkv, find(f_, p_ + "attn_qkv.weight", {E, C})); !s) return s;
    if (Status s = set(w.z, find(f_, p_ + "attn_gate.weight", {E, V})); !s) return s;
    if (Status s = set(w.beta, find(f_, p_ + "ssm_beta.weight", {E, HV})); !s) return s;
    if (Status s = set(w.alpha, find(f_, p_ + "ssm_alpha.weight", {E, HV})); !s) return s;
    if (const gguf::TensorInfo* t = f_.find_tensor(p_ + "ssm_conv1d.weight"); t && t->dtype != DType::F32)
      return make_error("tensor '" + p_ + "ssm_conv1d.weight' has type " + dtype_name(t->dtype) +
                        "; inferd runs the short convolution's kernel in F32 only");
    if (Status s = set(w.conv, find(f_, p_ + "ssm_conv1d.weight", {d.conv_kernel, C})); !s) return s;
    if (Status s = set(w.dt_bias, find(f_, p_ + "ssm_dt.bias", {HV})); !s) return s;
    if (Status s = set(w.a, find(f_, p_ + "ssm_a", {HV})); !s) return s;
    if (Status s = set(w.norm, find(f_, p_ + "ssm_norm.weight", {d.head_size})); !s) return s;
    return set(w.out, find(f_, p_ + "ssm_out.weight", {V, E}));
  }
  Status operator()(const Mamba2Phase&) {
    const Mamba2Config& m = c_.mamba2;
    const int64_t E = c_.n_embd, C = m.conv_channels(), H = m.n_heads;
    Mamba2Weights& w = L_.mamba2;
    if (Status s = set(w.in, find(f_, p_ + "ssm_in.weight", {E, m.in_proj_rows()})); !s) return s;
    if (Status s = f32(w.conv, "ssm_conv1d.weight", {m.conv_kernel, C}); !s) return s;
    if (Status s = set(w.conv_b, find(f_, p_ + "ssm_conv1d.bias", {C}, /*required=*/false)); !s) return s;
    if (Status s = set(w.dt_bias, find(f_, p_ + "ssm_dt.bias", {H})); !s) return s;
    if (Status s = f32(w.a, "ssm_a", {1, H}); !s) return s;
    if (Status s = f32(w.d, "ssm_d", {1, H}); !s) return s;
    if (Status s = f32(w.norm, "ssm_norm.weight", {m.inner / m.n_groups, m.n_groups}); !s) return s;
    return set(w.out, find(f_, p_ + "ssm_out.weight", {m.inner, E}));
  }
  Status operator()(const MoeFfnPhase& ph) {
    const MoeConfig& moe = c_.moe;
    const int64_t E = c_.n_embd, F = moe.n_ff_exp, X = moe.n_expert;
    MoeWeights& m = L_.moe;
    if (Status s = set(m.router, find(f_, p_ + "ffn_gate_inp.weight", {E, X})); !s) return s;
    if (Status s = set(m.gate, find_experts(f_, p_ + "ffn_gate_exps.weight", E, F, X)); !s) return s;
    if (Status s = set(m.up, find_experts(f_, p_ + "ffn_up_exps.weight", E, F, X)); !s) return s;
    if (Status s = set(m.down, find_experts(f_, p_ + "ffn_down_exps.weight", F, E, X)); !s) return s;
    if (Status s = set(m.router_bias, find(f_, p_ + "ffn_gate_inp.bias", {X}, false)); !s) return s;
    if (Status s = set(m.gate_bias, find_bias(f_, p_ + "ffn_gate_exps.bias", F, X)); !s) return s;
    if (Status s = set(m.up_bias, find_bias(f_, p_ + "ffn_up_exps.bias", F, X)); !s) return s;
    if (Status s = set(m.down_bias, find_bias(f_, p_ + "ffn_down_exps.bias", E, X)); !s) return s;
    if (ph.selection_bias)
      if (Status s = set(m.selection_bias, find(f_, p_ + "exp_probs_b.bias", {X})); !s) return s;
    if (ph.shared_expert) {
      const int64_t S = moe.shared_width();
      if (Status s = set(m.gate_shexp, find(f_, p_ + "ffn_gate_shexp.weight", {E, S})); !s) return s;
      if (Status s = set(m.up_shexp, find(f_, p_ + "ffn_up_shexp.weight", {E, S})); !s) return s;
      if (Status s = set(m.down_shexp, find(f_, p_ + "ffn_down_shexp.weight", {S, E})); !s) return s;
    }
    if (ph.shared_expert_gate) {
      // A 1-D tensor: one row for the router's kernels, which must read it
      // with the router's input.
      if (Status s = set(m.gate_inp_shexp, find(f_, p_ + "ffn_gate_inp_shexp.weight", {E})); !s) return s;
      m.gate_inp_shexp.cols = E;
      m.gate_inp_shexp.rows = 1;
      if (m.gate_inp_shexp.dtype != m.router.dtype)
        return make_error("tensor '" + p_ + "ffn_gate_inp_shexp.weight' has type " +
                          dtype_name(m.gate_inp_shexp.dtype) + " and the router '" + p_ + "ffn_gate_inp.weight' " +
                          dtype_name(m.router.dtype) + "; inferd runs the shared expert's gate in the router's type");
    }
    return post_norm(L_.post_ffn_norm, ph.post_norm);
  }

 private:
  template <class T>
  static Status set(T& dst, Result<T> r) {
    if (!r) return r.error();
    dst = *r;
    return {};
  }
  Status projection(Projection id, const char* tensor) {
    const auto [cols, rows] = projection_shape(id, c_);
    return set(L_.proj[static_cast<int>(id)], find(f_, p_ + tensor, {cols, rows}));
  }
  // A small tensor the kernels read as floats (not only vectors: GGML shapes
  // such as ssm_a's [1, heads]).
  Status f32(WeightView& w, const char* tensor, std::vector<int64_t> shape) {
    if (const gguf::TensorInfo* t = f_.find_tensor(p_ + tensor); t && t->dtype != DType::F32)
      return make_error("tensor '" + p_ + tensor + "' has type " + dtype_name(t->dtype) + "; inferd reads it in F32 only");
    return set(w, find(f_, p_ + tensor, std::move(shape)));
  }
  Status post_norm(WeightView& w, const char* tensor) {
    if (!tensor) return {};
    return set(w, find(f_, p_ + tensor, {c_.n_embd}));
  }
  const gguf::File& f_;
  const ModelConfig& c_;
  const std::string& p_;
  LayerWeights& L_;
  std::vector<std::shared_ptr<const std::vector<std::byte>>>& derived_;
};

}  // namespace

Result<ModelWeights> ModelWeights::from_gguf(const gguf::File& f, const ModelConfig& c) {
  return from_gguf(f, c, build_layer_programs(c));
}

Result<ModelWeights> ModelWeights::from_gguf(const gguf::File& f, const ModelConfig& c,
                                             const std::vector<LayerProgram>& programs) {
  if (!c.traits) return make_error(unsupported_architecture_message(c.architecture));
  ModelWeights m;
#define INFERD_TRY_SET(dst, expr) \
  {                               \
    auto r = (expr);              \
    if (!r) return r.error();     \
    dst = *r;                     \
  }
  const int64_t E = c.n_embd;
  INFERD_TRY_SET(m.tok_embd, find(f, "token_embd.weight", {E, c.n_vocab}));
  if (c.is_encoder()) {
    INFERD_TRY_SET(m.position_embd, find(f, "position_embd.weight", {E, c.context_length}));
    const gguf::TensorInfo* types = f.find_tensor("token_types.weight");
    const int64_t n_types = types && types->shape.size() == 2 ? types->shape[1] : 1;
    INFERD_TRY_SET(m.token_types, find(f, "token_types.weight", {E, n_types}));
    INFERD_TRY_SET(m.token_embd_norm, find(f, "token_embd_norm.weight", {E}));
    INFERD_TRY_SET(m.token_embd_norm_b, find(f, "token_embd_norm.bias", {E}));
    if (c.pooling == PoolingType::kRank) {
      INFERD_TRY_SET(m.cls, find(f, "cls.weight", {E, E}, /*required=*/false));
      if (m.cls) INFERD_TRY_SET(m.cls_b, find(f, "cls.bias", {E}, false));
      const gguf::TensorInfo* out = f.find_tensor("cls.output.weight");
      const int64_t n_out = out && out->shape.size() == 2 ? out->shape[1] : 1;
      INFERD_TRY_SET(m.cls_out, find(f, "cls.output.weight", {E, n_out}));
      INFERD_TRY_SET(m.cls_out_b, find(f, "cls.output.bias", {n_out}, false));
    }
  }
  // An encoder has no LM head: its output is pooled.
  if (!c.is_encoder()) INFERD_TRY_SET(m.output_norm, find(f, "output_norm.weight", {E}));
  INFERD_TRY_SET(m.output, find(f, "output.weight", {E, c.n_vocab}, /*required=*/false));
  if (!m.output && !c.is_encoder()) {
    m.output = m.tok_embd;
    m.tied_embeddings = true;
  }
  INFERD_TRY_SET(m.rope_freqs, find(f, "rope_freqs.weight", {c.rope_dim / 2}, false));
#undef INFERD_TRY_SET
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    LayerWeights& L = m.layers.emplace_back();
    LayerLoader load(f, c, p, L, m.derived);
    for (const Phase& phase : programs[i].phases)
      if (Status s = std::visit(load, phase); !s) return s.error();
  }
  return m;
}

}  // namespace inferd
