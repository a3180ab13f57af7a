// Hyper-parameters of a decoder-only transformer, read from GGUF metadata.
#pragma once
#include <cstdint>
#include <string>

#include "core/result.h"
#include "gguf/gguf.h"

namespace inferd {

enum class RopeStyle {
  Interleaved,  // rotate pairs (2i, 2i+1): llama GGUFs (weights permuted at conversion)
  Neox,         // rotate pairs (i, i + d/2): gemma, qwen2
};

struct ModelConfig {
  std::string architecture;  // "llama", "gemma3", ...
  std::string name;          // general.name, for display
  int64_t n_layer = 0;
  int64_t n_embd = 0;
  int64_t n_ff = 0;
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;      // key/value length per head
  int64_t n_vocab = 0;
  int64_t context_length = 0;
  int64_t rope_dim = 0;      // dimensions rotated per head (<= head_dim)
  float rope_freq_base = 10000.0f;
  float rms_eps = 1e-5f;
  RopeStyle rope_style = RopeStyle::Interleaved;
  int64_t sliding_window = 0;  // 0: none

  int64_t q_dim() const { return n_head * head_dim; }
  int64_t kv_dim() const { return n_head_kv * head_dim; }

  static Result<ModelConfig> from_gguf(const gguf::File& file);
};

// Architectures whose forward pass inferd implements.
bool architecture_can_generate(const std::string& arch);

}  // namespace inferd
