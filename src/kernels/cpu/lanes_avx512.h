// Lane helpers shared by the AVX-512 kernels (included only by *_avx512.cpp
// files, which are compiled with AVX-512 enabled).
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace inferd::kernels::detail {

// Internal linkage: each including file carries its own copy.
namespace {

// acc + the dot products of u8's 4-byte groups with the 4 int8 at s8, in
// every lane: dpbusd with its embedded broadcast from memory (the intrinsic
// with _mm512_set1_epi32 of a loaded word becomes a load to a general
// register and a broadcast from it, a second uop per product).
inline __m512i dpbusd_broadcast(__m512i acc, __m512i u8, const int8_t* s8) {
  asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u8), "m"(*reinterpret_cast<const int32_t*>(s8)));
  return acc;
}

// acc + the products of x's int16 pairs with the pair at p, summed in int32
// lanes: vpdpwssd with its embedded broadcast from memory.
inline __m512i dpwssd_broadcast(__m512i acc, __m512i x, const int16_t* p) {
  asm("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(x), "m"(*reinterpret_cast<const int32_t*>(p)));
  return acc;
}

// The first n lanes of sixteen (none for n <= 0, all for n >= 16).
inline __mmask16 first_lanes(int64_t n) {
  return static_cast<__mmask16>(n >= 16 ? 0xFFFF : n <= 0 ? 0 : (1u << n) - 1);
}

// _mm512_reduce_add_ps run lane-wise on sixteen vectors: lane l of the result
// is the sum of y_l's lanes, to the bit, by the same pairing tree (halves,
// quarters, pairs, then the last two) done with shuffles. The tree leaves the
// sum of input i in lane 4 * (i % 4) + i / 4, so inputs are taken in that
// (self-inverse) order, kTreeOrder, for lane l to end up with y_l. Its four
// levels are separate functions so that a caller can walk the tree while it
// computes the inputs, holding a few vectors instead of sixteen:
//   a_k = tree_pairs(y[kTreeOrder[2k]], y[kTreeOrder[2k+1]])   k < 8
//   b_k = tree_quads(a_2k, a_2k+1)                              k < 4
//   c_k = tree_halves(b_2k, b_2k+1)                             k < 2
//   result = tree_last(c_0, c_1)
constexpr int kTreeOrder[16] = {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};

// The tree's combining step: a float sum by default; any operation that is
// the same in either order (the lanes' maxima, integer sums) walks it too.
struct AddLanes {
  __m512 operator()(__m512 a, __m512 b) const { return _mm512_add_ps(a, b); }
};
struct MaxLanes {
  __m512 operator()(__m512 a, __m512 b) const { return _mm512_max_ps(a, b); }
};
struct AddIntLanes {  // int32 lanes in float vectors
  __m512 operator()(__m512 a, __m512 b) const {
    return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(a), _mm512_castps_si512(b)));
  }
};

template <typename Op = AddLanes>
inline __m512 tree_pairs(__m512 p, __m512 q, Op op = {}) {  // x[i] + x[i + 8], two vectors per result
  return op(_mm512_shuffle_f32x4(p, q, 0x44), _mm512_shuffle_f32x4(p, q, 0xEE));
}
template <typename Op = AddLanes>
inline __m512 tree_quads(__m512 a0, __m512 a1, Op op = {}) {  // a[i] + a[i + 4], four vectors per result
  return op(_mm512_shuffle_f32x4(a0, a1, 0x88), _mm512_shuffle_f32x4(a0, a1, 0xDD));
}
template <typename Op = AddLanes>
inline __m512 tree_halves(__m512 b0, __m512 b1, Op op = {}) {  // b[0] + b[2], b[1] + b[3]
  return op(_mm512_shuffle_ps(b0, b1, _MM_SHUFFLE(1, 0, 1, 0)), _mm512_shuffle_ps(b0, b1, _MM_SHUFFLE(3, 2, 3, 2)));
}
template <typename Op = AddLanes>
inline __m512 tree_last(__m512 c0, __m512 c1, Op op = {}) {
  return op(_mm512_shuffle_ps(c0, c1, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_ps(c0, c1, _MM_SHUFFLE(3, 1, 3, 1)));
}

// Lane r of the result is x[r]'s sixteen lanes combined by op (the tree
// above over all sixteen at once): every vector's lanes are combined in the
// same pattern whichever r it sits at (a + b is b + a to the bit).
template <typename Op = AddLanes, typename Load>
inline __m512 lanes_of_16(Load&& x, Op op = {}) {
  __m512 a[8], b[4], c[2];
  for (int k = 0; k < 8; ++k) a[k] = tree_pairs(x(kTreeOrder[2 * k]), x(kTreeOrder[2 * k + 1]), op);
  for (int k = 0; k < 4; ++k) b[k] = tree_quads(a[2 * k], a[2 * k + 1], op);
  for (int k = 0; k < 2; ++k) c[k] = tree_halves(b[2 * k], b[2 * k + 1], op);
  return tree_last(c[0], c[1], op);
}

inline __m512 sum_lanes_of_16(const float (*x)[16]) {
  return lanes_of_16([x](int r) { return _mm512_load_ps(x[r]); });
}

}  // namespace
}  // namespace inferd::kernels::detail
