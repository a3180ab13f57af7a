#include "engine/engine_args.h"

#include <cstdint>

#include "core/byte_size.h"
#include "engine/speculative_json.h"
#include "kv/kv_cache_dtype.h"

namespace inferd {

namespace {
std::string arg_name(const std::string& keyword, EngineArgs::Naming naming) {
  if (naming == EngineArgs::Naming::kKeyword) return keyword;
  std::string flag = "--" + keyword;
  for (char& c : flag)
    if (c == '_') c = '-';
  return flag;
}
}  // namespace

Result<DType> resolve_kv_cache_dtype(const std::string& kv_cache_dtype, const std::string& cache_type_k,
                                     const std::string& cache_type_v, EngineArgs::Naming naming) {
  struct Named {
    const char* keyword;
    const std::string& value;
  };
  const Named given[] = {{"kv_cache_dtype", kv_cache_dtype}, {"cache_type_k", cache_type_k}, {"cache_type_v", cache_type_v}};
  const Named* chosen = nullptr;
  DType dtype = kv::kDefaultKVCacheDType;
  for (const Named& g : given) {
    if (g.value.empty() || g.value == "auto") continue;
    auto t = kv::parse_kv_cache_dtype(g.value);
    if (!t) return make_error(arg_name(g.keyword, naming) + ": " + t.error().message);
    if (chosen && *t != dtype)
      return make_error(arg_name(chosen->keyword, naming) + " " + chosen->value + " and " + arg_name(g.keyword, naming) +
                        " " + g.value + " differ: keys and values are kept in one dtype");
    if (!chosen) chosen = &g, dtype = *t;
  }
  return dtype;
}

Result<kernels::Numerics> resolve_numerics(const std::string& numerics, EngineArgs::Naming naming) {
  if (auto n = kernels::parse_numerics(numerics)) return *n;
  return make_error(arg_name("numerics", naming) + " '" + numerics +
                    "' is not a numerics tier: use exact (bit-identical with llama.cpp's CPU build) or fast "
                    "(integer accumulation)");
}

Result<EngineConfig> EngineArgs::config(Naming naming) const {
  const auto out_of_range = [&](const char* keyword, int64_t value, int64_t lo, int64_t hi) -> Status {
    if (value >= lo && value <= hi) return {};
    return make_error(arg_name(keyword, naming) + " is " + std::to_string(value) + "; it must be in [" +
                      std::to_string(lo) + ", " + std::to_string(hi) + "]");
  };
  for (Status st : {out_of_range("max_num_seqs", max_num_seqs, 1, int64_t{1} << 20),
                    out_of_range("max_num_batched_tokens", max_num_batched_tokens, 1, INT64_MAX),
                    out_of_range("max_model_len", max_model_len, 0, INT64_MAX),
                    out_of_range("block_size", block_size, 1, 1024),
                    out_of_range("num_gpu_blocks_override", num_gpu_blocks_override, 0, INT32_MAX),
                    out_of_range("max_logprobs", max_logprobs, 0, INT32_MAX),
                    out_of_range("long_prefill_token_threshold", long_prefill_token_threshold, 0, INT64_MAX)})
    if (!st) return st.error();
  if (!(kv_cache_memory_fraction >= 0.0 && kv_cache_memory_fraction <= 1.0))
    return make_error(arg_name("kv_cache_memory_fraction", naming) + " must be in [0, 1]");
  if (!(chunk_attention_cost >= 0.0 && chunk_attention_cost <= 1e6))
    return make_error(arg_name("chunk_attention_cost", naming) + " must be in [0, 1e6] (0: chunks sized by tokens alone)");
  EngineConfig ec;
  ec.max_num_seqs = static_cast<int32_t>(max_num_seqs);
  ec.max_num_batched_tokens = max_num_batched_tokens;
  ec.max_model_len = max_model_len;
  ec.enable_prefix_caching = enable_prefix_caching;
  ec.block_size = static_cast<int32_t>(block_size);
  ec.kv_cache_memory_fraction = kv_cache_memory_fraction;
  ec.num_gpu_blocks_override = num_gpu_blocks_override;
  ec.max_logprobs = static_cast<int32_t>(max_logprobs);
  ec.long_prefill_token_threshold = long_prefill_token_threshold;
  ec.chunk_attention_cost = chunk_attention_cost;
  auto dtype = resolve_kv_cache_dtype(kv_cache_dtype, cache_type_k, cache_type_v, naming);
  if (!dtype) return dtype.error();
  ec.kv_cache_dtype = *dtype;
  auto skip = kv::parse_kv_cache_dtype_skip_layers(kv_cache_dtype_skip_layers);
  if (!skip) return make_error(arg_name("kv_cache_dtype_skip_layers", naming) + ": " + skip.error().message);
  ec.kv_cache_skip_sliding_window = *skip;
  auto tier = resolve_numerics(numerics, naming);
  if (!tier) return tier.error();
  ec.numerics = *tier;
  if (!kv_cache_memory.empty()) {
    ec.kv_cache_bytes = parse_bytes(kv_cache_memory);
    if (ec.kv_cache_bytes <= 0)
      return make_error(arg_name("kv_cache_memory", naming) + " '" + kv_cache_memory +
                        "': expected a size such as 512M or 2G");
  }
  auto spec = parse_speculative_config(speculative_config, arg_name("speculative_config", naming));
  if (!spec) return spec.error();
  ec.speculative = *spec;
  if (!kv_offload_size.empty()) {
    ec.offload.host_bytes = parse_bytes(kv_offload_size);
    if (ec.offload.host_bytes <= 0)
      return make_error(arg_name("kv_offload_size", naming) + " '" + kv_offload_size +
                        "': expected a size such as 512M or 4G");
  }
  ec.offload.disk_path = kv_store_path;
  ec.offload.disk_bytes = parse_bytes(kv_store_size);
  if (ec.offload.disk_bytes <= 0)
    return make_error(arg_name("kv_store_size", naming) + " '" + kv_store_size +
                      "': expected a size such as 512M or 10G");
  return ec;
}

}  // namespace inferd
