#include "model/weights.h"

#include "kernels/cpu/quants.h"

namespace inferd {

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
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
    return make_error("tensor '" + name + "' has unsupported type " + dtype_name(t->dtype));
  if (shape.size() == 1 && t->dtype != DType::F32)
    return make_error("tensor '" + name + "' is a vector and must be F32");
  WeightView w;
  w.dtype = t->dtype;
  w.data = f.tensor_data(*t);
  w.cols = shape[0];
  w.rows = shape.size() > 1 ? shape[1] : 1;
  return w;
}

}  // namespace

Result<ModelWeights> ModelWeights::from_gguf(const gguf::File& f, const ModelConfig& c) {
  ModelWeights m;
#define INFERD_TRY_SET(dst, expr) \
  {                               \
    auto r = (expr);              \
    if (!r) return r.error();     \
    dst = *r;                     \
  }
  const int64_t E = c.n_embd;
  INFERD_TRY_SET(m.tok_embd, find(f, "token_embd.weight", {E, c.n_vocab}));
  INFERD_TRY_SET(m.output_norm, find(f, "output_norm.weight", {E}));
  INFERD_TRY_SET(m.output, find(f, "output.weight", {E, c.n_vocab}, /*required=*/false));
  if (!m.output) {
    m.output = m.tok_embd;
    m.tied_embeddings = true;
  }
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    LayerWeights L;
    INFERD_TRY_SET(L.attn_norm, find(f, p + "attn_norm.weight", {E}));
    INFERD_TRY_SET(L.wq, find(f, p + "attn_q.weight", {E, c.q_dim()}));
    INFERD_TRY_SET(L.wk, find(f, p + "attn_k.weight", {E, c.kv_dim()}));
    INFERD_TRY_SET(L.wv, find(f, p + "attn_v.weight", {E, c.kv_dim()}));
    INFERD_TRY_SET(L.wo, find(f, p + "attn_output.weight", {c.q_dim(), E}));
    INFERD_TRY_SET(L.bq, find(f, p + "attn_q.bias", {c.q_dim()}, false));
    INFERD_TRY_SET(L.bk, find(f, p + "attn_k.bias", {c.kv_dim()}, false));
    INFERD_TRY_SET(L.bv, find(f, p + "attn_v.bias", {c.kv_dim()}, false));
    INFERD_TRY_SET(L.q_norm, find(f, p + "attn_q_norm.weight", {c.head_dim}, false));
    INFERD_TRY_SET(L.k_norm, find(f, p + "attn_k_norm.weight", {c.head_dim}, false));
    INFERD_TRY_SET(L.post_attn_norm, find(f, p + "post_attention_norm.weight", {E}, false));
    INFERD_TRY_SET(L.post_ffn_norm, find(f, p + "post_ffw_norm.weight", {E}, false));
    INFERD_TRY_SET(L.ffn_norm, find(f, p + "ffn_norm.weight", {E}));
    INFERD_TRY_SET(L.w_gate, find(f, p + "ffn_gate.weight", {E, c.n_ff}));
    INFERD_TRY_SET(L.w_up, find(f, p + "ffn_up.weight", {E, c.n_ff}));
    INFERD_TRY_SET(L.w_down, find(f, p + "ffn_down.weight", {c.n_ff, E}));
    m.layers.push_back(L);
  }
#undef INFERD_TRY_SET
  return m;
}

}  // namespace inferd
