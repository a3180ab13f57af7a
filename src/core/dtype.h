// Tensor element types, numbered exactly as GGML/GGUF numbers them so a GGUF
// tensor's type field maps straight onto DType.
#pragma once
#include <cstddef>
#include <cstdint>

namespace inferd {

enum class DType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  BF16 = 30,
};

struct DTypeInfo {
  const char* name;
  int64_t block_size;  // elements per block (1 for plain floats)
  int64_t block_bytes; // bytes per block
  bool quantized;
};

// Info for a supported type, or nullptr if `ggml_type` is unknown/unsupported.
const DTypeInfo* dtype_info(uint32_t ggml_type);
inline const DTypeInfo& info(DType t) { return *dtype_info(static_cast<uint32_t>(t)); }
const char* dtype_name(DType t);

// Bytes taken by one row of `n` elements (n must be a multiple of block_size).
inline size_t row_bytes(DType t, int64_t n) {
  const DTypeInfo& i = info(t);
  return static_cast<size_t>(n / i.block_size * i.block_bytes);
}

}  // namespace inferd
