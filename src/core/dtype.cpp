#include "core/dtype.h"

namespace inferd {

const DTypeInfo* dtype_info(uint32_t ggml_type) {
  static const DTypeInfo kF32{"F32", 1, 4, false};
  static const DTypeInfo kF16{"F16", 1, 2, false};
  static const DTypeInfo kBF16{"BF16", 1, 2, false};
  static const DTypeInfo kQ4_0{"Q4_0", 32, 18, true};
  static const DTypeInfo kQ4_1{"Q4_1", 32, 20, true};
  static const DTypeInfo kQ5_0{"Q5_0", 32, 22, true};
  static const DTypeInfo kQ5_1{"Q5_1", 32, 24, true};
  static const DTypeInfo kQ8_0{"Q8_0", 32, 34, true};
  static const DTypeInfo kQ8_1{"Q8_1", 32, 36, true};
  static const DTypeInfo kQ2_K{"Q2_K", 256, 84, true};
  static const DTypeInfo kQ3_K{"Q3_K", 256, 110, true};
  static const DTypeInfo kQ4_K{"Q4_K", 256, 144, true};
  static const DTypeInfo kQ5_K{"Q5_K", 256, 176, true};
  static const DTypeInfo kQ6_K{"Q6_K", 256, 210, true};
  static const DTypeInfo kQ8_K{"Q8_K", 256, 292, true};
  switch (static_cast<DType>(ggml_type)) {
    case DType::F32: return &kF32;
    case DType::F16: return &kF16;
    case DType::BF16: return &kBF16;
    case DType::Q4_0: return &kQ4_0;
    case DType::Q4_1: return &kQ4_1;
    case DType::Q5_0: return &kQ5_0;
    case DType::Q5_1: return &kQ5_1;
    case DType::Q8_0: return &kQ8_0;
    case DType::Q8_1: return &kQ8_1;
    case DType::Q2_K: return &kQ2_K;
    case DType::Q3_K: return &kQ3_K;
    case DType::Q4_K: return &kQ4_K;
    case DType::Q5_K: return &kQ5_K;
    case DType::Q6_K: return &kQ6_K;
    case DType::Q8_K: return &kQ8_K;
  }
  return nullptr;
}

const char* dtype_name(DType t) {
  const DTypeInfo* i = dtype_info(static_cast<uint32_t>(t));
  return i ? i->name : "unknown";
}

}  // namespace inferd
