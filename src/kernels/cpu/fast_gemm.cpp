#include "kernels/cpu/fast_gemm.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "kernels/cpu/quants.h"
#include "kernels/cpu/quants_blocks.h"

namespace inferd::kernels {

namespace {

// Columns per scale, and whether every code fits 4 bits.
struct FastFormat {
  int block = 0;  // 0: the tier has no integer form of the type
  bool nibbles = false;
  int top_bits = 0;  // 5- or 6-bit codes: nibbles plus a plane of the top 1 or 2 bits
  int code_max = 255;
  bool half_scales = false;  // decode_row's scales and mins are f16 values (the file's)
  float min_factor = 0.0f;   // decode_row's min is scale * min_factor, one float product
  bool sub_scales = false;   // K-quants: the file's scale codes and super-block factors kept (fast_layout.h)
};

FastFormat format_of(DType t) {
  switch (t) {
    case DType::Q4_0: return {32, true, 0, 15, true, -8.0f};
    case DType::Q4_1: return {32, true, 0, 15, true};
    case DType::Q4_K: return {32, true, 0, 15, false, 0.0f, true};
    case DType::Q5_0: return {32, true, 1, 31, true, -16.0f};
    case DType::Q5_1: return {32, true, 1, 31, true};
    case DType::Q5_K: return {32, true, 1, 31, false, 0.0f, true};
    case DType::Q8_0: return {32, false, 0, 255, true, -128.0f};
    case DType::MXFP4: return {32, false, 0, 24, false, -12.0f};  // E2M1's doubled values, -12..12, plus 12
    case DType::Q2_K: return {16, true, 0, 3, false, 0.0f, true};
    case DType::Q3_K: return {16, true, 0, 7, false, -4.0f, true};
    case DType::Q6_K: return {16, true, 2, 63, false, -32.0f, true};
    default: return {};
  }
}

// A K-quant row's scales as the file codes them: per block an int8 scale
// code and min code (negated), per super-block of 256 columns the f16 factors
// d and dmin; scale = d * sc and min = dmin * m, as decode_row computes them.
struct SubScales {
  std::vector<int8_t> sc, m;
  std::vector<uint16_t> d, dmin;
};

// One GGML row as codes: u[cols], and per block of B columns scale and min,
// so that the row's value k is scale[k / B] * u[k] + min[k / B]: the format's
// own dequantization with its offsets folded into min. For a K-quant also the
// codes those scales and mins come from (sub, sized by the caller).
void decode_row(DType t, const uint8_t* src, int64_t cols, uint8_t* u, float* scale, float* min, SubScales& sub) {
  switch (t) {
    case DType::Q4_0: {
      const auto* b = reinterpret_cast<const BlockQ4_0*>(src);
      for (int64_t i = 0; i < cols / kQK; ++i, u += kQK) {
        const float d = f16_to_f32(b[i].d);
        for (int j = 0; j < 16; ++j) u[j] = b[i].qs[j] & 0xF, u[j + 16] = b[i].qs[j] >> 4;
        scale[i] = d, min[i] = -8.0f * d;
      }
      return;
    }
    case DType::Q4_1: {
      const auto* b = reinterpret_cast<const BlockQ4_1*>(src);
      for (int64_t i = 0; i < cols / kQK; ++i, u += kQK) {
        for (int j = 0; j < 16; ++j) u[j] = b[i].qs[j] & 0xF, u[j + 16] = b[i].qs[j] >> 4;
        scale[i] = f16_to_f32(b[i].d), min[i] = f16_to_f32(b[i].m);
      }
      return;
    }
    case DType::Q5_0:
    case DType::Q5_1: {
      const bool offset = t == DType::Q5_1;
      const size_t bytes = offset ? sizeof(BlockQ5_1) : sizeof(BlockQ5_0);
      for (int64_t i = 0; i < cols / kQK; ++i, u += kQK, src += bytes) {
        uint16_t d, m = 0;
        uint32_t qh;
        const uint8_t* qs;
        if (offset) {
          const auto* b = reinterpret_cast<const BlockQ5_1*>(src);
          d = b->d, m = b->m, qs = b->qs;
          std::memcpy(&qh, b->qh, 4);
        } else {
          const auto* b = reinterpret_cast<const BlockQ5_0*>(src);
          d = b->d, qs = b->qs;
          std::memcpy(&qh, b->qh, 4);
        }
        for (int j = 0; j < 16; ++j) {
          u[j] = static_cast<uint8_t>((qs[j] & 0xF) | (((qh >> j) & 1) << 4));
          u[j + 16] = static_cast<uint8_t>((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
        }
        scale[i] = f16_to_f32(d);
        min[i] = offset ? f16_to_f32(m) : -16.0f * scale[i];
      }
      return;
    }
    case DType::Q8_0: {
      const auto* b = reinterpret_cast<const BlockQ8_0*>(src);
      for (int64_t i = 0; i < cols / kQK; ++i, u += kQK) {
        for (int j = 0; j < kQK; ++j) u[j] = static_cast<uint8_t>(b[i].qs[j] + 128);
        scale[i] = f16_to_f32(b[i].d), min[i] = -128.0f * scale[i];
      }
      return;
    }
    case DType::MXFP4: {
      // kMxfp4Values are twice E2M1's values: the scale is GGML's halved one.
      const auto* b = reinterpret_cast<const BlockMXFP4*>(src);
      for (int64_t i = 0; i < cols / kQK; ++i, u += kQK) {
        for (int j = 0; j < 16; ++j) {
          u[j] = static_cast<uint8_t>(kMxfp4Values[b[i].qs[j] & 0xF] + 12);
          u[j + 16] = static_cast<uint8_t>(kMxfp4Values[b[i].qs[j] >> 4] + 12);
        }
        scale[i] = e8m0_to_f32_half(b[i].e), min[i] = -12.0f * scale[i];
      }
      return;
    }
    case DType::Q4_K:
    case DType::Q5_K: {
      const bool five = t == DType::Q5_K;
      const size_t bytes = five ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K);
      for (int64_t i = 0; i < cols / kQK_K; ++i, src += bytes) {
        uint16_t dh, dminh;
        const uint8_t *sc, *qs, *qh = nullptr;
        if (five) {
          const auto* b = reinterpret_cast<const BlockQ5_K*>(src);
          dh = b->d, dminh = b->dmin, sc = b->scales, qs = b->qs, qh = b->qh;
        } else {
          const auto* b = reinterpret_cast<const BlockQ4_K*>(src);
          dh = b->d, dminh = b->dmin, sc = b->scales, qs = b->qs;
        }
        const float d = f16_to_f32(dh), dmin = f16_to_f32(dminh);
        sub.d[i] = dh, sub.dmin[i] = dminh;
        for (int j = 0; j < 8; ++j) {  // sub-block j: 32 columns
          // The 6-bit scale and min of sub-block j, packed as GGML packs them.
          const int s = j < 4 ? sc[j] & 63 : (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4);
          const int m = j < 4 ? sc[j + 4] & 63 : (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
          const uint8_t* q = qs + 32 * (j / 2);  // 64 columns per 32 bytes: low nibbles, then high
          for (int l = 0; l < 32; ++l) {
            int v = j % 2 == 0 ? q[l] & 0xF : q[l] >> 4;
            if (five && (qh[l] >> j) & 1) v += 16;
            u[l] = static_cast<uint8_t>(v);
          }
          u += 32;
          sub.sc[8 * i + j] = static_cast<int8_t>(s), sub.m[8 * i + j] = static_cast<int8_t>(-m);
          *scale++ = d * static_cast<float>(s);
          *min++ = -(dmin * static_cast<float>(m));
        }
      }
      return;
    }
    case DType::Q6_K: {
      const auto* b = reinterpret_cast<const BlockQ6_K*>(src);
      for (int64_t i = 0; i < cols / kQK_K; ++i) {
        const float d = f16_to_f32(b[i].d);
        sub.d[i] = b[i].d;
        uint8_t* y = u + i * kQK_K;
        for (int n = 0; n < 2; ++n) {  // 128 columns from 64 low bytes and 32 high bytes
          const uint8_t* ql = b[i].ql + 64 * n;
          const uint8_t* qh = b[i].qh + 32 * n;
          for (int l = 0; l < 32; ++l) {
            y[128 * n + l] = static_cast<uint8_t>((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4));
            y[128 * n + l + 32] = static_cast<uint8_t>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4));
            y[128 * n + l + 64] = static_cast<uint8_t>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
            y[128 * n + l + 96] = static_cast<uint8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
          }
        }
        for (int j = 0; j < 16; ++j) {  // codes 0..63 stand for -32..31
          const float s = d * static_cast<float>(b[i].scales[j]);
          sub.sc[16 * i + j] = b[i].scales[j];
          scale[16 * i + j] = s, min[16 * i + j] = -32.0f * s;
        }
      }
      return;
    }
    case DType::Q2_K: {
      const auto* b = reinterpret_cast<const BlockQ2_K*>(src);
      for (int64_t i = 0; i < cols / kQK_K; ++i) {
        const float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
        sub.d[i] = b[i].d, sub.dmin[i] = b[i].dmin;
        int is = 0;
        for (int n = 0; n < 2; ++n) {  // 128 columns from 32 bytes, four 2-bit planes
          const uint8_t* q = b[i].qs + 32 * n;
          for (int shift = 0; shift < 8; shift += 2) {
            for (int half = 0; half < 2; ++half, ++is) {
              const uint8_t sc = b[i].scales[is];
              for (int l = 0; l < 16; ++l) *u++ = static_cast<uint8_t>((q[l + 16 * half] >> shift) & 3);
              sub.sc[16 * i + is] = static_cast<int8_t>(sc & 0xF), sub.m[16 * i + is] = static_cast<int8_t>(-(sc >> 4));
              scale[16 * i + is] = d * static_cast<float>(sc & 0xF);
              min[16 * i + is] = -(dmin * static_cast<float>(sc >> 4));
            }
          }
        }
      }
      return;
    }
    case DType::Q3_K: {
      const auto* b = reinterpret_cast<const BlockQ3_K*>(src);
      for (int64_t i = 0; i < cols / kQK_K; ++i) {
        const float d = f16_to_f32(b[i].d);
        sub.d[i] = b[i].d;
        // Sixteen 6-bit scales: low 4 bits in bytes 0..7 (two per byte), high 2 in bytes 8..11.
        int8_t sc[16];
        for (int j = 0; j < 16; ++j) {
          const int low = j < 8 ? b[i].scales[j] & 0xF : b[i].scales[j - 8] >> 4;
          const int high = (b[i].scales[8 + j % 4] >> (2 * (j / 4))) & 3;
          sc[j] = static_cast<int8_t>((low | (high << 4)) - 32);
        }
        int is = 0;
        uint8_t mask = 1;
        for (int n = 0; n < 2; ++n) {
          const uint8_t* q = b[i].qs + 32 * n;
          for (int shift = 0; shift < 8; shift += 2, mask <<= 1) {
            for (int half = 0; half < 2; ++half, ++is) {
              for (int l = 0; l < 16; ++l) {
                const int k = l + 16 * half;
                // codes 0..7 stand for -4..3: the high bit set means no -4
                *u++ = static_cast<uint8_t>(((q[k] >> shift) & 3) + ((b[i].hmask[k] & mask) ? 4 : 0));
              }
              const float s = d * static_cast<float>(sc[is]);
              sub.sc[16 * i + is] = sc[is];
              scale[16 * i + is] = s, min[16 * i + is] = -4.0f * s;
            }
          }
        }
      }
      return;
    }
    default:
      assert(false && "fast_gemm_applies(t)");
  }
}

size_t block_bytes_of(FastFormat f) {
  const size_t code = f.sub_scales ? 1 : f.half_scales ? 2 : 4;
  const size_t per_row = code * (f.min_factor != 0.0f ? 1 : 2);  // a scale, and a min if stored
  const size_t codes = static_cast<size_t>(f.block) * kFastRows;  // one byte each
  const size_t quants = f.nibbles ? codes / 2 + codes * static_cast<size_t>(f.top_bits) / 8 : codes;
  return quants + kFastRows * per_row;
}

// A super-block's f16 factors for a group's rows: d, and dmin if mins are stored.
size_t super_bytes_of(FastFormat f) {
  return f.sub_scales ? kFastRows * sizeof(uint16_t) * (f.min_factor != 0.0f ? 1 : 2) : 0;
}

size_t group_bytes_of(FastFormat f, int64_t cols) {
  return block_bytes_of(f) * static_cast<size_t>(cols / f.block) +
         (f.sub_scales ? super_bytes_of(f) * static_cast<size_t>(cols / kQK_K) : 0);
}

float half_at(const uint8_t* at) {
  uint16_t h;
  std::memcpy(&h, at, 2);
  return f16_to_f32(h);
}

// A scale or min as the layout keeps it (f16 or float).
float read_scale(const FastWeightsView& v, const uint8_t* at) {
  if (v.half_scales) {
    uint16_t h;
    std::memcpy(&h, at, 2);
    return f16_to_f32(h);
  }
  float f;
  std::memcpy(&f, at, 4);
  return f;
}

// Row r's scale and min in block b of group g (fast_layout.h).
float scale_at(const FastWeightsView& v, int64_t g, int64_t b, int r) {
  const uint8_t* blk = v.block_at(g, b);
  if (v.sub_scales) {
    const auto code = static_cast<int8_t>(blk[v.quant_bytes() + r]);
    return half_at(v.super_at(g, b) + 2 * r) * static_cast<float>(code);
  }
  return read_scale(v, blk + v.quant_bytes() + r * v.scale_bytes());
}

float min_at(const FastWeightsView& v, int64_t g, int64_t b, int r) {
  if (v.min_factor != 0.0f) return scale_at(v, g, b, r) * v.min_factor;
  const uint8_t* blk = v.block_at(g, b);
  if (v.sub_scales) {
    const auto code = static_cast<int8_t>(blk[v.min_offset() + r]);
    return half_at(v.super_at(g, b) + 2 * (kFastRows + r)) * static_cast<float>(code);
  }
  return read_scale(v, blk + v.min_offset() + r * v.scale_bytes());
}

// Stores a scale or min as the layout keeps it (f16 only for values that are f16s).
void store_scale(const FastWeightsView& v, uint8_t* at, float x) {
  if (v.half_scales) {
    const uint16_t h = f32_to_f16(x);
    assert(f16_to_f32(h) == x || x != x);
    std::memcpy(at, &h, 2);
  } else {
    std::memcpy(at, &x, 4);
  }
}

// Where row r's code at column c of a block's quants lies (fast_layout.h):
// its byte, or its nibble (`high`: the upper one), and with top_bits the
// byte and shift of its top bits.
struct CodePlace {
  size_t at = 0;
  bool high = false;
  size_t top_at = 0;
  int top_shift = 0;
};

CodePlace code_place(const FastWeightsView& v, int r, int c) {
  const int vec = c / 4, lane = 4 * r + c % 4;
  CodePlace p;
  if (!v.nibbles) {
    p.at = static_cast<size_t>(vec) * 64 + lane;
    return p;
  }
  const int half = v.block / 8;  // vectors of nibbles
  p.high = vec >= half;
  p.at = static_cast<size_t>(vec % half) * 64 + lane;
  if (v.top_bits > 0) {
    const int per_plane = 8 / v.top_bits;  // code vectors whose top bits share a plane vector
    p.top_at = v.nibble_bytes() + static_cast<size_t>(vec / per_plane) * 64 + lane;
    p.top_shift = v.top_bits * (vec % per_plane);
  }
  return p;
}

int code_at(const FastWeightsView& v, const uint8_t* blk, int r, int c) {
  const CodePlace p = code_place(v, r, c);
  if (!v.nibbles) return blk[p.at];
  const int low = p.high ? blk[p.at] >> 4 : blk[p.at] & 0xF;
  return v.top_bits > 0 ? low | (((blk[p.top_at] >> p.top_shift) & ((1 << v.top_bits) - 1)) << 4) : low;
}

// Writes a code into a zeroed block.
void put_code(const FastWeightsView& v, uint8_t* blk, int r, int c, uint8_t code) {
  const CodePlace p = code_place(v, r, c);
  if (!v.nibbles) {
    blk[p.at] = code;
    return;
  }
  blk[p.at] |= p.high ? static_cast<uint8_t>((code & 0xF) << 4) : static_cast<uint8_t>(code & 0xF);
  if (v.top_bits > 0) blk[p.top_at] |= static_cast<uint8_t>((code >> 4) << p.top_shift);
}

}  // namespace

bool fast_gemm_applies(DType t) { return format_of(t).block > 0; }

FastActs fast_acts_for(const KernelTable& table, DType t) {
  return table.fast_super_kquants && format_of(t).sub_scales ? FastActs::kSuperBlocks : FastActs::kBlocks32;
}

size_t FastMatrix::packed_bytes(DType t, int64_t rows, int64_t cols) {
  const FastFormat f = format_of(t);
  return group_bytes_of(f, cols) * static_cast<size_t>((rows + kFastRows - 1) / kFastRows);
}

FastMatrix FastMatrix::pack(DType t, const void* w, int64_t rows, int64_t cols, PackedArena* arena,
                            const RowsRepacked& done, FastActs acts) {
  const FastFormat f = format_of(t);
  assert(f.block > 0 && cols % kQK == 0);
  assert(acts == FastActs::kBlocks32 || f.sub_scales);
  FastMatrix m;
  FastWeightsView& v = m.view_;
  v.rows = rows, v.cols = cols, v.block = f.block, v.nibbles = f.nibbles, v.top_bits = f.top_bits, v.code_max = f.code_max;
  v.half_scales = f.half_scales, v.min_factor = f.min_factor, v.sub_scales = f.sub_scales;
  v.super_acts = f.sub_scales && acts == FastActs::kSuperBlocks;
  v.super_shift = f.block == 32 ? 3 : 4;  // 256 columns: 8 blocks of 32, 16 of 16
  v.block_bytes = block_bytes_of(f);
  v.super_offset = v.block_bytes * static_cast<size_t>(cols / f.block);
  v.super_bytes = super_bytes_of(f);
  v.group_bytes = group_bytes_of(f, cols);
  assert(!f.sub_scales || cols % kQK_K == 0);
  const size_t total = packed_bytes(t, rows, cols);
  uint8_t* data = arena ? arena->take(total) : nullptr;
  if (data == nullptr) {
    m.owned_ = AlignedBytes(total);
    data = m.owned_.data();
  }
  v.data = data;
  const size_t src_row = row_bytes(t, cols);
  const int64_t nb = cols / f.block;
  std::vector<uint8_t> u(static_cast<size_t>(cols));
  std::vector<float> scale(static_cast<size_t>(nb)), min(static_cast<size_t>(nb));
  SubScales sub;
  if (f.sub_scales) {
    sub.sc.resize(static_cast<size_t>(nb)), sub.m.resize(static_cast<size_t>(nb));
    sub.d.resize(static_cast<size_t>(cols / kQK_K)), sub.dmin.resize(static_cast<size_t>(cols / kQK_K));
  }
  for (int64_t r = 0; r < rows; ++r) {
    decode_row(t, static_cast<const uint8_t*>(w) + r * src_row, cols, u.data(), scale.data(), min.data(), sub);
    const int64_t g = r / kFastRows;
    const int rr = static_cast<int>(r % kFastRows);
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* blk = data + g * v.group_bytes + b * v.block_bytes;
      for (int c = 0; c < f.block; ++c)  // the arena and owned_ are zeroed
        put_code(v, blk, rr, c, u[static_cast<size_t>(b * f.block + c)]);
      if (f.sub_scales) {
        // The codes and factors the scale and min came from: the kernels multiply them back.
        const size_t bi = static_cast<size_t>(b), si = static_cast<size_t>(b >> v.super_shift);
        blk[v.quant_bytes() + rr] = static_cast<uint8_t>(sub.sc[bi]);
        uint8_t* super = data + g * v.group_bytes + v.super_offset + si * v.super_bytes;
        std::memcpy(super + 2 * rr, &sub.d[si], 2);
        assert(f16_to_f32(sub.d[si]) * static_cast<float>(sub.sc[bi]) == scale[bi]);
        if (v.min_factor == 0.0f) {
          blk[v.min_offset() + rr] = static_cast<uint8_t>(sub.m[bi]);
          std::memcpy(super + 2 * (kFastRows + rr), &sub.dmin[si], 2);
          assert(f16_to_f32(sub.dmin[si]) * static_cast<float>(sub.m[bi]) == min[bi]);
        } else {
          assert(scale[bi] * v.min_factor == min[bi]);
        }
        continue;
      }
      store_scale(v, blk + v.quant_bytes() + rr * v.scale_bytes(), scale[static_cast<size_t>(b)]);
      if (v.min_factor == 0.0f) {
        store_scale(v, blk + v.min_offset() + rr * v.scale_bytes(), min[static_cast<size_t>(b)]);
      } else {
        assert(scale[static_cast<size_t>(b)] * v.min_factor == min[static_cast<size_t>(b)]);
      }
    }
    report_rows_repacked(done, r, rows);
  }
  return m;
}

float FastMatrix::weight(int64_t r, int64_t k) const {
  const FastWeightsView& v = view_;
  const uint8_t* blk = v.block_at(r / kFastRows, k / v.block);
  const int rr = static_cast<int>(r % kFastRows);
  const int code = code_at(v, blk, rr, static_cast<int>(k % v.block));
  return std::fma(scale_at(v, r / kFastRows, k / v.block, rr), static_cast<float>(code),
                  min_at(v, r / kFastRows, k / v.block, rr));
}

void FastActivations::resize(int64_t n_tokens, int64_t cols, FastActs form) {
  n_tokens_ = n_tokens, cols_ = cols, form_ = form;
  if (form == FastActs::kSuperBlocks) {
    assert(cols % kFastSuperBlock == 0);
    super_row_bytes_ = sizeof(BlockQ8_K) * static_cast<size_t>(cols / kFastSuperBlock);
    const size_t n = super_row_bytes_ * static_cast<size_t>(n_tokens);
    // 64 bytes of slack, as below.
    if (super_.size() < n + 64) super_.resize(n + 64);
    return;
  }
  assert(cols % kFastActBlock == 0);
  const size_t n = static_cast<size_t>(n_tokens) * static_cast<size_t>(cols);
  // 64 bytes of slack: a kernel may load a whole 16-token tile's last row in one go.
  if (q_.size() < n + 64) q_.resize(n + 64);
  if (d_.size() < n / 32) d_.resize(n / 32), dsum32_.resize(n / 32);
  if (dsum16_.size() < n / 16) dsum16_.resize(n / 16), bsum16_.resize(n / 16);
}

FastActsView FastActivations::view() const {
  if (form_ == FastActs::kSuperBlocks) {
    FastActsView v;
    v.super = super_.data(), v.super_row_bytes = super_row_bytes_, v.cols = cols_;
    return v;
  }
  FastActsView v;
  v.q = q_.data(), v.d = d_.data(), v.dsum32 = dsum32_.data(), v.dsum16 = dsum16_.data(), v.bsum16 = bsum16_.data();
  v.cols = cols_;
  return v;
}

void FastActivations::quantize_blocks(const float* x_row, int64_t t, int64_t b0, int64_t b1) {
  if (form_ == FastActs::kSuperBlocks) {
    // GGML's Q8_K quantizer (quants.h: its bits at every level), as the exact tier quantizes for K-quants.
    quantize_row(DType::Q8_K, x_row + b0 * kFastSuperBlock,
                 super_.data() + static_cast<size_t>(t) * super_row_bytes_ + static_cast<size_t>(b0) * sizeof(BlockQ8_K),
                 (b1 - b0) * kFastSuperBlock);
    return;
  }
  const int64_t nb = cols_ / kFastActBlock;
  const size_t at = static_cast<size_t>(t * nb + b0);
  kernel_table().fast_quantize(x_row + b0 * kFastActBlock, b1 - b0, q_.data() + t * cols_ + b0 * kFastActBlock,
                               d_.data() + at, dsum32_.data() + at, dsum16_.data() + 2 * at, bsum16_.data() + 2 * at);
}

void FastActivations::copy_row(const FastActivations& from, int64_t from_t, int64_t t) {
  assert(from.form_ == form_);
  if (form_ == FastActs::kSuperBlocks) {
    std::memcpy(super_.data() + static_cast<size_t>(t) * super_row_bytes_,
                from.super_.data() + static_cast<size_t>(from_t) * super_row_bytes_, super_row_bytes_);
    return;
  }
  const int64_t nb = cols_ / kFastActBlock;
  std::memcpy(q_.data() + t * cols_, from.q_.data() + from_t * cols_, static_cast<size_t>(cols_));
  std::memcpy(d_.data() + t * nb, from.d_.data() + from_t * nb, sizeof(float) * nb);
  std::memcpy(dsum32_.data() + t * nb, from.dsum32_.data() + from_t * nb, sizeof(float) * nb);
  std::memcpy(dsum16_.data() + 2 * t * nb, from.dsum16_.data() + 2 * from_t * nb, sizeof(float) * 2 * nb);
  std::memcpy(bsum16_.data() + 2 * t * nb, from.bsum16_.data() + 2 * from_t * nb, sizeof(int32_t) * 2 * nb);
}

float FastActivations::value(int64_t t, int64_t k) const {
  if (form_ == FastActs::kSuperBlocks) {
    const auto* y = reinterpret_cast<const BlockQ8_K*>(super_.data() + static_cast<size_t>(t) * super_row_bytes_) +
                    k / kFastSuperBlock;
    return static_cast<float>(y->qs[k % kFastSuperBlock]) * y->d;
  }
  return static_cast<float>(q_[static_cast<size_t>(t * cols_ + k)]) *
         d_[static_cast<size_t>(t * (cols_ / kFastActBlock) + k / kFastActBlock)];
}

namespace {

// The reference quantizer (fast_layout.h, FastQuantizeFn).
void fast_quantize_scalar(const float* x, int64_t n_blocks, int8_t* q, float* d_out, float* dsum32, float* dsum16,
                          int32_t* bsum16) {
  for (int64_t b = 0; b < n_blocks; ++b, x += kFastActBlock, q += kFastActBlock) {
    float amax = 0.0f;
    for (int k = 0; k < kFastActBlock; ++k) amax = std::max(amax, std::fabs(x[k]));
    const float d = amax / 127.0f;
    const float id = d > 0.0f ? 1.0f / d : 0.0f;
    int sum[2] = {0, 0};
    for (int k = 0; k < kFastActBlock; ++k) {
      // Round to nearest, ties to even, by adding and taking away 1.5 * 2^23
      // (exact for |v| <= 127), as the vector levels do.
      constexpr float kRound = 12582912.0f;
      const float v = x[k] * id;
      q[k] = static_cast<int8_t>(static_cast<int>((v + kRound) - kRound));
      sum[k / 16] += q[k];
    }
    d_out[b] = d;
    dsum32[b] = d * static_cast<float>(sum[0] + sum[1]);
    dsum16[2 * b] = d * static_cast<float>(sum[0]);
    dsum16[2 * b + 1] = d * static_cast<float>(sum[1]);
    bsum16[2 * b] = sum[0], bsum16[2 * b + 1] = sum[1];
  }
}

// The reference of the super-block form (fast_layout.h, super_acts). Its
// int32 sums cannot overflow: per block |sum u q| <= code_max x 127 x B and
// |bsum| <= 127 x B, so with Q6_K's (the largest: codes < 64, |sc| <= 128,
// mf = -32, 16 blocks) |isum| <= 16 x 128 x (63 x 127 x 16 + 32 x 127 x 16),
// under 2^29; Q5_K's 8 x 63 x 31 x 127 x 32 is under 2^26.
void fast_groups_super_scalar(const FastWeightsView& w, const FastActsView& a, int64_t t0, int64_t nt, int64_t g0,
                              int64_t g1, float* y, size_t y_stride) {
  const int per_super = kFastSuperBlock / w.block;
  const bool mins = w.min_factor == 0.0f;
  const auto mf = static_cast<int32_t>(w.min_factor);  // -32 or -4: an integer
  for (int64_t g = g0; g < g1; ++g) {
    const int rows = static_cast<int>(std::min<int64_t>(kFastRows, w.rows - g * kFastRows));
    for (int64_t i = 0; i < nt; ++i) {
      const auto* act = reinterpret_cast<const BlockQ8_K*>(a.super + static_cast<size_t>(t0 + i) * a.super_row_bytes);
      for (int r = 0; r < rows; ++r) {
        float acc = 0.0f;
        for (int64_t s = 0; s < w.blocks() / per_super; ++s) {
          const BlockQ8_K& q = act[s];
          int32_t isum = 0, msum = 0;
          for (int j = 0; j < per_super; ++j) {
            const int64_t b = s * per_super + j;
            const uint8_t* blk = w.block_at(g, b);
            int32_t dot = 0;
            for (int c = 0; c < w.block; ++c) dot += code_at(w, blk, r, c) * q.qs[j * w.block + c];
            const int32_t bsum = w.block == 16 ? q.bsums[j] : q.bsums[2 * j] + q.bsums[2 * j + 1];
            const int32_t sc = static_cast<int8_t>(blk[w.quant_bytes() + r]);
            isum += sc * dot;
            if (mins) {
              msum += static_cast<int8_t>(blk[w.min_offset() + r]) * bsum;
            } else {
              isum += mf * sc * bsum;
            }
          }
          const uint8_t* super = w.super_at(g, s * per_super);
          acc = std::fma(static_cast<float>(isum), half_at(super + 2 * r) * q.d, acc);
          if (mins) acc = std::fma(static_cast<float>(msum), half_at(super + 2 * (kFastRows + r)) * q.d, acc);
        }
        y[i * y_stride + g * kFastRows + r] = acc;
      }
    }
  }
}

// The reference: the arithmetic every level reproduces (fast_layout.h).
void fast_groups_scalar(const FastWeightsView& w, const FastActsView& a, int64_t t0, int64_t nt, int64_t g0,
                        int64_t g1, float* y, size_t y_stride) {
  if (w.super_acts) return fast_groups_super_scalar(w, a, t0, nt, g0, g1, y, y_stride);
  const int64_t nb32 = a.cols / 32;
  for (int64_t g = g0; g < g1; ++g) {
    const int rows = static_cast<int>(std::min<int64_t>(kFastRows, w.rows - g * kFastRows));
    for (int64_t i = 0; i < nt; ++i) {
      const int64_t t = t0 + i;
      const int8_t* q = a.q + t * a.cols;
      for (int r = 0; r < rows; ++r) {
        float acc = 0.0f;
        for (int64_t b = 0; b < w.blocks(); ++b) {
          const uint8_t* blk = w.block_at(g, b);
          int32_t isum = 0;
          for (int c = 0; c < w.block; ++c) isum += code_at(w, blk, r, c) * q[b * w.block + c];
          const int64_t ab = b * w.block / 32;  // the activation block holding weight block b
          if (w.min_factor != 0.0f) {  // the min folded in integers
            const int32_t* bsum = a.bsum16 + t * 2 * nb32 + b * w.block / 16;
            isum += static_cast<int32_t>(w.min_factor) * (w.block == 32 ? bsum[0] + bsum[1] : bsum[0]);
          }
          acc = std::fma(static_cast<float>(isum), scale_at(w, g, b, r) * a.d[t * nb32 + ab], acc);
          if (w.min_factor == 0.0f) {
            const float dsum = w.block == 32 ? a.dsum32[t * nb32 + b] : a.dsum16[t * 2 * nb32 + b];
            acc = std::fma(min_at(w, g, b, r), dsum, acc);
          }
        }
        y[i * y_stride + g * kFastRows + r] = acc;
      }
    }
  }
}

}  // namespace

void fill_fast_kernels(KernelTable& t, SimdLevel level) {
  t.fast_groups = fast_groups_scalar;
  t.fast_quantize = fast_quantize_scalar;
  if (level >= SimdLevel::kAvx2) t.fast_quantize = fast_quantize_avx2();
  if (level >= SimdLevel::kAvx512) t.fast_quantize = fast_quantize_avx512();
  if (level >= SimdLevel::kAvx2) t.fast_groups = fast_groups_avx2();
  if (level >= SimdLevel::kAvx512) t.fast_groups = fast_groups_avx512();
  if (level >= SimdLevel::kAmx) t.fast_groups = fast_groups_amx();
  // The super-block form has kernels of its own at the AVX2 and AVX-512
  // VNNI levels: they sum K-quants in far fewer float steps. AMX keeps
  // 32-column blocks for K-quants (a tile's product per block; no host here
  // runs AMX to measure a super-block kernel of its own).
  t.fast_super_kquants = level <= SimdLevel::kAvx512;
}

void fast_matmul_groups_with(const KernelTable& table, const FastMatrix& w, const FastActivations& a, int64_t first,
                             int64_t n_tokens, int64_t g0, int64_t g1, float* y, int64_t ldy) {
  if (g0 >= g1 || n_tokens <= 0) return;
  table.fast_groups(w.view(), a.view(), first, n_tokens, g0, g1, y, static_cast<size_t>(ldy));
}

void fast_matmul_groups(const FastMatrix& w, const FastActivations& a, int64_t first, int64_t n_tokens, int64_t g0,
                        int64_t g1, float* y, int64_t ldy) {
  fast_matmul_groups_with(kernel_table(), w, a, first, n_tokens, g0, g1, y, ldy);
}

}  // namespace inferd::kernels
