// Software prefetch of the weights the x86 kernels stream (internal; included
// by the SIMD translation units).
//
// Decode reads each weight once, in order, and a thread's rows are contiguous,
// so the kernels prefetch the bytes a fixed lead past the block they work on
// (with the hardware prefetchers alone decode ran at about half the machine's
// read bandwidth).
// The best lead depends on the CPU's miss handling, not on the kernel
// (docs/design.md, "Keeping memory busy in decode"): on AMD EPYC one lead into
// L1 of 4 KiB was best; on Intel Xeon that lead starved decode from DRAM
// (Qwen2.5 1.5B at 0.67x of a 2 KiB lead), while 2 KiB alone slowed a model
// read from L3, and 2 KiB into L1 plus 16 KiB into L2 beat both everywhere. On
// a Zen 4 host the fast tier's kernels wanted Intel's pair too (decode 1.19x)
// while the default model's exact decode lost 4-10% with it, so the fast
// tier's lead is chosen apart (kFastWeightPrefetchLead).
#pragma once
#include <immintrin.h>

#include <cstddef>

namespace inferd::kernels {

// Bytes past the block in work: `l1` prefetched into L1, and, when `l2` > 0,
// that far into L2 as well.
struct WeightPrefetchLead {
  size_t l1;
  size_t l2;
};

// The lead for this CPU, chosen once (dispatch.cpp).
WeightPrefetchLead weight_prefetch_lead_for_this_cpu();
inline const WeightPrefetchLead kWeightPrefetchLead = weight_prefetch_lead_for_this_cpu();
// The fast tier's kernels' lead (fast_gemm_*.cpp).
WeightPrefetchLead fast_weight_prefetch_lead_for_this_cpu();
inline const WeightPrefetchLead kFastWeightPrefetchLead = fast_weight_prefetch_lead_for_this_cpu();

// Prefetches the `bytes` that follow p by the leads (p: the block in work).
// `into_l2` false skips the far lead: the packed kernels ask for it only in
// one-token calls, because a tile of several tokens is a prompt's (or a
// batch's) pass over a group that the first pass already brought into L1, and
// there the second prefetch cost prompts about 2% (docs/benchmarks.md).
inline void prefetch_weights_ahead(const void* p, size_t bytes, bool into_l2 = true,
                                   const WeightPrefetchLead& lead = kWeightPrefetchLead) {
  const char* q = static_cast<const char*>(p);
  for (size_t off = 0; off < bytes; off += 64) _mm_prefetch(q + lead.l1 + off, _MM_HINT_T0);
  if (into_l2 && lead.l2 != 0) {
    for (size_t off = 0; off < bytes; off += 64) _mm_prefetch(q + lead.l2 + off, _MM_HINT_T1);
  }
}

}  // namespace inferd::kernels
