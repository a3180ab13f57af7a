#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cassert>
#include <limits>
#include <type_traits>

#include "kernels/cpu/attention_ggml_avx2_impl.h"
#include "kernels/cpu/attention_portable_impl.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/quants.h"

namespace inferd::kernels {

namespace detail {

void attend_one_head_scalar(const float* q, const PagedKV& kv, int64_t head_offset, int64_t D, int64_t pos_begin,
                            int64_t pos_end, float scale, AttentionPass pass, float* out, const float* sinks) {
  attend_one_head_portable(q, kv, head_offset, D, pos_begin, pos_end, scale, pass, out, sinks);
}

void attend_one_head_ggml_avx2_scalar(const float* q, const PagedKV& kv, int64_t head_offset, int64_t D,
                                      int64_t pos_begin, int64_t pos_end, float scale, AttentionPass pass,
                                      float* out, const float* sinks) {
  ggml_avx2::attend_one_head_portable(q, kv, head_offset, D, pos_begin, pos_end, scale, pass, out, sinks);
}

void softmax_ggml_avx2_scalar(float* w, int64_t n) {
  float max = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) max = std::max(max, w[i]);
  ggml_avx2::softmax(w, n, max);
}

template <GgmlFlavour flavour>
void attend_latent_heads_scalar(const float* q, int64_t n_heads, const PagedKV& kv, int64_t Dk, int64_t Dv,
                                int64_t pos_begin, int64_t pos_end, float scale, AttentionPass pass, float* out) {
  using Build = std::conditional_t<flavour == GgmlFlavour::kAvx2, ggml_avx2::Build, Avx512Build>;
  attend_latent_heads_of<Build>(q, n_heads, kv, Dk, Dv, pos_begin, pos_end, scale, pass, out);
}
template void attend_latent_heads_scalar<GgmlFlavour::kAvx512>(const float*, int64_t, const PagedKV&, int64_t, int64_t,
                                                               int64_t, int64_t, float, AttentionPass, float*);
template void attend_latent_heads_scalar<GgmlFlavour::kAvx2>(const float*, int64_t, const PagedKV&, int64_t, int64_t,
                                                             int64_t, int64_t, float, AttentionPass, float*);

}  // namespace detail

namespace {

// A one-head kernel run head by head (the levels without a grouped kernel).
template <auto kOneHead>
void each_head(const float* q, int64_t n_heads, const PagedKV& kv, int64_t head_offset, int64_t D, int64_t pos_begin,
               int64_t pos_end, float scale, AttentionPass pass, float* out, const float* sinks) {
  for (int64_t h = 0; h < n_heads; ++h)
    kOneHead(q + h * D, kv, head_offset, D, pos_begin, pos_end, scale, pass, out + h * D, sinks ? sinks + h : nullptr);
}

// A tile token by token through a level's per-token kernel (the levels and
// flavours without a tiled one): the same calls as one per token.
template <auto kHeads>
void each_token(const AttentionTile& tile, int64_t n_heads, const PagedKV& kv, int64_t head_offset, int64_t D,
                float scale, const float* sinks) {
  for (int64_t i = 0; i < tile.n_tokens; ++i)
    kHeads(tile.q + i * tile.q_stride, n_heads, kv, head_offset, D, tile.pos_begin[i], tile.pos_end[i], scale,
           AttentionPass::kPrefill, tile.out + i * tile.out_stride, sinks);
}

}  // namespace

void fill_attention_kernels(FloatKernels& ops, SimdLevel level) {
  AttendHeadsFn& avx512_build = ops.attend_heads[static_cast<int>(GgmlFlavour::kAvx512)];
  AttendHeadsFn& avx2_build = ops.attend_heads[static_cast<int>(GgmlFlavour::kAvx2)];
  avx512_build = level >= SimdLevel::kAvx512 ? detail::attend_heads_avx512
                 : level == SimdLevel::kAvx2 ? detail::attend_heads_avx2
                                             : each_head<detail::attend_one_head_scalar>;
  // GGML's AVX2 build: the AVX2 kernel wherever the CPU has it (AVX-512 CPUs
  // included), else the portable one.
  avx2_build = level >= SimdLevel::kAvx2 ? detail::attend_heads_ggml_avx2
                                         : each_head<detail::attend_one_head_ggml_avx2_scalar>;
  // Prefill tiles: the tiled kernel of the level's per-token kernel (the
  // same bits, each key and value read once a tile), else that kernel token
  // by token.
  ops.attend_tile[static_cast<int>(GgmlFlavour::kAvx512)] =
      level >= SimdLevel::kAvx512 ? detail::attend_heads_tile_avx512
      : level == SimdLevel::kAvx2 ? detail::attend_heads_tile_avx2
                                  : each_token<each_head<detail::attend_one_head_scalar>>;
  ops.attend_tile[static_cast<int>(GgmlFlavour::kAvx2)] =
      level >= SimdLevel::kAvx2 ? detail::attend_heads_tile_ggml_avx2
                                : each_token<each_head<detail::attend_one_head_ggml_avx2_scalar>>;
  // Latent heads (576 wide for DeepSeek): the AVX-512 build's order with
  // AVX-512 instructions, else the portable kernel (with FMA instructions
  // where the CPU has them).
  const bool fma = level >= SimdLevel::kAvx2;
  ops.attend_latent[static_cast<int>(GgmlFlavour::kAvx512)] =
      level >= SimdLevel::kAvx512 ? detail::attend_latent_heads_avx512
      : fma                       ? detail::attend_latent_heads_fma<GgmlFlavour::kAvx512>
                                  : detail::attend_latent_heads_scalar<GgmlFlavour::kAvx512>;
  ops.attend_latent[static_cast<int>(GgmlFlavour::kAvx2)] =
      fma ? detail::attend_latent_heads_fma<GgmlFlavour::kAvx2> : detail::attend_latent_heads_scalar<GgmlFlavour::kAvx2>;
}

void attend_one_head(const float* q, const PagedKV& kv, int64_t head_offset, int64_t D, int64_t pos_begin,
                     int64_t pos_end, float scale, AttentionPass pass, float* out, GgmlFlavour flavour, const float* sinks) {
  attend_heads(q, 1, kv, head_offset, D, pos_begin, pos_end, scale, pass, out, flavour, sinks);
}

void attend_heads(const float* q, int64_t n_heads, const PagedKV& kv, int64_t head_offset, int64_t D,
                  int64_t pos_begin, int64_t pos_end, float scale, AttentionPass pass, float* out,
                  GgmlFlavour flavour, const float* sinks) {
  assert(attention_reads_kv(kv.dtype));
  const FloatKernels& ops = kernel_table().ops;
  const AttendHeadsFn fn = kv.dtype == DType::F16 ? ops.attend_heads[static_cast<int>(flavour)] : ops.attend_heads_quant;
  fn(q, n_heads, kv, head_offset, D, pos_begin, pos_end, scale, pass, out, sinks);
}

void attend_heads_tile(const AttentionTile& tile, int64_t n_heads, const PagedKV& kv, int64_t head_offset, int64_t D,
                       float scale, GgmlFlavour flavour, const float* sinks) {
  assert(attention_reads_kv(kv.dtype));
  const FloatKernels& ops = kernel_table().ops;
  if (kv.dtype != DType::F16) {  // the quantized kernels: token by token
    for (int64_t i = 0; i < tile.n_tokens; ++i)
      ops.attend_heads_quant(tile.q + i * tile.q_stride, n_heads, kv, head_offset, D, tile.pos_begin[i],
                             tile.pos_end[i], scale, AttentionPass::kPrefill, tile.out + i * tile.out_stride, sinks);
    return;
  }
  ops.attend_tile[static_cast<int>(flavour)](tile, n_heads, kv, head_offset, D, scale, sinks);
}

void attend_latent_heads(const float* q, int64_t n_heads, const PagedKV& kv, int64_t Dk, int64_t Dv,
                         int64_t pos_begin, int64_t pos_end, float scale, AttentionPass pass, float* out,
                         GgmlFlavour flavour) {
  assert(attention_reads_kv(kv.dtype) && Dv <= Dk);
  const FloatKernels& ops = kernel_table().ops;
  const AttendLatentFn fn = kv.dtype == DType::F16 ? ops.attend_latent[static_cast<int>(flavour)]
                                                   : ops.attend_latent_quant;
  fn(q, n_heads, kv, Dk, Dv, pos_begin, pos_end, scale, pass, out);
}

}  // namespace inferd::kernels
