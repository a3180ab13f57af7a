// Which build of llama.cpp's CPU backend (GGML) the kernels reproduce to the bit.
//
// GGML's AVX-512 and AVX2 builds compute the same functions but round
// differently where their vector width sets the summation order (the f16 dot
// products and softmax sums of attention, among others), so one model gives
// slightly different logits on each, and quantized activations turn such
// last-bit differences into different continuations (docs/design.md,
// "Numerics against llama.cpp"). inferd can follow either build on any CPU
// that runs it: the flavour is a choice of arithmetic, not of instructions.
#pragma once
#include <optional>
#include <string_view>

namespace inferd::kernels {

enum class GgmlFlavour { kAvx512, kAvx2 };

// The build llama.cpp makes with GGML_NATIVE on this CPU: AVX-512 where the CPU
// has AVX-512F, else AVX2.
GgmlFlavour native_ggml_flavour();
const char* ggml_flavour_name(GgmlFlavour f);  // "avx512", "avx2"
// "avx512", "avx2" or "native"; nothing for anything else.
std::optional<GgmlFlavour> parse_ggml_flavour(std::string_view name);

}  // namespace inferd::kernels
