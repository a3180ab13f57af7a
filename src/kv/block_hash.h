// Content hashes for prefix caching. A full block of tokens is identified by a
// chained hash: hash(parent block's hash, the block's token ids, an extra key
// such as a hashed cache salt). Chaining makes a block's hash stand for the
// whole prefix up to and including it, so equal hashes mean equal prefixes
// (up to 64-bit collisions: with a million cached blocks the chance that any
// two distinct prefixes collide is about 3e-8).
#pragma once
#include <cstdint>
#include <span>
#include <string_view>

namespace inferd::kv {

using BlockHash = uint64_t;

// Parent hash of a sequence's first block.
inline constexpr BlockHash kRootBlockHash = 0x6a09e667f3bcc908ull;

// Hash of one full block given its parent's hash. `extra_key` separates caches
// that must never share blocks (0: none).
BlockHash hash_block(BlockHash parent, std::span<const int32_t> tokens, uint64_t extra_key);

// The key under which KV group `group` caches the block whose prefix hash is
// `prefix_hash`: each group's block holds other layers' keys and values, so
// the groups never share a block. Group 0's key is the prefix hash itself.
BlockHash group_block_hash(BlockHash prefix_hash, int32_t group);

// 64-bit hash of arbitrary bytes, for turning a cache salt into an extra key.
// The empty string maps to 0 ("no extra key").
uint64_t hash_bytes(std::string_view bytes);

}  // namespace inferd::kv
