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

// What the front ends run when not told (serve, generate, chat, bench, info,
// perplexity, EngineArgs and through it the Python API). The rule for
// making fast the default holds (its KL divergence from exact is below a q8_0
// KV cache's on every model; it is batch-invariant like exact) and it
// prefills 1.7x faster on AVX2, but one-token decode is still slower on the
// larger K-quant models: Qwen2.5-Coder-1.5B Q4_K_M decodes at 0.92x exact's
// on a 2-core Zen 3 (its layout now keeps the file's scale codes and 6-bit
// codes; what is left is the float fold every 32 columns, docs/design.md
// "Numerics tiers"). Exact
// stays the default until fast decode matches it. The library's structs (LoadOptions, Linear) are
// exact whatever this says: the reference tests, and anything else that
// compares with llama.cpp, ask for nothing.
inline constexpr Numerics kDefaultNumerics = Numerics::kExact;

inline constexpr const char* numerics_name(Numerics n) { return n == Numerics::kFast ? "fast" : "exact"; }

// "exact" or "fast"; nothing for anything else.
inline std::optional<Numerics> parse_numerics(std::string_view name) {
  if (name == "exact") return Numerics::kExact;
  if (name == "fast") return Numerics::kFast;
  return std::nullopt;
}

}  // namespace inferd::kernels
