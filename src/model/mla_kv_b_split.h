// deepseek2 files converted before llama.cpp's converter split attn_kv_b
// (ModelConfig::mla.kv_b_unsplit): one matrix per layer, GGML shape
// [kv_lora_rank, n_head * (qk_nope + v_head)], each head's qk_nope key rows
// then its v_head value rows. The absorbed form reads attn_k_b (per head,
// kv_lora_rank rows of qk_nope: the key rows transposed) and attn_v_b (per
// head, the value rows as they are), which this derives at load, as today's
// convert_hf_to_gguf.py derives them from the checkpoint's kv_b_proj.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "core/result.h"
#include "gguf/gguf.h"
#include "model/config.h"
#include "model/weights.h"

namespace inferd {

struct KvBSplit {
  ExpertsView k_b, v_b;                               // views into `storage`
  std::shared_ptr<const std::vector<std::byte>> storage;  // k_b's bytes, then v_b's
};

// Splits tensor `name` (attn_kv_b) of n_head heads. Only element types that
// a transpose moves whole split exactly (F32, F16, BF16); a block-quantized
// attn_kv_b is refused, naming the tensor: its blocks run along kv_lora_rank,
// attn_k_b's would run along qk_nope, and quantizing again would change the
// weights.
Result<KvBSplit> split_attn_kv_b(const gguf::File& f, const std::string& name, const MlaConfig& m, int64_t n_head);

}  // namespace inferd
