#include "model/config.h"

#include <optional>

namespace inferd {

bool architecture_can_generate(const std::string& arch) {
  return arch == "llama" || arch == "mistral";
}

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

}  // namespace

Result<ModelConfig> ModelConfig::from_gguf(const gguf::File& f) {
  ModelConfig c;
  auto arch = f.get_string("general.architecture");
  if (!arch) return arch.error();
  c.architecture = *arch;
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
  INFERD_TRY_INT(n_embd, "embedding_length");
  INFERD_TRY_INT(n_ff, "feed_forward_length");
  INFERD_TRY_INT(n_head, "attention.head_count");
  INFERD_TRY_INT(n_head_kv, "attention.head_count_kv", c.n_head);
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
  if (f.find(a + ".attention.value_length")) {
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
  if (f.find(a + ".attention.sliding_window")) {
    auto w = f.get_i64(a + ".attention.sliding_window");
    if (!w) return w.error();
    c.sliding_window = *w;
  }
  c.rope_style = (a == "llama" || a == "mistral") ? RopeStyle::Interleaved : RopeStyle::Neox;

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
  return c;
}

}  // namespace inferd
