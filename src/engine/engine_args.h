// The engine's arguments as people give them, named as vLLM's: the flags of
// `inferd serve` and `bench throughput` (--max-num-seqs, ...) and the keyword
// arguments of the Python package's LLM (max_num_seqs=...). Sizes are text
// ("2G"), speculative decoding is vLLM's JSON; config() checks them all and
// builds the EngineConfig, so every front end reads them the same way.
#pragma once
#include <cstdint>
#include <string>

#include "core/result.h"
#include "engine/engine.h"

namespace inferd {

struct EngineArgs {
  int64_t max_num_seqs = 128;
  int64_t max_num_batched_tokens = 2048;
  int64_t max_model_len = 0;         // 0: the model's context length
  std::string kv_cache_memory;       // bytes with an optional K/M/G suffix; empty: a fraction
  double kv_cache_memory_fraction = 0.25;
  int64_t num_gpu_blocks_override = 0;  // > 0: this many KV blocks, whatever the size above buys
  int64_t block_size = 16;
  bool enable_prefix_caching = true;
  std::string speculative_config;    // vLLM's JSON; empty: no speculation
  int64_t max_logprobs = 20;
  int64_t long_prefill_token_threshold = 0;  // > 0: cap on one request's tokens per step
  double chunk_attention_cost = 2.0;  // EngineConfig::chunk_attention_cost; 0: chunks sized by tokens alone
  std::string kv_offload_size;       // host-memory tier for evicted prefix blocks; empty: none
  std::string kv_store_path;         // disk tier's directory; empty: none
  std::string kv_store_size = "10G";  // the disk tier's bound
  // The KV cache's element type by name (kv/kv_cache_dtype.h): vLLM's
  // kv_cache_dtype, or llama.cpp's cache_type_k / cache_type_v (empty unless
  // given). Keys and values are kept in one dtype, so whichever are given
  // must name the same one.
  std::string kv_cache_dtype = "auto";
  std::string cache_type_k, cache_type_v;
  // vLLM's kv_cache_dtype_skip_layers: "sliding_window" keeps those layers
  // f16 (kv::parse_kv_cache_dtype_skip_layers); empty: none.
  std::string kv_cache_dtype_skip_layers;
  // The kernels' arithmetic: "exact" (llama.cpp's CPU bits) or "fast"
  // (kernels/cpu/numerics.h).
  std::string numerics = kernels::numerics_name(kernels::kDefaultNumerics);

  // How an error names an argument: as a flag (--kv-cache-memory) or as a
  // keyword argument (kv_cache_memory).
  enum class Naming { kFlag, kKeyword };
  // The config, or an error naming the argument out of range or malformed.
  Result<EngineConfig> config(Naming naming = Naming::kFlag) const;
};

// The one KV cache dtype that kv_cache_dtype, cache_type_k and cache_type_v
// name ("auto" and empty name none: the default), or an error naming the
// argument that is unknown or the two that differ.
Result<DType> resolve_kv_cache_dtype(const std::string& kv_cache_dtype, const std::string& cache_type_k,
                                     const std::string& cache_type_v,
                                     EngineArgs::Naming naming = EngineArgs::Naming::kFlag);

// "exact" or "fast" as the Numerics it names, or an error naming the argument
// and the values it takes.
Result<kernels::Numerics> resolve_numerics(const std::string& numerics,
                                           EngineArgs::Naming naming = EngineArgs::Naming::kFlag);

}  // namespace inferd
