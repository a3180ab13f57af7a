#include "kv/kv_cache_spec.h"

namespace inferd::kv {

const char* kv_cache_kind_name(KVCacheKind kind) {
  switch (kind) {
    case KVCacheKind::kFullAttention: return "full attention";
    case KVCacheKind::kSlidingWindow: return "sliding window";
    case KVCacheKind::kLatent: return "latent attention";
    case KVCacheKind::kRecurrentState: return "recurrent state";
  }
  return "unknown";
}

// Whether this dtype's keys and values are stored rotated: the block-scaled
// quantized types, whose 32 elements share one scale, and fp8_e4m3, whose
// per-tensor scale of 1 leaves small elements few bits and clips outliers
// (measured on the default model, perplexity --kl-divergence -c 512 --chunks
// 4: mean KL from f16 0.0152 unrotated, 0.0101 rotated). Not bf16, which
// rotation does not help (0.0041 unrotated, 0.0043 rotated).
static bool rotates(DType dtype) { return dtype != DType::F16 && dtype != DType::BF16 && dtype != DType::F32; }

int64_t KVCacheSpec::key_rotation() const {
  if (!rotates(dtype) || head_size % 64 != 0 || kind == KVCacheKind::kLatent) return 0;
  int64_t n = 64;
  while (head_size % (2 * n) == 0) n *= 2;
  return n;
}

int64_t KVCacheSpec::value_rotation() const {
  return rotates(dtype) && head_size % 64 == 0 && kind != KVCacheKind::kLatent ? 64 : 0;
}

Status KVCacheSpec::validate() const {
  const DTypeInfo* t = dtype_info(static_cast<uint32_t>(dtype));
  if (!t) return make_error("KV cache dtype " + std::to_string(static_cast<uint32_t>(dtype)) + " is not a known type");
  if (kind == KVCacheKind::kRecurrentState) {
    if (dtype != DType::F32 || conv_elements < 0 || recurrent_elements < 1 || num_kv_heads != 0 || head_size != 0 ||
        sliding_window != 0)
      return make_error("KV cache spec: a recurrent state is f32, with a recurrent part of at least one element, "
                        "a conv window of >= 0 and no heads or window (" + describe() + ")");
    return {};
  }
  if (conv_elements != 0 || recurrent_elements != 0)
    return make_error("KV cache spec: only a recurrent state has state elements (" + describe() + ")");
  if (num_kv_heads < 0 || head_size < 0 || block_size < 1)
    return make_error("KV cache spec needs heads and head size >= 0 and a block size >= 1 (" + describe() + ")");
  if (head_size % t->block_size != 0)
    return make_error(std::string("KV cache dtype ") + t->name + " packs " + std::to_string(t->block_size) +
                      " elements a block; a head of " + std::to_string(head_size) + " is not whole blocks");
  if (kind == KVCacheKind::kLatent && num_kv_heads != 1)
    return make_error("KV cache spec: a latent cache has one head (" + describe() + ")");
  if (kind == KVCacheKind::kSlidingWindow ? sliding_window < 1 : sliding_window != 0)
    return make_error("KV cache spec: a sliding window needs a window >= 1, full attention none (" + describe() + ")");
  return {};
}

std::string KVCacheSpec::describe() const {
  const DTypeInfo* t = dtype_info(static_cast<uint32_t>(dtype));
  std::string s = kv_cache_kind_name(kind);
  if (kind == KVCacheKind::kRecurrentState)
    return s + ", " + (t ? t->name : "dtype " + std::to_string(static_cast<uint32_t>(dtype))) + ", conv window " +
           std::to_string(conv_elements) + " + recurrent " + std::to_string(recurrent_elements) +
           " elements a sequence";
  if (kind == KVCacheKind::kSlidingWindow) s.append(" ").append(std::to_string(sliding_window));
  s.append(", ");
  if (t)
    s.append(t->name);
  else
    s.append("dtype ").append(std::to_string(static_cast<uint32_t>(dtype)));
  s.append(", ").append(std::to_string(num_kv_heads)).append(" KV heads x ").append(std::to_string(head_size));
  return s.append(", ").append(std::to_string(block_size)).append(" tokens a block");
}

int64_t KVCacheSpec::storage_format() const {
  // Kind and dtype, kept clear of 1 (f16 attention slot by slot, the layout
  // before the head-by-head one). Full and windowed attention lay a block out
  // alike: one number, with the head-by-head layout's bit 40 (a latent
  // cache has one head, whose layout did not change).
  const bool attention = kind == KVCacheKind::kFullAttention || kind == KVCacheKind::kSlidingWindow;
  if (attention) return (int64_t{1} << 40) | (int64_t{1} << 32) | (int64_t{static_cast<uint32_t>(dtype)} + 2);
  return (int64_t{static_cast<uint8_t>(kind) + 1} << 32) | (int64_t{static_cast<uint32_t>(dtype)} + 2);
}

std::optional<std::string> spec_mismatch(const std::vector<KVCacheSpec>& mine,
                                         const std::vector<KVCacheSpec>& theirs) {
  if (mine.size() != theirs.size())
    return "KV group count differs (here " + std::to_string(mine.size()) + ", peer " + std::to_string(theirs.size()) +
           ")";
  for (size_t g = 0; g < mine.size(); ++g)
    if (mine[g] != theirs[g])
      return "KV group " + std::to_string(g) + " differs (here " + mine[g].describe() + "; peer " +
             theirs[g].describe() + ")";
  return std::nullopt;
}

}  // namespace inferd::kv
