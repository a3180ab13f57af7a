#include "kv/kv_cache_dtype.h"

#include <algorithm>
#include <cctype>
#include <string>

#include "kv/kv_cache_spec.h"

namespace inferd::kv {

const std::vector<DType>& kv_cache_dtype_choices() {
  // llama.cpp's --cache-type-k values (common/arg.cpp kv_cache_types), f16 first.
  // Then vLLM's fp8_e4m3 (kernels/cpu/fp8.h), which no GGML type holds.
  static const std::vector<DType> choices = {DType::F16,  DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1,
                                             DType::IQ4_NL, DType::Q5_0, DType::Q5_1, DType::F32, DType::F8_E4M3};
  return choices;
}

std::string kv_cache_dtype_name(DType dtype) {
  if (dtype == DType::F8_E4M3) return "fp8_e4m3";  // vLLM's name
  std::string name = dtype_name(dtype);
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name;
}

std::string kv_cache_dtype_names() {
  std::string names = "auto";
  for (DType t : kv_cache_dtype_choices()) names += ", " + kv_cache_dtype_name(t);
  return names;
}

Result<bool> parse_kv_cache_dtype_skip_layers(std::string_view list) {
  bool sliding_window = false;
  size_t begin = 0;
  while (begin <= list.size()) {
    const size_t end = std::min(list.find(',', begin), list.size());
    std::string item(list.substr(begin, end - begin));
    std::erase_if(item, [](char c) { return std::isspace(static_cast<unsigned char>(c)); });
    for (char& c : item) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (item == "sliding_window")
      sliding_window = true;
    else if (!item.empty() && item != "none")
      return make_error("KV cache dtype skip layers: '" + std::string(list.substr(begin, end - begin)) +
                        "' is not a layer kind this engine can keep in f16 (expected sliding_window or none)");
    begin = end + 1;
  }
  return sliding_window;
}

Result<DType> parse_kv_cache_dtype(std::string_view name) {
  std::string lower(name);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "auto") return kDefaultKVCacheDType;
  // vLLM's spellings of the plain floats.
  if (lower == "float16" || lower == "half") return DType::F16;
  if (lower == "bfloat16") return DType::BF16;
  if (lower == "float32" || lower == "float") return DType::F32;
  // vLLM's "fp8" is e4m3 on CUDA; e5m2 has no kernels here.
  if (lower == "fp8") return DType::F8_E4M3;
  if (lower == "fp8_e5m2")
    return make_error("KV cache dtype '" + std::string(name) +
                      "' is not supported (fp8_e4m3 and q8_0 keep 8 bits a value)");
  for (DType t : kv_cache_dtype_choices())
    if (lower == kv_cache_dtype_name(t)) return t;
  return make_error("unknown KV cache dtype '" + std::string(name) + "' (expected one of " + kv_cache_dtype_names() +
                    ")");
}

}  // namespace inferd::kv
