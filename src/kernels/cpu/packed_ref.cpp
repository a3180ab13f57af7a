// Scalar reference of the packed (row-interleaved) kernels: the specification
// the SIMD versions must match bit for bit. Per (row, token), block by block:
//   Q4_0 (packed_tile): GGML's repacked order (ggml_gemv_q4_0_8x8_q8_0 and
//               ggml_gemm_q4_0_8x8_q8_0, which llama.cpp runs for every step
//               size on Q4_0 weights of rows % 8 == 0):
//               isum = exact integer dot of the block's quants (signed values)
//               acc  = fma(float(isum), d_row * d_act, acc)       result acc
//   Q4_1, Q5_0, Q8_0, and Q4_0 of rows % 8 != 0 (packed_lanes_tile): GGML's
//               vec_dot order (ggml_vec_dot_q4_1_q8_1, which llama.cpp runs for
//               every Q4_1 product; for Q5_0, Q8_0 and such Q4_0
//               ggml_vec_dot_*_q8_0 and tinyBLAS, the same per pair): eight
//               lanes, lane j holding
//               elements 4j..4j+3 of each block,
//                 acc[j] = fma(float(isum_j), d_row * d_act, acc[j])
//                 accm   = fma(m_row, s_act, accm)                 (Q4_1)
//               result ((acc0+acc4)+(acc2+acc6)) + ((acc1+acc5)+(acc3+acc7)) (+ accm).
//   MXFP4 (values kMxfp4Values[nibble], scale d_row = 2^(e - 128)), as Q4_0:
//               rows % 8 == 0 (packed_tile): the repacked order above
//               (ggml_gemv/gemm_mxfp4_8x8_q8_0); otherwise (packed_lanes_tile)
//               ggml_vec_dot_mxfp4_q8_0's: two sets of eight lanes, A for the
//               even blocks and B for the odd ones of each whole pair,
//                 lane[j] = fma(d_act * d_row, float(isum_j), lane[j])
//               s = hsum8(A + B), then an odd last block
//                 s = fma(d_act * d_row, float(isum), s).
// (GGML computes the scale as d_act * d_row; the product is the same. Its
// Q8_0 activations have the quants and f16 scale of our Q8_1 ones.)
// Why these follow GGML to the bit: the activations are re-quantized to int8
// before every projection, so one rounding step of difference anywhere flips
// a quant and grows layer by layer; a tolerance cannot bound it (see
// docs/design.md, "Logit tolerance").
#include <cmath>
#include <cstring>
#include <initializer_list>

#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/packed_layout.h"
#include "kernels/cpu/quants_blocks.h"
#include "kernels/cpu/quants.h"

namespace inferd::kernels {

namespace {

struct ActRow {
  const int8_t* qs;
  const float* d;
  const float* s;
};

ActRow act_row(const uint8_t* base, int64_t cols) {
  const int64_t nb = cols / 32;
  ActRow a;
  a.qs = reinterpret_cast<const int8_t*>(base);
  a.d = reinterpret_cast<const float*>(base + cols);
  a.s = a.d + nb;
  return a;
}

float f16_at(const uint8_t* p, int i) {
  uint16_t h;
  std::memcpy(&h, p + 2 * i, 2);
  return f16_to_f32(h);
}

// Signed value of quant e (0..31) of row r in a group-block's quant bytes.
int quant_q4(const uint8_t* q, int r, int e, int bias) {
  const int lane = e % 16;  // low nibbles hold 0..15, high nibbles 16..31
  const uint8_t byte = q[64 * (lane / 4) + 4 * r + lane % 4];
  return (e < 16 ? (byte & 0x0f) : (byte >> 4)) - bias;
}
int quant_q8(const uint8_t* q, int r, int e) {
  return static_cast<int8_t>(q[64 * (e / 4) + 4 * r + e % 4]);
}
// Q5_0: the nibble as Q4_0's, the high bit from the row's rearranged qh word.
int quant_q5(const uint8_t* p, int r, int e) {
  uint32_t qh;
  std::memcpy(&qh, p + 32 + 4 * r, 4);
  return quant_q4(p + 96, r, e, 0) + static_cast<int>(((qh >> (8 * (e % 4) + e / 4)) & 1u) << 4) - 16;
}

template <DType kType, bool kLanes = kType != DType::Q4_0>
void packed_tile_ref(const uint8_t* group, int64_t cols, const uint8_t* act, size_t act_stride,
                     const int32_t* /*lane_bias: none, the reference multiplies signed quants*/, int nt, float* out,
                     size_t out_stride) {
  constexpr size_t kBlockBytes = kType == DType::Q4_0   ? kPackedQ4_0BlockBytes
                                 : kType == DType::Q4_1 ? kPackedQ4_1BlockBytes
                                 : kType == DType::Q5_0 ? kPackedQ5_0BlockBytes
                                                        : kPackedQ8_0BlockBytes;
  constexpr size_t kQuantOffset = kType == DType::Q4_1 ? 64 : kType == DType::Q5_0 ? 96 : 32;
  const int64_t nb = cols / 32;
  for (int t = 0; t < nt; ++t) {
    const ActRow y = act_row(act + t * act_stride, cols);
    for (int r = 0; r < kPackRows; ++r) {
      float acc = 0.0f, accm = 0.0f;
      float lanes[8] = {};
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* p = group + b * kBlockBytes;
        const uint8_t* q = p + kQuantOffset;
        const int8_t* yq = y.qs + 32 * b;
        const float scale = f16_at(p, r) * y.d[b];
        if constexpr (kLanes) {
          for (int j = 0; j < 8; ++j) {
            int32_t isum = 0;
            for (int e = 4 * j; e < 4 * j + 4; ++e) {
              const int w = kType == DType::Q8_0   ? quant_q8(q, r, e)
                            : kType == DType::Q5_0 ? quant_q5(p, r, e)
                            : kType == DType::Q4_0 ? quant_q4(q, r, e, 8)
                                                   : quant_q4(q, r, e, 0);
              isum += w * yq[e];
            }
            lanes[j] = std::fma(static_cast<float>(isum), scale, lanes[j]);
          }
          if constexpr (kType == DType::Q4_1) accm = std::fma(f16_at(p + 32, r), y.s[b], accm);
        } else {
          int32_t isum = 0;
          for (int e = 0; e < 32; ++e) isum += quant_q4(q, r, e, 8) * yq[e];
          acc = std::fma(static_cast<float>(isum), scale, acc);
        }
      }
      if constexpr (kLanes) {
        acc = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
        if constexpr (kType == DType::Q4_1) acc += accm;
      }
      out[t * out_stride + r] = acc;
    }
  }
}

// MXFP4 in GGML's repacked order (kVecDot false) or its vec_dot order.
template <bool kVecDot>
void packed_tile_mxfp4_ref(const uint8_t* group, int64_t cols, const uint8_t* act, size_t act_stride,
                           const int32_t* /*lane_bias*/, int nt, float* out, size_t out_stride) {
  const int64_t nb = cols / 32;
  auto isum = [](const uint8_t* q, const int8_t* yq, int r, int e0, int e1) {
    int32_t s = 0;
    for (int e = e0; e < e1; ++e) s += kMxfp4Values[quant_q4(q, r, e, 0)] * yq[e];
    return s;
  };
  for (int t = 0; t < nt; ++t) {
    const ActRow y = act_row(act + t * act_stride, cols);
    for (int r = 0; r < kPackRows; ++r) {
      float acc = 0.0f;
      float lanes[2][8] = {};
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* p = group + b * kPackedMXFP4BlockBytes;
        const uint8_t* q = p + 16;
        const int8_t* yq = y.qs + 32 * b;
        const float scale = e8m0_to_f32_half(p[r]) * y.d[b];
        if constexpr (kVecDot) {
          if (b == nb - 1 && nb % 2 == 1) {  // after the pairs' hsum
            float sum[8];
            for (int j = 0; j < 8; ++j) sum[j] = lanes[0][j] + lanes[1][j];
            acc = ((sum[0] + sum[4]) + (sum[2] + sum[6])) + ((sum[1] + sum[5]) + (sum[3] + sum[7]));
            acc = std::fma(scale, static_cast<float>(isum(q, yq, r, 0, 32)), acc);
            break;
          }
          for (int j = 0; j < 8; ++j)
            lanes[b % 2][j] = std::fma(scale, static_cast<float>(isum(q, yq, r, 4 * j, 4 * j + 4)), lanes[b % 2][j]);
          if (b == nb - 1) {
            float sum[8];
            for (int j = 0; j < 8; ++j) sum[j] = lanes[0][j] + lanes[1][j];
            acc = ((sum[0] + sum[4]) + (sum[2] + sum[6])) + ((sum[1] + sum[5]) + (sum[3] + sum[7]));
          }
        } else {
          acc = std::fma(static_cast<float>(isum(q, yq, r, 0, 32)), scale, acc);
        }
      }
      out[t * out_stride + r] = acc;
    }
  }
}

// PackedQuantizeFn by the reference Q8_1 quantizer, block by block.
void quantize_packed_ref(const float* x, int64_t n_blocks, int8_t* qs, float* d, float* s, int32_t* sum) {
  for (int64_t i = 0; i < n_blocks; ++i) {
    BlockQ8_1 blk;
    ref::quantize_row(DType::Q8_1, x + i * 32, &blk, 32);
    std::memcpy(qs + i * 32, blk.qs, 32);
    d[i] = f16_to_f32(blk.d);
    s[i] = f16_to_f32(blk.s);
    int32_t total = 0;
    for (int8_t q : blk.qs) total += q;
    sum[i] = total;
  }
}

}  // namespace

void fill_scalar_packed_kernels(KernelTable& table) {
  table.packed_quantize = quantize_packed_ref;
  table.type[static_cast<uint32_t>(DType::Q4_0)].packed_tile = packed_tile_ref<DType::Q4_0>;
  table.type[static_cast<uint32_t>(DType::Q4_1)].packed_tile = packed_tile_ref<DType::Q4_1>;
  table.type[static_cast<uint32_t>(DType::Q5_0)].packed_tile = packed_tile_ref<DType::Q5_0>;
  table.type[static_cast<uint32_t>(DType::Q8_0)].packed_tile = packed_tile_ref<DType::Q8_0>;
  for (DType t : {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q8_0}) table.type[static_cast<uint32_t>(t)].packed_tokens = 4;
  table.type[static_cast<uint32_t>(DType::Q4_0)].packed_lanes_tile = packed_tile_ref<DType::Q4_0, true>;
  table.type[static_cast<uint32_t>(DType::Q4_0)].packed_lanes_tokens = 4;
  TypeKernels& mx = table.type[static_cast<uint32_t>(DType::MXFP4)];
  mx.packed_tile = packed_tile_mxfp4_ref<false>;
  mx.packed_tokens = 4;
  mx.packed_lanes_tile = packed_tile_mxfp4_ref<true>;
  mx.packed_lanes_tokens = 4;
}

}  // namespace inferd::kernels
