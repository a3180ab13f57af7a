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
  // GGML's other types: known, so that a file holding them is read and
  // described (inferd info), though no kernel runs them yet
  // (kernels::is_supported_weight_type says which do).
  static const DTypeInfo kIQ2_XXS{"IQ2_XXS", 256, 66, true};
  static const DTypeInfo kIQ2_XS{"IQ2_XS", 256, 74, true};
  static const DTypeInfo kIQ3_XXS{"IQ3_XXS", 256, 98, true};
  static const DTypeInfo kIQ1_S{"IQ1_S", 256, 50, true};
  static const DTypeInfo kIQ4_NL{"IQ4_NL", 32, 18, true};
  static const DTypeInfo kIQ3_S{"IQ3_S", 256, 110, true};
  static const DTypeInfo kIQ2_S{"IQ2_S", 256, 82, true};
  static const DTypeInfo kIQ4_XS{"IQ4_XS", 256, 136, true};
  static const DTypeInfo kI8{"I8", 1, 1, false};
  static const DTypeInfo kI16{"I16", 1, 2, false};
  static const DTypeInfo kI32{"I32", 1, 4, false};
  static const DTypeInfo kI64{"I64", 1, 8, false};
  static const DTypeInfo kF64{"F64", 1, 8, false};
  static const DTypeInfo kIQ1_M{"IQ1_M", 256, 56, true};
  static const DTypeInfo kTQ1_0{"TQ1_0", 256, 54, true};
  static const DTypeInfo kTQ2_0{"TQ2_0", 256, 66, true};
  static const DTypeInfo kMXFP4{"MXFP4", 32, 17, true};
  static const DTypeInfo kNVFP4{"NVFP4", 64, 36, true};
  static const DTypeInfo kQ1_0{"Q1_0", 128, 18, true};
  static const DTypeInfo kQ2_0{"Q2_0", 64, 18, true};
  static const DTypeInfo kF8_E4M3{"F8_E4M3", 1, 1, false};
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
    case DType::IQ2_XXS: return &kIQ2_XXS;
    case DType::IQ2_XS: return &kIQ2_XS;
    case DType::IQ3_XXS: return &kIQ3_XXS;
    case DType::IQ1_S: return &kIQ1_S;
    case DType::IQ4_NL: return &kIQ4_NL;
    case DType::IQ3_S: return &kIQ3_S;
    case DType::IQ2_S: return &kIQ2_S;
    case DType::IQ4_XS: return &kIQ4_XS;
    case DType::I8: return &kI8;
    case DType::I16: return &kI16;
    case DType::I32: return &kI32;
    case DType::I64: return &kI64;
    case DType::F64: return &kF64;
    case DType::IQ1_M: return &kIQ1_M;
    case DType::TQ1_0: return &kTQ1_0;
    case DType::TQ2_0: return &kTQ2_0;
    case DType::MXFP4: return &kMXFP4;
    case DType::NVFP4: return &kNVFP4;
    case DType::Q1_0: return &kQ1_0;
    case DType::Q2_0: return &kQ2_0;
    case DType::F8_E4M3: return &kF8_E4M3;
  }
  return nullptr;
}

const char* dtype_name(DType t) {
  const DTypeInfo* i = dtype_info(static_cast<uint32_t>(t));
  return i ? i->name : "unknown";
}

}  // namespace inferd
