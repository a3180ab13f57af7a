// The table of CPU kernels chosen once at startup by dispatch.cpp (internal).
//
// Each SIMD translation unit fills in the entries it implements; the rest stay
// on the scalar reference. Indexed by the GGML type number.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/bf16_layout.h"
#include "kernels/cpu/fast_layout.h"

namespace inferd::kernels {

// Dot product of one weight row `a` with one activation row `b` (n elements).
using VecDotFn = float (*)(int64_t n, const void* a, const void* b);
// Dot products of a tile: `nr` weight rows (a, a + a_stride, ...) against `nt`
// activation rows (b, b + b_stride, ...), written to
// out[r * out_row_stride + t * out_tok_stride]. Every (row, token) result is
// bit-identical to VecDotFn on that pair, whatever the tile shape: tiles only
// exist so a weight block is unpacked once for several tokens and an
// activation block loaded once for several rows.
using GemmTileFn = void (*)(int64_t n, const void* a, size_t a_stride, int nr, const void* b,
                            size_t b_stride, int nt, float* out, size_t out_row_stride,
                            size_t out_tok_stride);
// One group of kPackRows packed weight rows (packed_layout.h) against `nt`
// (1..the type's packed_tokens) packed activation rows, `act_stride` bytes apart:
// out[t * out_stride + r] for r < kPackRows. Per (row, token) the arithmetic is
// the same at every level and for every nt, so results are bit-identical.
// `lane_bias`: the rows' lane biases by the tile's PackedLaneBiasFn (8 per
// block, a row's 8 * cols / 32 after the one before), null for tiles that
// have none.
using PackedTileFn = void (*)(const uint8_t* group, int64_t cols, const uint8_t* act, size_t act_stride,
                              const int32_t* lane_bias, int nt, float* out, size_t out_stride);
// For tiles in GGML's vec_dot lane order that read quants unsigned (u = q +
// 2^s): each activation row's lane biases, -2^s times the sum of each four of
// its quants, into bias[8 * (cols / 32) * t + 8 * b + j]. They depend on the
// activations only, so a matmul computes them once for all its groups.
using PackedLaneBiasFn = void (*)(const uint8_t* act, size_t act_stride, int nt, int64_t cols, int32_t* bias);
using QuantizeRowFn = void (*)(const float* src, void* dst, int64_t n);
// n_blocks 32-float blocks of x quantized as GGML's Q8_1 (quantize_row), into
// the fields of packed activations (packed_layout.h): the quants, the block's
// d and s rounded to f16 and widened back, and the sum of its quants.
using PackedQuantizeFn = void (*)(const float* x, int64_t n_blocks, int8_t* qs, float* d, float* s, int32_t* sum);
using DequantizeRowFn = void (*)(const void* src, float* dst, int64_t n);
// Groups [0, n_groups) of eight repacked Q4_K rows (kquant_layout.h), one after
// the other, against nt Q8_K activation rows `act_stride` bytes apart, in
// GGML's repacked gemm order (gemm) or its gemv order:
// out[t * out_stride + 8 * g + r]. Per (row, token) the same float steps at
// every level and for every nt and n_groups, so results are bit-identical.
using Q4KGroupsFn = void (*)(const uint8_t* groups, int64_t n_groups, int64_t cols, const uint8_t* act,
                             size_t act_stride, int64_t nt, bool gemm, float* out, size_t out_stride);

// The float kernels around the matmuls (attention.h, activation.h, rms_norm.h,
// rope.h, argmax.h), chosen with the same level so tests and INFERD_SIMD pick them alike.
struct PagedKV;
enum class AttentionPass;
enum class RopePairs;
using AttendHeadsFn = void (*)(const float* q, int64_t n_heads, const PagedKV& kv, int64_t head_offset, int64_t D,
                               int64_t pos_begin, int64_t pos_end, float scale, AttentionPass pass, float* out, const float* sinks);
struct AttentionTile;
using AttendTileFn = void (*)(const AttentionTile& tile, int64_t n_heads, const PagedKV& kv, int64_t head_offset,
                              int64_t D, float scale, const float* sinks);
struct FastAttentionState;
using AttendTileFastFn = void (*)(const AttentionTile& tile, int64_t n_heads, const PagedKV& kv, int64_t head_offset,
                                  int64_t D, float scale, const float* sinks, const FastAttentionState* state);
using JoinFastStatesFn = void (*)(const FastAttentionState& parts, int64_t n_parts, int64_t n_heads, int64_t D,
                                  const float* sinks, float* out);
// Latent attention (attention.h: attend_latent_heads), flavour by flavour.
using AttendLatentFn = void (*)(const float* q, int64_t n_heads, const PagedKV& kv, int64_t Dk, int64_t Dv,
                                int64_t pos_begin, int64_t pos_end, float scale, AttentionPass pass, float* out);
using GatedActivationFn = void (*)(const float* gate, const float* up, float* out, int64_t n);
using SumSquaresLanesFn = double (*)(const float* x, const float* h, int64_t n);
using RopeHeadFn = void (*)(float* x, int64_t rope_dim, RopePairs pairs, const float* cos_t, const float* sin_t);
struct RangeMax;
using RangeMaxFn = RangeMax (*)(const float* x, int64_t n);
using SiluFn = void (*)(const float* x, float* out, int64_t n);
struct ShortConvArgs;
using ShortConvFn = void (*)(const ShortConvArgs& a, int64_t c0, int64_t c1);
struct DenseAttentionArgs;
using DenseAttentionFn = void (*)(const DenseAttentionArgs& a);
struct GatedDeltaArgs;
using GatedDeltaRuleFn = void (*)(const GatedDeltaArgs& a, int64_t h0, int64_t h1);
struct SelectiveScanArgs;
using SelectiveScanFn = void (*)(const SelectiveScanArgs& a, int64_t h0, int64_t h1);

constexpr int kNumGgmlFlavours = 2;

// Indexed by GgmlFlavour where the two GGML builds round differently.
struct FloatKernels {
  AttendHeadsFn attend_heads[kNumGgmlFlavours] = {};  // F16 keys and values
  AttendTileFn attend_tile[kNumGgmlFlavours] = {};  // F16 prefill tiles (attention.h: attend_heads_tile)
  AttendTileFastFn attend_tile_fast = nullptr;  // the fast tier's F16 tiles and decode parts (attention_fast.h): one order
  JoinFastStatesFn join_fast_states = nullptr;  // the fast tier's decode parts joined (attention_fast.h)
  AttendHeadsFn attend_heads_quant = nullptr;  // Q8_0, Q4_0, BF16, F8_E4M3 (attention_quant.h): one order, no flavour
  AttendLatentFn attend_latent[kNumGgmlFlavours] = {};  // F16 latent + RoPE key
  AttendLatentFn attend_latent_quant = nullptr;  // Q8_0, Q4_0, BF16, F8_E4M3 latent (attention_quant.h)
  GatedActivationFn swiglu[kNumGgmlFlavours] = {};
  GatedActivationFn geglu = nullptr;  // the same bits in both builds
  SumSquaresLanesFn sum_squares_lanes = nullptr;  // RMSNorm's lane sums (rms_norm.h)
  RopeHeadFn rope_head = nullptr;
  RangeMaxFn range_max = nullptr;  // greedy sampling's argmax (argmax.h)
  SiluFn silu[kNumGgmlFlavours] = {};  // activation.h
  ShortConvFn short_conv = nullptr;    // short_conv.h: one order, no flavour
  GatedDeltaRuleFn gated_delta_rule[kNumGgmlFlavours] = {};  // gated_delta_rule.h
  DenseAttentionFn dense_attention = nullptr;  // dense_attention.h: one order at every level
  SiluFn gelu = nullptr;  // activation.h: GGML's f16 table, the same bits at every level
  SelectiveScanFn selective_scan[kNumGgmlFlavours] = {};      // selective_scan.h
};

// Largest tile any kernel is asked for.
constexpr int kMaxTileRows = 4;
constexpr int kMaxTileTokens = 4;
constexpr int kNumTypeSlots = 48;  // GGML type numbers we know are all below this (MXFP4 = 39)

struct TypeKernels {
  VecDotFn vec_dot = nullptr;
  GemmTileFn gemm_tile = nullptr;  // null: matmul calls vec_dot per pair
  QuantizeRowFn quantize_row = nullptr;
  DequantizeRowFn dequantize_row = nullptr;
  // Preferred tile shapes (what fits the registers of this level).
  int gemv_rows = 1;    // rows per call for a single token
  int tile_rows = 1;    // rows x tokens per call for several tokens
  int tile_tokens = 1;
  // The other orders llama.cpp's CPU backend (GGML, AVX2 build) sums this type
  // in, as GemmTileFn (GGML-layout rows, vec_dot_type activations); null where
  // it has none (matmul.h, matmul_rows_ggml, says which runs when):
  //   tiled_tile   its tiled K-quant matmul, steps of 8 tokens or more;
  //   repack_tile  its CPU repack gemv (Q4_K, Q4_0 in 8-row interleaved blocks);
  //   repack_gemm_tile  its CPU repack gemm, which takes the tokens in fours
  //                (Q4_0: the same float steps as its gemv);
  //   tinyblas_tile  llamafile's tinyBLAS on float weights (F32/F16/BF16),
  //                  steps of 2 tokens or more where it takes the shape.
  GemmTileFn tiled_tile = nullptr;
  GemmTileFn tinyblas_tile = nullptr;
  GemmTileFn repack_tile = nullptr;
  GemmTileFn repack_gemm_tile = nullptr;
  // Row-interleaved weights (packed_layout.h); null where the type has none.
  PackedTileFn packed_tile = nullptr;
  PackedLaneBiasFn packed_bias = nullptr;  // what packed_tile takes as lane_bias; null: nothing
  int packed_tokens = 1;  // activation rows per packed_tile call its kernel runs best (<= kMaxPackedTokens)
  // Q4_0 packed from rows llama.cpp does not repack (rows % 8 != 0): its
  // vec_dot order (eight lanes, hsum at the end) instead of packed_tile's one
  // chain per row, which is its repacked kernels' order (packed_ref.cpp).
  PackedTileFn packed_lanes_tile = nullptr;
  PackedLaneBiasFn packed_lanes_bias = nullptr;
  int packed_lanes_tokens = 1;
};

struct KernelTable {
  TypeKernels type[kNumTypeSlots];
  PackedQuantizeFn packed_quantize = nullptr;
  // Q8_K as the repacked GEMM quantizes its 4-token activation blocks: like
  // quantize_row(Q8_K) but the positive extreme wins a tie of magnitudes.
  QuantizeRowFn quantize_q8_k_x4 = nullptr;
  // Q8_0 as GGML's CPU backend quantizes activations (127/amax, ties to even);
  // quantize_row(Q8_0) stays the reference quantizer gguf-py writes files with.
  QuantizeRowFn quantize_q8_0_cpu = nullptr;
  // Repacked Q4_K (kquant_pack.h).
  Q4KGroupsFn q4k_groups = nullptr;
  // The fast numerics tier's product (fast_gemm.h): the same bits at every level.
  FastGroupsFn fast_groups = nullptr;
  FastQuantizeFn fast_quantize = nullptr;
  // Whether this level's fast_groups sums K-quants over Q8_K super-blocks
  // (FastActs::kSuperBlocks); every level's takes both forms, other levels'
  // kernels for that form being the AVX2 one.
  bool fast_super_kquants = false;
  // The fast tier's product for F16/BF16 weights (bf16_gemm.h).
  Bf16GroupsFn bf16_groups = nullptr;
  Bf16ConvertFn bf16_convert = nullptr;
  FloatKernels ops;
  const char* level = "scalar";
};

// kAmx: the AVX-512 table with AMX tiles for the int8 products of steps of
// many tokens (kquant_amx_impl.h).
enum class SimdLevel { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kAmx = 3 };

// The best level this CPU (and OS) supports.
SimdLevel best_simd_level();
// A table for `level` (which must not exceed best_simd_level()). Tests build
// one per level to check each against the scalar reference.
KernelTable build_kernel_table(SimdLevel level);

// The table in use: best_simd_level(), or INFERD_SIMD=scalar|avx2|avx512|amx
// capped at it. Built on first call, immutable afterwards.
const KernelTable& kernel_table();

// Fillers, one per translation unit. They only overwrite what they implement.
void fill_scalar_kernels(KernelTable& t);                   // quants_ref.cpp
void fill_avx2_kernels(KernelTable& t);                     // quants_avx2.cpp
void fill_avx512_kernels(KernelTable& t);                   // quants_avx512.cpp
void fill_amx_kernels(KernelTable& t);                      // quants_avx512.cpp
// Whether this CPU has AMX-INT8 and the OS lets this process use its tiles.
bool amx_usable();                                          // dispatch.cpp
void fill_scalar_packed_kernels(KernelTable& t);            // packed_ref.cpp
// The float kernels of a level, one filler per kernel family.
void fill_attention_kernels(FloatKernels& ops, SimdLevel level);   // attention.cpp
void fill_attention_quant_kernels(FloatKernels& ops, SimdLevel level);  // attention_quant.cpp
void fill_fast_attention_kernels(FloatKernels& ops, SimdLevel level);   // attention_fast.cpp
void fill_activation_kernels(FloatKernels& ops, SimdLevel level);  // activation.cpp
void fill_rms_norm_kernels(FloatKernels& ops, SimdLevel level);    // rms_norm.cpp
void fill_rope_kernels(FloatKernels& ops, SimdLevel level);        // rope.cpp
void fill_argmax_kernels(FloatKernels& ops, SimdLevel level);      // argmax.cpp
void fill_short_conv_kernels(FloatKernels& ops, SimdLevel level);  // short_conv.cpp
void fill_gated_delta_rule_kernels(FloatKernels& ops, SimdLevel level);  // gated_delta_rule.cpp
void fill_dense_attention_kernels(FloatKernels& ops, SimdLevel level);   // dense_attention.cpp
void fill_selective_scan_kernels(FloatKernels& ops, SimdLevel level);    // selective_scan.cpp
void fill_scalar_kquant_kernels(KernelTable& t);            // kquant_pack.cpp
// The fast tier's kernel of a level (fast_gemm.cpp), and each level's own.
void fill_fast_kernels(KernelTable& t, SimdLevel level);
FastGroupsFn fast_groups_avx2();                            // fast_gemm_avx2.cpp
FastQuantizeFn fast_quantize_avx2();                        // fast_gemm_avx2.cpp
FastQuantizeFn fast_quantize_avx512();                      // fast_gemm_avx512.cpp
FastGroupsFn fast_groups_avx512();                          // fast_gemm_avx512.cpp (VNNI)
FastGroupsFn fast_groups_amx();                             // fast_gemm_avx512.cpp (AMX tiles)
// The fast tier's BF16 product of a level (bf16_gemm.cpp), and each level's own.
void fill_bf16_kernels(KernelTable& t, SimdLevel level);
Bf16GroupsFn bf16_groups_avx2();                            // bf16_gemm_avx2.cpp (fused multiply-adds)
Bf16ConvertFn bf16_convert_avx512();                        // bf16_gemm_avx512.cpp
// dpbf16ps (only where cpu_has_avx512_bf16()) or fused multiply-adds: the same bits.
Bf16GroupsFn bf16_groups_avx512(bool dpbf16);               // bf16_gemm_avx512.cpp
bool cpu_has_avx512_bf16();                                 // bf16_gemm_avx512.cpp

// The scalar reference's repacked Q4_K orders on one GGML row pair (quants_ref.cpp).
namespace ref {
float repacked_q4k_dot(int64_t n, const void* a, const void* b, bool gemm);
}  // namespace ref

}  // namespace inferd::kernels
