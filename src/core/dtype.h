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
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
  NVFP4 = 40,
  Q1_0 = 41,
  Q2_0 = 42,
  // Not a GGML type: inferd's own number for fp8 e4m3fn (kernels/cpu/fp8.h),
  // which only a KV cache holds; reading a GGUF refuses it (gguf.cpp).
  F8_E4M3 = 47,
};

struct DTypeInfo {
  const char* name;
  int64_t block_size;  // elements per block (1 for plain floats)
  int64_t block_bytes; // bytes per block
  bool quantized;
};

// Info for a GGML type, or nullptr if `ggml_type` is not one (GGML's numbers
// up to Q2_0 = 42, less the removed ones). Which types the kernels run is
// kernels::is_supported_weight_type.
const DTypeInfo* dtype_info(uint32_t ggml_type);
inline const DTypeInfo& info(DType t) { return *dtype_info(static_cast<uint32_t>(t)); }
const char* dtype_name(DType t);

// Bytes taken by one row of `n` elements (n must be a multiple of block_size).
inline size_t row_bytes(DType t, int64_t n) {
  const DTypeInfo& i = info(t);
  return static_cast<size_t>(n / i.block_size * i.block_bytes);
}

}  // namespace inferd
