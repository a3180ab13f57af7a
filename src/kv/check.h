// Contract checks that stay on in release builds: a caller breaking the KV
// cache's preconditions (freeing a block twice, allocating more than is free)
// would otherwise corrupt shared state silently, far from the bug.
#pragma once
#include <cstdio>
#include <cstdlib>

#define INFERD_KV_CHECK(cond, msg)                                                      \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      std::fprintf(stderr, "%s:%d: KV cache contract violated: %s (%s)\n", __FILE__,    \
                   __LINE__, msg, #cond);                                               \
      std::abort();                                                                     \
    }                                                                                   \
  } while (0)
