#include "kv/block_hash.h"

#include <algorithm>
#include <cstring>

namespace inferd::kv {

namespace {

// The multiply-xorshift construction of MurmurHash2-64A (public domain, Austin
// Appleby) over 64-bit words: every input word is mixed on its own before it
// enters the state, and the state is finalized so every output bit depends on
// every input bit.
constexpr uint64_t kMul = 0xc6a4a7935bd1e995ull;
constexpr int kShift = 47;

class Hasher {
 public:
  Hasher(uint64_t seed, uint64_t n_words) : h_(seed ^ (n_words * kMul)) {}
  void add(uint64_t k) {
    k *= kMul;
    k ^= k >> kShift;
    k *= kMul;
    h_ ^= k;
    h_ *= kMul;
  }
  uint64_t finish() const {
    uint64_t h = h_;
    h ^= h >> kShift;
    h *= kMul;
    h ^= h >> kShift;
    return h;
  }

 private:
  uint64_t h_;
};

constexpr uint64_t kSeed = 0x3c6ef372fe94f82bull;

}  // namespace

BlockHash hash_block(BlockHash parent, std::span<const int32_t> tokens, uint64_t extra_key) {
  // Words: parent, extra key, the token count, then the tokens two per word.
  const uint64_t n_words = 3 + (tokens.size() + 1) / 2;
  Hasher h(kSeed, n_words);
  h.add(parent);
  h.add(extra_key);
  h.add(tokens.size());
  size_t i = 0;
  for (; i + 1 < tokens.size(); i += 2)
    h.add(static_cast<uint32_t>(tokens[i]) | (uint64_t{static_cast<uint32_t>(tokens[i + 1])} << 32));
  if (i < tokens.size()) h.add(static_cast<uint32_t>(tokens[i]));
  return h.finish();
}

BlockHash group_block_hash(BlockHash prefix_hash, int32_t group) {
  if (group == 0) return prefix_hash;
  Hasher h(kSeed ^ 0xbb67ae8584caa73bull, 2);
  h.add(prefix_hash);
  h.add(static_cast<uint64_t>(group));
  return h.finish();
}

uint64_t hash_bytes(std::string_view bytes) {
  if (bytes.empty()) return 0;
  Hasher h(kSeed ^ 0xa54ff53a5f1d36f1ull, (bytes.size() + 7) / 8 + 1);
  h.add(bytes.size());  // so "a" and "a\0" differ
  for (size_t i = 0; i < bytes.size(); i += 8) {
    uint64_t w = 0;
    std::memcpy(&w, bytes.data() + i, std::min<size_t>(8, bytes.size() - i));
    h.add(w);
  }
  const uint64_t r = h.finish();
  return r == 0 ? 1 : r;  // 0 means "no extra key"
}

}  // namespace inferd::kv
