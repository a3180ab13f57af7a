// Which arithmetic the CPU kernels run (docs/design.md, "Numerics tiers").
//
// kExact reproduces llama.cpp's CPU backend to the bit: one float convert and
// one fused multiply-add per block, in GGML's order, per weight type and step
// shape. kFast quantizes each activation row once, sums integer products per
// weight block in whatever order the hardware likes best (VNNI, AMX tiles: an
// integer sum is the same in any order), and folds the blocks into one float
// accumulator per (row, token) in block order. Its results differ from
// llama.cpp's by the activation quantization's error, and like exact's they
// never depend on the batch, the tile shape or the threads.
#pragma once
#include <optional>
#include <string_view>

namespace inferd::kernels {

enum class Numerics { kExact, kFast };

inline const char* numerics_name(Numerics n) { return n == Numerics::kFast ? "fast" : "exact"; }

// "exact" or "fast"; nothing for anything else.
inline std::optional<Numerics> parse_numerics(std::string_view name) {
  if (name == "exact") return Numerics::kExact;
  if (name == "fast") return Numerics::kFast;
  return std::nullopt;
}

}  // namespace inferd::kernels
