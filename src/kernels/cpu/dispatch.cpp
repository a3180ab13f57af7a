// Runtime choice of the SIMD level: the best one this CPU supports, or the one
// forced by INFERD_SIMD=scalar|avx2|avx512|amx (never above what the CPU has).
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kernels/cpu/flavour.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/quants.h"
#if defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>

#include "kernels/cpu/weight_prefetch_x86.h"
#endif

namespace inferd::kernels {

namespace {

bool cpu_has_avx2() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  // The *_avx2.cpp files are compiled with -mavx2 -mfma -mf16c -mbmi2.
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("f16c") && __builtin_cpu_supports("bmi2");
#else
  return false;
#endif
}

bool cpu_has_avx512() {
#if defined(__x86_64__)
  return cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vnni");
#else
  return false;
#endif
}

}  // namespace

bool amx_usable() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("amx-tile") || !__builtin_cpu_supports("amx-int8")) return false;
  // Linux gives a process the tile state only once it asks for it.
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  static const bool granted = syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  return granted;
#else
  return false;
#endif
}

#if defined(__x86_64__)
// Declared in weight_prefetch_x86.h; measured per kind of host (docs/benchmarks.md,
// "Prefetch leads by CPU vendor" and "Weight prefetch leads on a Zen 4 host"):
// Intel wants the near L1 lead plus the far L2 one, AMD the one 4 KiB lead
// into L1; the fast tier's kernels want Intel's pair on AMD's AVX-512 cores
// too (Zen 4 and later). INFERD_WEIGHT_PREFETCH=L1,L2 (bytes; L2 0 for none)
// sets both, for a host whose memory behaves otherwise.
namespace {
bool lead_from_env(WeightPrefetchLead* lead) {
  if (const char* env = std::getenv("INFERD_WEIGHT_PREFETCH"); env != nullptr && *env != '\0') {
    unsigned long l1 = 0, l2 = 0;
    char tail = 0;
    if (std::sscanf(env, "%lu,%lu%c", &l1, &l2, &tail) == 2 && l1 > 0 && l1 <= (1ul << 20) && l2 <= (1ul << 20)) {
      *lead = {l1, l2};
      return true;
    }
    std::fprintf(stderr, "inferd: ignoring INFERD_WEIGHT_PREFETCH (expected L1,L2 bytes ahead, e.g. 2048,16384)\n");
  }
  return false;
}
}  // namespace

WeightPrefetchLead weight_prefetch_lead_for_this_cpu() {
  WeightPrefetchLead lead;
  if (lead_from_env(&lead)) return lead;
  __builtin_cpu_init();
  if (__builtin_cpu_is("intel")) return {2048, 16384};
  return {4096, 0};
}

WeightPrefetchLead fast_weight_prefetch_lead_for_this_cpu() {
  WeightPrefetchLead lead;
  if (lead_from_env(&lead)) return lead;
  __builtin_cpu_init();
  if (__builtin_cpu_is("intel") || cpu_has_avx512()) return {2048, 16384};
  return {4096, 0};
}
#endif

namespace {

SimdLevel choose_level() {
  const SimdLevel best = best_simd_level();
  const char* env = std::getenv("INFERD_SIMD");
  if (env == nullptr || *env == '\0') return best;
  SimdLevel want;
  if (std::strcmp(env, "scalar") == 0) {
    want = SimdLevel::kScalar;
  } else if (std::strcmp(env, "avx2") == 0) {
    want = SimdLevel::kAvx2;
  } else if (std::strcmp(env, "avx512") == 0) {
    want = SimdLevel::kAvx512;
  } else if (std::strcmp(env, "amx") == 0) {
    want = SimdLevel::kAmx;
  } else {
    std::fprintf(stderr, "inferd: ignoring INFERD_SIMD (expected scalar, avx2, avx512 or amx)\n");
    return best;
  }
  if (static_cast<int>(want) > static_cast<int>(best)) {
    std::fprintf(stderr, "inferd: INFERD_SIMD asks for a level this CPU lacks; using the best it has\n");
    return best;
  }
  return want;
}

const TypeKernels& kernels_for(DType t) {
  return kernel_table().type[static_cast<uint32_t>(t) % kNumTypeSlots];
}

}  // namespace

SimdLevel best_simd_level() {
  if (!cpu_has_avx512()) return cpu_has_avx2() ? SimdLevel::kAvx2 : SimdLevel::kScalar;
  return amx_usable() ? SimdLevel::kAmx : SimdLevel::kAvx512;
}

KernelTable build_kernel_table(SimdLevel level) {
  KernelTable t;
  fill_scalar_kernels(t);
  fill_scalar_packed_kernels(t);
  fill_scalar_kquant_kernels(t);
  if (level >= SimdLevel::kAvx2) fill_avx2_kernels(t);
  if (level >= SimdLevel::kAvx512) fill_avx512_kernels(t);
  if (level >= SimdLevel::kAmx) fill_amx_kernels(t);
  fill_fast_kernels(t, level);
  fill_bf16_kernels(t, level);
  fill_attention_kernels(t.ops, level);
  fill_attention_quant_kernels(t.ops, level);
  fill_fast_attention_kernels(t.ops, level);
  fill_activation_kernels(t.ops, level);
  fill_rms_norm_kernels(t.ops, level);
  fill_rope_kernels(t.ops, level);
  fill_argmax_kernels(t.ops, level);
  fill_short_conv_kernels(t.ops, level);
  fill_gated_delta_rule_kernels(t.ops, level);
  fill_dense_attention_kernels(t.ops, level);
  fill_selective_scan_kernels(t.ops, level);
  return t;
}

const KernelTable& kernel_table() {
  static const KernelTable table = build_kernel_table(choose_level());
  return table;
}

const char* simd_level() { return kernel_table().level; }

void dequantize_row(DType t, const void* src, float* dst, int64_t n) {
  kernels_for(t).dequantize_row(src, dst, n);
}

void quantize_row(DType t, const float* src, void* dst, int64_t n) {
  kernels_for(t).quantize_row(src, dst, n);
}

float vec_dot(DType t, int64_t n, const void* a, const void* b) {
  return kernels_for(t).vec_dot(n, a, b);
}

GgmlFlavour native_ggml_flavour() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return GgmlFlavour::kAvx512;
#endif
  return GgmlFlavour::kAvx2;
}

const char* ggml_flavour_name(GgmlFlavour f) { return f == GgmlFlavour::kAvx512 ? "avx512" : "avx2"; }

std::optional<GgmlFlavour> parse_ggml_flavour(std::string_view name) {
  if (name == "avx512") return GgmlFlavour::kAvx512;
  if (name == "avx2") return GgmlFlavour::kAvx2;
  if (name == "native") return native_ggml_flavour();
  return std::nullopt;
}

}  // namespace inferd::kernels
