#include "kvtransfer/descriptor.h"

#include <cstring>

namespace inferd::kvtransfer {

namespace {

template <typename T>
std::string list(const std::vector<T>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(v[i]);
  }
  return s + "]";
}

template <typename T>
std::optional<std::string> differs(const char* field, const T& mine, const T& theirs) {
  if (mine == theirs) return std::nullopt;
  if constexpr (std::is_integral_v<T>)
    return std::string(field) + " differs (here " + std::to_string(mine) + ", peer " + std::to_string(theirs) + ")";
  else
    return std::string(field) + " differs (here " + list(mine) + ", peer " + list(theirs) + ")";
}

}  // namespace

std::optional<std::string> KVDescriptor::mismatch(const KVDescriptor& p) const {
  // The layout fields first: they say more than "the fingerprint differs".
  if (auto d = differs("KV dtype", dtype, p.dtype)) return d;
  if (auto d = differs("block size", block_size, p.block_size)) return d;
  if (auto d = differs("layer count", n_layers, p.n_layers)) return d;
  if (auto d = differs("KV head count", n_kv_heads, p.n_kv_heads)) return d;
  if (auto d = differs("head dim", head_dim, p.head_dim)) return d;
  if (auto d = differs("layers per block", layers_per_block, p.layers_per_block)) return d;
  if (auto d = differs("bytes per block", block_bytes, p.block_bytes)) return d;
  if (auto d = differs("KV group windows", group_windows, p.group_windows)) return d;
  if (auto d = differs("layer groups", layer_group, p.layer_group)) return d;
  if (auto d = kv::spec_mismatch(group_specs, p.group_specs)) return d;
  if (fingerprint != p.fingerprint)
    return "model fingerprint differs (another model file, quantization or numerics build)";
  return std::nullopt;
}

std::vector<BlockRun> block_runs(std::span<const std::pair<int32_t, int32_t>> blocks) {
  std::vector<BlockRun> runs;
  for (const auto& [remote, local] : blocks) {
    if (!runs.empty()) {
      BlockRun& last = runs.back();
      if (last.remote + last.count == remote && last.local + last.count == local) {
        ++last.count;
        continue;
      }
    }
    runs.push_back({remote, local, 1});
  }
  return runs;
}

bool Reader::raw(void* p, size_t n) {
  if (left() < n) return false;
  std::memcpy(p, bytes_.data() + at_, n);
  at_ += n;
  return true;
}

bool Reader::str(std::string& s, size_t max) {
  uint32_t n = 0;
  if (!u32(n) || n > max || left() < n) return false;
  s.assign(reinterpret_cast<const char*>(bytes_.data() + at_), n);
  at_ += n;
  return true;
}

void write(Writer& w, const KVDescriptor& d) {
  w.u64(d.fingerprint);
  for (int32_t v : {d.dtype, d.block_size, d.n_layers, d.n_kv_heads, d.head_dim, d.layers_per_block})
    w.u32(static_cast<uint32_t>(v));
  w.u64(d.block_bytes);
  w.u32(static_cast<uint32_t>(d.group_windows.size()));
  for (int64_t v : d.group_windows) w.i64(v);
  w.u32(static_cast<uint32_t>(d.layer_group.size()));
  for (int32_t v : d.layer_group) w.u32(static_cast<uint32_t>(v));
  w.u32(static_cast<uint32_t>(d.group_specs.size()));
  for (const kv::KVCacheSpec& g : d.group_specs) {
    w.u8(static_cast<uint8_t>(g.kind));
    for (uint32_t v : {static_cast<uint32_t>(g.dtype), static_cast<uint32_t>(g.num_kv_heads),
                       static_cast<uint32_t>(g.head_size), static_cast<uint32_t>(g.block_size)})
      w.u32(v);
    w.i64(g.sliding_window);
  }
}

bool read(Reader& r, KVDescriptor& d) {
  uint32_t f[6];
  if (!r.u64(d.fingerprint)) return false;
  for (uint32_t& v : f)
    if (!r.u32(v)) return false;
  d.dtype = static_cast<int32_t>(f[0]);
  d.block_size = static_cast<int32_t>(f[1]);
  d.n_layers = static_cast<int32_t>(f[2]);
  d.n_kv_heads = static_cast<int32_t>(f[3]);
  d.head_dim = static_cast<int32_t>(f[4]);
  d.layers_per_block = static_cast<int32_t>(f[5]);
  uint32_t n = 0;
  if (!r.u64(d.block_bytes) || !r.u32(n) || n > 4096) return false;
  d.group_windows.resize(n);
  for (int64_t& v : d.group_windows)
    if (!r.i64(v)) return false;
  if (!r.u32(n) || n > 4096) return false;
  d.layer_group.resize(n);
  for (int32_t& v : d.layer_group) {
    uint32_t u = 0;
    if (!r.u32(u)) return false;
    v = static_cast<int32_t>(u);
  }
  // The groups' specs: read as numbers, compared as they are (an unknown
  // kind or dtype is simply a spec that differs).
  if (!r.u32(n) || n > 4096) return false;
  d.group_specs.resize(n);
  for (kv::KVCacheSpec& g : d.group_specs) {
    uint8_t kind = 0;
    uint32_t u[4];
    if (!r.u8(kind)) return false;
    for (uint32_t& v : u)
      if (!r.u32(v)) return false;
    g.kind = static_cast<kv::KVCacheKind>(kind);
    g.dtype = static_cast<DType>(u[0]);
    g.num_kv_heads = static_cast<int32_t>(u[1]);
    g.head_size = static_cast<int32_t>(u[2]);
    g.block_size = static_cast<int32_t>(u[3]);
    if (!r.i64(g.sliding_window)) return false;
  }
  return true;
}

}  // namespace inferd::kvtransfer
