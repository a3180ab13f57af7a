#include "core/aligned_bytes.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace inferd {

namespace {

[[noreturn]] void out_of_memory(size_t n) {
  std::fprintf(stderr, "inferd: out of memory allocating %zu bytes\n", n);
  std::abort();
}

}  // namespace

AlignedBytes::AlignedBytes(size_t n, bool huge_pages, bool zeroed) : n_(n) {
  constexpr size_t kHugePage = size_t{2} << 20;
  if (huge_pages) {
    // Anonymous pages straight from the kernel, on a 2 MiB boundary: zero
    // without a memset, and committed only as they are first written, so a
    // buffer filled piece by piece (repacked weights, while the file's pages
    // of them are given back) never holds more than what is written.
    const size_t size = (std::max<size_t>(n, 1) + kHugePage - 1) / kHugePage * kHugePage;
    const size_t len = size + kHugePage;
    void* m = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) out_of_memory(n);
    auto* first = static_cast<uint8_t*>(m);
    auto* p = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(first) + kHugePage - 1) & ~(kHugePage - 1));
    if (p > first) ::munmap(first, static_cast<size_t>(p - first));
    if (const size_t tail = static_cast<size_t>(first + len - (p + size)); tail > 0) ::munmap(p + size, tail);
#if defined(MADV_HUGEPAGE)
    // Advice only: without transparent huge pages the buffer works the same.
    ::madvise(p, size, MADV_HUGEPAGE);
#endif
    p_ = std::unique_ptr<uint8_t[], AlignedBytesFree>(p, AlignedBytesFree{size});
    return;
  }
  const size_t size = (std::max<size_t>(n, 1) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, size);
  if (p == nullptr) out_of_memory(n);
  if (zeroed) std::memset(p, 0, n);
  p_.reset(static_cast<uint8_t*>(p));
}

void AlignedBytesFree::operator()(uint8_t* p) const {
  if (mapped > 0) ::munmap(p, mapped);
  else std::free(p);
}

}  // namespace inferd
