// Sizes in bytes as people write them (--kv-cache-memory 2G, kv_cache_memory="512M").
#pragma once
#include <cstdint>
#include <string>

namespace inferd {

// "1073741824", "512M", "2G", "1.5GiB" -> bytes; -1 if malformed or not positive.
int64_t parse_bytes(const std::string& s);

}  // namespace inferd
