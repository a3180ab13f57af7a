#include "model/mla_kv_b_split.h"

#include <cstring>

namespace inferd {

Result<KvBSplit> split_attn_kv_b(const gguf::File& f, const std::string& name, const MlaConfig& m, int64_t n_head) {
  const gguf::TensorInfo* t = f.find_tensor(name);
  if (!t)
    return make_error("model file is missing tensor '" + name +
                      "' (a deepseek2 file without attention.key_length_mla keeps attn_kv_b in place of "
                      "attn_k_b and attn_v_b)");
  const int64_t R = m.kv_lora_rank, NOPE = m.qk_nope, V = m.v_head, HEAD = NOPE + V;
  const std::vector<int64_t> want{R, n_head * HEAD};
  if (t->shape != want)
    return make_error("tensor '" + name + "' has " + std::to_string(t->shape.size()) +
                      " dimensions or another shape than [" + std::to_string(R) + ", " + std::to_string(n_head * HEAD) +
                      "] (kv_lora_rank, heads x (qk_nope + v_head))");
  if (t->dtype != DType::F32 && t->dtype != DType::F16 && t->dtype != DType::BF16)
    return make_error("tensor '" + name + "' is " + dtype_name(t->dtype) +
                      ": attn_k_b is its key rows transposed, and " + dtype_name(t->dtype) +
                      "'s blocks run along kv_lora_rank, so no split keeps its weights exactly; convert the model "
                      "again (a current convert_hf_to_gguf.py writes attn_k_b and attn_v_b) or use an F16, BF16 "
                      "or F32 attn_kv_b");
  const size_t es = row_bytes(t->dtype, 1);
  const auto* src = static_cast<const std::byte*>(static_cast<const void*>(f.tensor_data(*t)));
  const size_t k_bytes = static_cast<size_t>(n_head * R * NOPE) * es;
  auto storage = std::make_shared<std::vector<std::byte>>(k_bytes + static_cast<size_t>(n_head * V * R) * es);
  std::byte* k_b = storage->data();
  std::byte* v_b = k_b + k_bytes;
  for (int64_t h = 0; h < n_head; ++h) {
    // Head h's key row j is attn_k_b's column j: k_b[h][r][j] = kv_b[h * HEAD + j][r].
    for (int64_t j = 0; j < NOPE; ++j) {
      const std::byte* row = src + static_cast<size_t>((h * HEAD + j) * R) * es;
      for (int64_t r = 0; r < R; ++r)
        std::memcpy(k_b + static_cast<size_t>((h * R + r) * NOPE + j) * es, row + static_cast<size_t>(r) * es, es);
    }
    // Its value rows as they are.
    std::memcpy(v_b + static_cast<size_t>(h * V * R) * es, src + static_cast<size_t>((h * HEAD + NOPE) * R) * es,
                static_cast<size_t>(V * R) * es);
  }
  KvBSplit out;
  out.k_b = ExpertsView{t->dtype, k_b, NOPE, R, n_head};
  out.v_b = ExpertsView{t->dtype, v_b, R, V, n_head};
  out.storage = std::move(storage);
  return out;
}

}  // namespace inferd
