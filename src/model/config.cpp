#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <optional>

namespace inferd {

namespace {

// Reads `<arch>.<suffix>` as an integer, falling back to `fallback` if absent.
Result<int64_t> arch_int(const gguf::File& f, const std::string& arch, const char* suffix,
                         std::optional<int64_t> fallback = std::nullopt) {
  const std::string key = arch + "." + suffix;
  if (!f.find(key)) {
    if (fallback) return *fallback;
    return make_error("model metadata is missing required key '" + key + "'");
  }
  auto v = f.get_i64(key);
  if (!v) return v.error();
  if (*v <= 0) return make_error("model metadata key '" + key + "' must be positive");
  return *v;
}

Result<float> arch_float(const gguf::File& f, const std::string& arch, const char* suffix,
                         float fallback) {
  const std::string key = arch + "." + suffix;
  if (!f.find(key)) return fallback;
  return f.get_f32(key);
}

// Which layers attend within the window: `<arch>.attention.sliding_window_pattern`
// as a per-layer array of booleans, or as n (every n-th layer global), else the
// architecture's n.
Result<std::vector<bool>> windowed_layers(const gguf::File& f, const std::string& a, int64_t n_layer,
                                          int default_pattern) {
  std::vector<bool> windowed(static_cast<size_t>(n_layer), true);
  const std::string key = a + ".attention.sliding_window_pattern";
  int64_t pattern = default_pattern;
  if (const gguf::Value* v = f.find(key)) {
    if (v->is_array()) {
      if (static_cast<int64_t>(v->ints.size()) != n_layer)
        return make_error("'" + key + "' must hold one boolean per layer");
      for (int64_t i = 0; i < n_layer; ++i) windowed[i] = v->ints[i] != 0;
      return windowed;
    }
    auto p = f.get_i64(key);
    if (!p) return p.error();
    pattern = *p;
  }
  // With a pattern of n, layers n-1, 2n-1, ... attend globally.
  for (int64_t i = 0; i < n_layer; ++i) windowed[i] = pattern == 0 || i % pattern < pattern - 1;
  return windowed;
}

// `<arch>.expert_*` as llama.cpp's loader reads them: expert and chosen
// counts required, the experts' width defaulting to feed_forward_length /
// expert_used_count, and a weights scale and leading dense layers optional.
Result<MoeConfig> moe_config(const gguf::File& f, const std::string& a, const MoeTraits& traits, int64_t n_ff,
                             int64_t n_layer) {
  MoeConfig m;
  m.gating = traits.gating;
  m.normalize_weights = traits.normalize_weights;
  m.selection_bias = traits.selection_bias;
  if (traits.routing_from_file) {
    // llama_expert_gating_func_type: 1 softmax, 2 sigmoid (0: none, the default).
    if (f.find(a + ".expert_gating_func")) {
      auto g = f.get_i64(a + ".expert_gating_func");
      if (!g) return g.error();
      if (*g == 1) m.gating = ExpertGating::kSoftmax;
      else if (*g == 2) m.gating = ExpertGating::kSigmoid;
      else if (*g != 0)
        return make_error("'" + a + ".expert_gating_func' " + std::to_string(*g) +
                          " is not supported (inferd runs 1, softmax, and 2, sigmoid)");
    }
    if (f.find(a + ".expert_weights_norm")) {
      auto norm = f.get_bool(a + ".expert_weights_norm");
      if (!norm) return norm.error();
      m.normalize_weights = *norm;
    }
  }
  if (traits.shared_experts) {
    auto shared = arch_int(f, a, "expert_shared_count");
    if (!shared) return shared.error();
    m.n_expert_shared = *shared;
  }
  if (traits.gated_shared_expert) {
    auto width = arch_int(f, a, "expert_shared_feed_forward_length", n_ff);
    if (!width) return width.error();
    m.n_expert_shared = 1;
    m.n_ff_shared = *width;
    m.gated_shared_expert = true;
  }
  auto n_expert = arch_int(f, a, "expert_count");
  if (!n_expert) return n_expert.error();
  auto n_used = arch_int(f, a, "expert_used_count");
  if (!n_used) return n_used.error();
  if (*n_used > *n_expert)
    return make_error("'" + a + ".expert_used_count' (" + std::to_string(*n_used) + ") exceeds '" + a +
                      ".expert_count' (" + std::to_string(*n_expert) + ")");
  m.n_expert = *n_expert;
  m.n_expert_used = *n_used;
  auto width = arch_int(f, a, "expert_feed_forward_length", n_ff / m.n_expert_used);
  if (!width) return width.error();
  m.n_ff_exp = *width;
  auto scale = arch_float(f, a, "expert_weights_scale", 0.0f);
  if (!scale) return scale.error();
  m.weights_scale = *scale;
  if (f.find(a + ".leading_dense_block_count")) {
    auto dense = f.get_i64(a + ".leading_dense_block_count");
    if (!dense) return dense.error();
    if (*dense < 0 || *dense > n_layer)
      return make_error("'" + a + ".leading_dense_block_count' must be between 0 and the layer count");
    m.n_leading_dense = *dense;
  }
  return m;
}


// YaRN as llama.cpp sets it up for a file that asks for it (its context's
// defaults: ext_factor 1, beta_fast 32, beta_slow 1; the attention factor
// that it computes and then cancels against rope_yarn's own), with GGML's
// correction dimensions. Float arithmetic in llama.cpp's order: this file,
// like libllama, is compiled without FMA instructions, so nothing is fused.
// yarn_log_mul: DeepSeek's mscale_all_dim (0: none), which llama.cpp's
// context turns into the attention factor get_mscale(mscale) /
// get_mscale(mscale_all_dim), with mscale taken equal to mscale_all_dim
// (DeepSeek V2's config) unless that is 1.
Status yarn_scaling(RopeConfig& rope, int64_t rope_dim, int64_t orig_ctx, float rope_attn_factor,
                    float yarn_log_mul = 0.0f) {
  if (rope.freq_scale >= 1.0f) return make_error("YaRN RoPE scaling needs rope.scaling.factor > 1");
  constexpr float kBetaFast = 32.0f, kBetaSlow = 1.0f;
  rope.ext_factor = 1.0f;
  const float factor = 1.0f / rope.freq_scale;
  const auto get_mscale = [](float scale, float mscale) {
    return scale <= 1.0f ? 1.0f : (0.1f * mscale * std::log(scale) + 1.0f);
  };
  float attn_factor = get_mscale(factor, 1.0f);
  if (yarn_log_mul != 0.0f) {
    const float mscale = yarn_log_mul != 1.0f ? yarn_log_mul : 1.0f;
    attn_factor = get_mscale(factor, mscale) / get_mscale(factor, yarn_log_mul);
  }
  attn_factor *= 1.0f / (1.0f + 0.1f * std::log(factor));
  attn_factor *= rope_attn_factor;
  rope.attn_factor = attn_factor;
  const auto corr_dim = [&](float n_rot) {
    return static_cast<float>(rope_dim) *
           std::log(static_cast<float>(orig_ctx) / (n_rot * 2 * static_cast<float>(M_PI))) /
           (2 * std::log(rope.freq_base));
  };
  const float start = std::floor(corr_dim(kBetaFast)), end = std::ceil(corr_dim(kBetaSlow));
  rope.corr_dims[0] = std::max(0.0f, start);
  rope.corr_dims[1] = std::min(static_cast<float>(rope_dim - 1), end);
  return {};
}

// `<arch>.attention.*` of latent attention as llama.cpp's deepseek2 loader
// reads them (files converted since attn_kv_b is split into attn_k_b and
// attn_v_b, which carry key_length_mla and value_length_mla).
Result<MlaConfig> mla_config(const gguf::File& f, const std::string& a, const ModelConfig& c) {
  MlaConfig m;
  if (f.find(a + ".attention.q_lora_rank")) {  // 0 or absent: attn_q (V2-Lite)
    auto q = f.get_i64(a + ".attention.q_lora_rank");
    if (!q) return q.error();
    m.q_lora_rank = std::max<int64_t>(*q, 0);
  }
  auto kv = arch_int(f, a, "attention.kv_lora_rank");
  if (!kv) return kv.error();
  m.kv_lora_rank = *kv;
  // Files from before llama.cpp's converter split attn_kv_b into attn_k_b and
  // attn_v_b have no *_length_mla: their key_length and value_length are a
  // head's (qk_nope + qk_rope, v_head) and head_count_kv the heads'; the
  // loader splits attn_kv_b (model/mla_kv_b_split.h) and the model is run
  // as the split form is.
  const bool split = f.find(a + ".attention.key_length_mla") || f.find(a + ".attention.value_length_mla");
  m.kv_b_unsplit = !split;
  auto k_mla = arch_int(f, a, split ? "attention.key_length_mla" : "attention.key_length");
  if (!k_mla) return k_mla.error();
  auto v_mla = arch_int(f, a, split ? "attention.value_length_mla" : "attention.value_length");
  if (!v_mla) return v_mla.error();
  m.qk_rope = c.rope_dim;
  m.qk_nope = *k_mla - c.rope_dim;
  m.v_head = *v_mla;
  if (m.qk_nope < 1) return make_error("attention.key_length_mla must exceed rope.dimension_count");
  if (split && (c.n_head_kv != 1 || c.head_dim != m.latent_width()))
    return make_error("latent attention needs head_count_kv 1 and key_length = kv_lora_rank + rope.dimension_count (" +
                      std::to_string(m.latent_width()) + "), as llama.cpp's converter writes them");
  if (f.find(a + ".rope.scaling.yarn_log_multiplier")) {
    auto mul = f.get_f32(a + ".rope.scaling.yarn_log_multiplier");
    if (!mul) return mul.error();
    m.yarn_log_mul = *mul / 0.1f;  // the converter writes 0.1 * mscale_all_dim
  }
  return m;
}

// `<arch>.ssm.*` of a Gated DeltaNet as llama.cpp's qwen35 loader reads
// them, and which layers are recurrent: `<arch>.attention.recurrent_layers`
// (one boolean per block) where present, else all but every
// `<arch>.full_attention_interval`-th layer (default 4).
Status delta_net_config(const gguf::File& f, const std::string& a, ModelConfig& c) {
  DeltaNetConfig& d = c.delta_net;
  for (auto [field, key] : {std::pair{&d.conv_kernel, "ssm.conv_kernel"}, std::pair{&d.head_size, "ssm.state_size"},
                            std::pair{&d.n_k_heads, "ssm.group_count"}, std::pair{&d.n_v_heads, "ssm.time_step_rank"}}) {
    auto v = arch_int(f, a, key);
    if (!v) return v.error();
    *field = *v;
  }
  auto inner = arch_int(f, a, "ssm.inner_size");
  if (!inner) return inner.error();
  if (d.n_v_heads % d.n_k_heads != 0)
    return make_error("'" + a + ".ssm.time_step_rank' (value heads) must be a multiple of '" + a +
                      ".ssm.group_count' (key heads)");
  if (*inner != d.value_dim())
    return make_error("'" + a + ".ssm.inner_size' (" + std::to_string(*inner) +
                      ") must be ssm.time_step_rank x ssm.state_size (" + std::to_string(d.value_dim()) + ")");
  const std::string list_key = a + ".attention.recurrent_layers";
  if (const gguf::Value* v = f.find(list_key)) {
    if (!v->is_array() || static_cast<int64_t>(v->ints.size()) < c.n_layer)
      return make_error("'" + list_key + "' must hold one boolean per block");
    for (int64_t i = 0; i < c.n_layer; ++i) c.layers[i].recurrent = v->ints[i] != 0;
  } else {
    auto interval = arch_int(f, a, "full_attention_interval", int64_t{4});
    if (!interval) return interval.error();
    for (int64_t i = 0; i < c.n_layer; ++i) c.layers[i].recurrent = (i + 1) % *interval != 0;
  }
  c.attn_output_gate = true;
  return {};
}

// A key llama.cpp reads per layer (get_key_or_arr) when it is an array of one
// number per block: those numbers; empty when the key is a single number or
// absent (every layer the same).
Result<std::vector<int64_t>> arch_ints_per_layer(const gguf::File& f, const std::string& a, const char* suffix,
                                                 int64_t n_layer) {
  const std::string key = a + "." + suffix;
  const gguf::Value* v = f.find(key);
  if (!v || !v->is_array()) return std::vector<int64_t>{};
  std::vector<int64_t> out(v->ints.begin(), v->ints.end());
  for (uint64_t u : v->uints) out.push_back(static_cast<int64_t>(u));
  if (static_cast<int64_t>(out.size()) < n_layer) return make_error("'" + key + "' must hold one number per block");
  out.resize(static_cast<size_t>(n_layer));
  return out;
}

// The one width the layers that have a branch share: the largest of the
// per-layer values, which must all be it or 0.
Result<int64_t> shared_layer_width(const std::vector<int64_t>& per_layer, const std::string& key) {
  const int64_t width = *std::max_element(per_layer.begin(), per_layer.end());
  for (int64_t v : per_layer)
    if (v != 0 && v != width)
      return make_error("'" + key + "' differs between layers (" + std::to_string(v) + ", " + std::to_string(width) +
                        "); inferd runs one width for every layer that has the branch");
  if (width <= 0) return make_error("'" + key + "' is 0 for every layer");
  return width;
}

// `<arch>.ssm.*` of Mamba-2 layers as llama.cpp's nemotron_h loader reads
// them, and each layer's one branch from the per-layer head_count_kv and
// feed_forward_length (empty: every layer has c's): an FFN where
// feed_forward_length > 0, else attention where head_count_kv > 0, else Mamba-2.
Status mamba2_config(const gguf::File& f, const std::string& a, const std::vector<int64_t>& ff_per_layer,
                     const std::vector<int64_t>& kv_heads_per_layer, ModelConfig& c) {
  Mamba2Config& m = c.mamba2;
  for (auto [field, key] : {std::pair{&m.conv_kernel, "ssm.conv_kernel"}, std::pair{&m.inner, "ssm.inner_size"},
                            std::pair{&m.d_state, "ssm.state_size"}, std::pair{&m.n_heads, "ssm.time_step_rank"},
                            std::pair{&m.n_groups, "ssm.group_count"}}) {
    auto v = arch_int(f, a, key);
    if (!v) return v.error();
    *field = *v;
  }
  if (m.inner % m.n_heads != 0 || m.n_heads % m.n_groups != 0)
    return make_error("'" + a + ".ssm.inner_size' must be a multiple of ssm.time_step_rank (heads), and that of " +
                      "ssm.group_count");
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const int64_t ff = ff_per_layer.empty() ? c.n_ff : ff_per_layer[i];
    const int64_t kv_heads = kv_heads_per_layer.empty() ? c.n_head_kv : kv_heads_per_layer[i];
    LayerConfig& l = c.layers[i];
    l.ffn_only = ff > 0;
    l.recurrent = ff == 0 && kv_heads == 0;
    l.no_ffn = ff == 0;
  }
  return {};
}

}  // namespace

const char* pooling_name(PoolingType p) {
  switch (p) {
    case PoolingType::kNone: return "none";
    case PoolingType::kMean: return "mean";
    case PoolingType::kCls: return "cls";
    case PoolingType::kLast: return "last";
    case PoolingType::kRank: return "rank";
  }
  return "?";
}

Result<ModelConfig> ModelConfig::from_gguf(const gguf::File& f) {
  ModelConfig c;
  auto arch = f.get_string("general.architecture");
  if (!arch) return arch.error();
  c.architecture = *arch;
  c.traits = find_architecture(c.architecture);
  if (f.find("general.name")) {
    if (auto n = f.get_string("general.name")) c.name = *n;
  }
  const std::string& a = c.architecture;
#define INFERD_TRY_INT(field, suffix, ...)              \
  {                                                     \
    auto r = arch_int(f, a, suffix, ##__VA_ARGS__);     \
    if (!r) return r.error();                           \
    c.field = *r;                                       \
  }
  INFERD_TRY_INT(n_layer, "block_count");
  if (c.traits && c.traits->nextn_layers && f.find(a + ".nextn_predict_layers")) {
    auto nextn = f.get_i64(a + ".nextn_predict_layers");
    if (!nextn) return nextn.error();
    if (*nextn < 0 || *nextn >= c.n_layer)
      return make_error("'" + a + ".nextn_predict_layers' must be below block_count");
    c.n_layer_nextn = *nextn;
    c.n_layer -= *nextn;
  }
  INFERD_TRY_INT(n_embd, "embedding_length");
  // Hybrids whose layers have one branch give the FFN width and the KV heads
  // per layer, 0 where a layer has no such branch.
  auto ff_per_layer = arch_ints_per_layer(f, a, "feed_forward_length", c.n_layer);
  if (!ff_per_layer) return ff_per_layer.error();
  auto kv_heads_per_layer = arch_ints_per_layer(f, a, "attention.head_count_kv", c.n_layer);
  if (!kv_heads_per_layer) return kv_heads_per_layer.error();
  if (ff_per_layer->empty()) {
    INFERD_TRY_INT(n_ff, "feed_forward_length");
  } else {
    auto w = shared_layer_width(*ff_per_layer, a + ".feed_forward_length");
    if (!w) return w.error();
    c.n_ff = *w;
  }
  INFERD_TRY_INT(n_head, "attention.head_count");
  if (kv_heads_per_layer->empty()) {
    INFERD_TRY_INT(n_head_kv, "attention.head_count_kv", c.n_head);
  } else {
    auto w = shared_layer_width(*kv_heads_per_layer, a + ".attention.head_count_kv");
    if (!w) return w.error();
    c.n_head_kv = *w;
  }
  INFERD_TRY_INT(context_length, "context_length", int64_t{2048});
  INFERD_TRY_INT(head_dim, "attention.key_length", c.n_embd / c.n_head);
  INFERD_TRY_INT(rope_dim, "rope.dimension_count", c.head_dim);
#undef INFERD_TRY_INT
  if (c.n_head % c.n_head_kv != 0)
    return make_error("attention.head_count (" + std::to_string(c.n_head) +
                      ") is not a multiple of attention.head_count_kv (" +
                      std::to_string(c.n_head_kv) + ")");
  if (c.rope_dim > c.head_dim || c.rope_dim % 2 != 0)
    return make_error("rope.dimension_count must be even and at most the head size");
  const bool latent = c.traits && c.traits->latent_attention;
  if (f.find(a + ".attention.value_length") && !latent) {  // latent attention: the latent's width (mla_config)
    auto v = f.get_i64(a + ".attention.value_length");
    if (!v) return v.error();
    if (*v != c.head_dim) return make_error("attention.value_length != key_length is not supported");
  }
  auto base = arch_float(f, a, "rope.freq_base", 10000.0f);
  if (!base) return base.error();
  c.rope_freq_base = *base;
  auto eps = arch_float(f, a, "attention.layer_norm_rms_epsilon", 1e-5f);
  if (!eps) return eps.error();
  c.rms_eps = *eps;
  auto ln_eps = arch_float(f, a, "attention.layer_norm_epsilon", 1e-12f);
  if (!ln_eps) return ln_eps.error();
  c.layer_norm_eps = *ln_eps;
  if (f.find(a + ".pooling_type")) {
    auto p = f.get_i64(a + ".pooling_type");
    if (!p) return p.error();
    if (*p < 0 || *p > static_cast<int64_t>(PoolingType::kRank))
      return make_error("'" + a + ".pooling_type' " + std::to_string(*p) +
                        " is not supported (inferd pools by 0 none, 1 mean, 2 cls, 3 last, 4 rank)");
    c.pooling = static_cast<PoolingType>(*p);
  }
  if (f.find(a + ".attention.sliding_window")) {
    auto w = f.get_i64(a + ".attention.sliding_window");
    if (!w) return w.error();
    c.sliding_window = *w;
  }

  // Vocabulary size: explicit key, else the token list.
  if (f.find(a + ".vocab_size")) {
    auto v = f.get_i64(a + ".vocab_size");
    if (!v) return v.error();
    c.n_vocab = *v;
  } else if (const gguf::Value* toks = f.find("tokenizer.ggml.tokens")) {
    c.n_vocab = static_cast<int64_t>(toks->size());
  } else {
    return make_error("model metadata has neither '" + a +
                      ".vocab_size' nor 'tokenizer.ggml.tokens'");
  }

  if (!c.traits) return c;  // described, not run: the rest is what running needs
  const ArchitectureTraits& t = *c.traits;
  if (t.encoder && c.pooling == PoolingType::kNone)
    return make_error("'" + a + ".pooling_type' is none: an encoder's outputs must be pooled (mean, cls, last or rank)");
  if (!t.encoder && c.pooling == PoolingType::kRank)
    return make_error("'" + a + ".pooling_type' is rank: a decoder reranker (its classification head over the "
                      "last token) is not supported; inferd reranks with encoder cross-encoders (bert)");
  // A decoder embedding GGUF may ask for bidirectional attention (llama.cpp's
  // `attention.causal`); the decoder pass attends causally only.
  if (!t.encoder && f.find(a + ".attention.causal")) {
    auto causal = f.get_bool(a + ".attention.causal");
    if (!causal) return causal.error();
    if (!*causal)
      return make_error("'" + a + ".attention.causal' is false: non-causal (bidirectional) attention in a " + a +
                        " decoder is not supported");
  }
  c.rope_style = t.rope_style;
  c.activation = t.activation;
  c.qk_norm = t.qk_norm || (t.qk_norm_if_present && f.find_tensor("blk.0.attn_q_norm.weight") != nullptr);
  c.sandwich_norms = t.sandwich_norms;
  if (t.scale_embeddings) c.embedding_scale = std::sqrt(static_cast<float>(c.n_embd));
  const float attention_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  c.query_scale = t.scale_queries ? attention_scale : 1.0f;
  c.kq_scale = t.scale_queries ? 1.0f : attention_scale;

  // RoPE scaling: linear (a frequency scale), YaRN or none; Llama 3's
  // per-dimension factors come as the rope_freqs.weight tensor (ModelWeights).
  RopeConfig global{c.rope_freq_base, 1.0f, f.find_tensor("rope_freqs.weight") != nullptr};
  std::string scaling = "linear";  // llama.cpp's default when the key is absent
  if (f.find(a + ".rope.scaling.type")) {
    auto type = f.get_string(a + ".rope.scaling.type");
    if (!type) return type.error();
    scaling = *type;
    if (scaling != "none" && scaling != "linear" && scaling != "yarn")
      return make_error("RoPE scaling '" + scaling + "' is not supported (inferd runs none, linear and yarn)");
  }
  for (const char* key : {"rope.scaling.factor", "rope.scale_linear"}) {
    auto factor = arch_float(f, a, key, 0.0f);
    if (!factor) return factor.error();
    if (*factor != 0.0f) {
      global.freq_scale = 1.0f / *factor;
      break;
    }
  }
  if (scaling == "none") global.freq_scale = 1.0f;
  auto rope_attn_factor = arch_float(f, a, "rope.scaling.attn_factor", 1.0f);
  if (!rope_attn_factor) return rope_attn_factor.error();
  global.attn_factor = *rope_attn_factor;
  if (t.latent_attention) {
    auto mla = mla_config(f, a, c);
    if (!mla) return mla.error();
    c.mla = *mla;
    // The cache is one latent head whatever the file's form.
    c.n_head_kv = 1;
    c.head_dim = c.mla.latent_width();
  }
  if (scaling == "yarn") {
    auto orig_ctx = arch_int(f, a, "rope.scaling.original_context_length", c.context_length);
    if (!orig_ctx) return orig_ctx.error();
    if (auto r = yarn_scaling(global, c.rope_dim, *orig_ctx, global.attn_factor, c.mla.yarn_log_mul); !r)
      return r.error();
  }
  if (c.mla) {
    // llama.cpp's deepseek2 graph: the YaRN factor its context folded into the
    // attention factor is taken out again and, with mscale_all_dim's, squared
    // into the softmax scale over the per-head query width.
    const float log_inv_scale = std::log(1.0f / global.freq_scale);
    const float attn_factor_org = global.attn_factor * (1.0f + 0.1f * log_inv_scale);
    const float mscale = attn_factor_org * (1.0f + 0.1f * c.mla.yarn_log_mul * log_inv_scale);
    c.kq_scale = 1.0f * mscale * mscale / std::sqrt(static_cast<float>(c.mla.q_head()));
    c.query_scale = 1.0f;
  }
  c.ropes.push_back(global);
  c.layers.assign(static_cast<size_t>(c.n_layer), LayerConfig{});
  if (t.ffn == FfnKind::kMixtureOfExperts) {
    auto moe = moe_config(f, a, t.moe, c.n_ff, c.n_layer);
    if (!moe) return moe.error();
    c.moe = *moe;
    if (t.moe.selection_bias_if_present && c.moe.n_leading_dense < c.n_layer)
      c.moe.selection_bias =
          f.find_tensor("blk." + std::to_string(c.moe.n_leading_dense) + ".exp_probs_b.bias") != nullptr;
    for (int64_t i = c.moe.n_leading_dense; i < c.n_layer; ++i) c.layers[i].ffn = FfnKind::kMixtureOfExperts;
  }
  if (t.gated_delta_net)
    if (Status s = delta_net_config(f, a, c); !s) return s.error();
  if (t.mamba2_single_branch_layers) {
    if (Status s = mamba2_config(f, a, *ff_per_layer, *kv_heads_per_layer, c); !s) return s.error();
    // llama.cpp's nemotron_h loader: the RMS epsilon is layer_norm_epsilon's where the file gives no other.
    if (!f.find(a + ".attention.layer_norm_rms_epsilon") && f.find(a + ".attention.layer_norm_epsilon"))
      c.rms_eps = c.layer_norm_eps;
  }
  if (c.sliding_window > 0) {
    auto windowed = windowed_layers(f, a, c.n_layer, t.sliding_window_pattern);
    if (!windowed) return windowed.error();
    // Windowed layers of an architecture with a RoPE base of their own use a
    // second table (unscaled, as llama.cpp's defaults for such layers).
    int rope = 0;
    if (t.sliding_window_rope_base > 0.0f) {
      auto swa_base = arch_float(f, a, "rope.freq_base_swa", t.sliding_window_rope_base);
      if (!swa_base) return swa_base.error();
      c.ropes.push_back(RopeConfig{*swa_base, 1.0f, false});
      rope = 1;
    }
    for (int64_t i = 0; i < c.n_layer; ++i) {
      if (!(*windowed)[i]) continue;
      c.layers[i].sliding_window = c.sliding_window;
      c.layers[i].rope = rope;
    }
  }
  return c;
}

}  // namespace inferd
