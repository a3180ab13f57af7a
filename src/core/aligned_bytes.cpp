#include "core/aligned_bytes.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace inferd {

AlignedBytes::AlignedBytes(size_t n, bool huge_pages, bool zeroed) : n_(n) {
  constexpr size_t kHugePage = size_t{2} << 20;
  const size_t align = huge_pages ? kHugePage : 64;
  const size_t size = (std::max<size_t>(n, 1) + align - 1) / align * align;
  void* p = std::aligned_alloc(align, size);
  if (p == nullptr) {
    std::fprintf(stderr, "inferd: out of memory allocating %zu bytes\n", n);
    std::abort();
  }
#if defined(MADV_HUGEPAGE)
  // Advice only: without transparent huge pages the buffer works the same.
  if (huge_pages) madvise(p, size, MADV_HUGEPAGE);
#endif
  if (zeroed) std::memset(p, 0, n);
  p_.reset(static_cast<uint8_t*>(p));
}

void AlignedBytes::Free::operator()(uint8_t* p) const { std::free(p); }

}  // namespace inferd
