// The orthonormal Walsh-Hadamard rotation (Sylvester's order, scaled by
// 1/sqrt(n): its own inverse) applied to consecutive chunks of a vector.
// A quantized KV cache stores keys and values rotated (and queries are
// rotated like keys, so their dot products are unchanged): the rotation
// spreads a few large elements over the whole chunk before a block's scale is
// chosen, as llama.cpp's KV cache does (llama-kv-cache.cpp, attn_rot_k/v).
#pragma once
#include <cstdint>

namespace inferd::kernels {

// x[0, n) := H_chunk x, chunk by chunk (n a multiple of chunk, a power of two).
void hadamard_rotate(float* x, int64_t n, int64_t chunk);

}  // namespace inferd::kernels
