#include "model/weights.h"

#include "kernels/cpu/quants.h"

namespace inferd {

bool layer_has(Projection p, const ModelConfig& c, int64_t layer) {
  return !ffn_projection(p) || c.layers[layer].ffn == FfnKind::kDense;
}

std::pair<int64_t, int64_t> projection_shape(Projection p, const ModelConfig& c) {
  switch (p) {
    case Projection::kQ: return {c.n_embd, c.q_dim()};
    case Projection::kK: return {c.n_embd, c.kv_dim()};
    case Projection::kV: return {c.n_embd, c.kv_dim()};
    case Projection::kO: return {c.q_dim(), c.n_embd};
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

}  // namespace

Result<ModelWeights> ModelWeights::from_gguf(const gguf::File& f, const ModelConfig& c) {
  if (!c.traits) return make_error(unsupported_architecture_message(c.architecture));
  const ArchitectureTraits& arch = *c.traits;
  ModelWeights m;
#define INFERD_TRY_SET(dst, expr) \
  {                               \
    auto r = (expr);              \
    if (!r) return r.error();     \
    dst = *r;                     \
  }
  const int64_t E = c.n_embd, D = c.head_dim;
  INFERD_TRY_SET(m.tok_embd, find(f, "token_embd.weight", {E, c.n_vocab}));
  INFERD_TRY_SET(m.output_norm, find(f, "output_norm.weight", {E}));
  INFERD_TRY_SET(m.output, find(f, "output.weight", {E, c.n_vocab}, /*required=*/false));
  if (!m.output) {
    m.output = m.tok_embd;
    m.tied_embeddings = true;
  }
  INFERD_TRY_SET(m.rope_freqs, find(f, "rope_freqs.weight", {c.rope_dim / 2}, false));
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    LayerWeights L;
    for (const ProjectionSpec& spec : kLayerPlan) {
      if (!layer_has(spec.id, c, i)) continue;
      const auto [cols, rows] = projection_shape(spec.id, c);
      INFERD_TRY_SET(L.proj[static_cast<int>(spec.id)], find(f, p + spec.tensor, {cols, rows}));
    }
    INFERD_TRY_SET(L.attn_norm, find(f, p + "attn_norm.weight", {E}));
    INFERD_TRY_SET(L.ffn_norm, find(f, p + std::string(arch.ffn_norm_tensor), {E}));
    INFERD_TRY_SET(L.bq, find(f, p + "attn_q.bias", {c.q_dim()}, arch.qkv_bias));
    INFERD_TRY_SET(L.bk, find(f, p + "attn_k.bias", {c.kv_dim()}, arch.qkv_bias));
    INFERD_TRY_SET(L.bv, find(f, p + "attn_v.bias", {c.kv_dim()}, arch.qkv_bias));
    INFERD_TRY_SET(L.bo, find(f, p + "attn_output.bias", {E}, false));
    if (arch.attention_sinks) INFERD_TRY_SET(L.attn_sinks, find(f, p + "attn_sinks.weight", {c.n_head}));
    if (arch.qk_norm) {
      INFERD_TRY_SET(L.q_norm, find(f, p + "attn_q_norm.weight", {D}));
      INFERD_TRY_SET(L.k_norm, find(f, p + "attn_k_norm.weight", {D}));
    }
    if (arch.sandwich_norms) {
      INFERD_TRY_SET(L.post_attn_norm, find(f, p + "post_attention_norm.weight", {E}));
      INFERD_TRY_SET(L.post_ffn_norm, find(f, p + "post_ffw_norm.weight", {E}));
    }
    if (c.layers[i].ffn == FfnKind::kMixtureOfExperts) {
      const MoeConfig& moe = c.moe;
      const int64_t F = moe.n_ff_exp, X = moe.n_expert;
      INFERD_TRY_SET(L.moe.router, find(f, p + "ffn_gate_inp.weight", {E, X}));
      INFERD_TRY_SET(L.moe.gate, find_experts(f, p + "ffn_gate_exps.weight", E, F, X));
      INFERD_TRY_SET(L.moe.up, find_experts(f, p + "ffn_up_exps.weight", E, F, X));
      INFERD_TRY_SET(L.moe.down, find_experts(f, p + "ffn_down_exps.weight", F, E, X));
      INFERD_TRY_SET(L.moe.router_bias, find(f, p + "ffn_gate_inp.bias", {X}, false));
      INFERD_TRY_SET(L.moe.gate_bias, find_bias(f, p + "ffn_gate_exps.bias", F, X));
      INFERD_TRY_SET(L.moe.up_bias, find_bias(f, p + "ffn_up_exps.bias", F, X));
      INFERD_TRY_SET(L.moe.down_bias, find_bias(f, p + "ffn_down_exps.bias", E, X));
    }
    m.layers.push_back(L);
  }
#undef INFERD_TRY_SET
  return m;
}

}  // namespace inferd
