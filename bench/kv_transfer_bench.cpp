// Benchmark (b) of issue 20: KV transfer throughput against a memcpy of the
// same bytes (the floor). A producer agent (kvtransfer/) in a child process
// and a consumer agent in this one, on pools laid out
// as the default model's (SmolLM2-135M: 30 layers, 3 KV heads of 64, blocks
// of 16 tokens: 60 segments of 6 KiB, 360 KiB a block). The consumer pulls N
// blocks; the floor copies the same segments from pool to pool with memcpy.
// The producer's pool is on shared memory, as a KV producer's is
// (model/kv_cache.h), and the child serves it twice: once offering its memfds
// (the consumer maps them and copies with memcpy) and once not (the consumer
// reads by process_vm_readv). UCX_TLS picks the transports (e.g. tcp, or
// sm,tcp; with tcp both stay on UCX's TCP).
//
//   kv_transfer_bench [MiB=64] [repeats=5]
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "core/aligned_bytes.h"
#include "core/shared_bytes.h"
#include "kvtransfer/lease_table.h"
#include "kvtransfer/ucx_agent.h"

using namespace inferd::kvtransfer;

namespace {

constexpr int32_t kLayers = 30;
constexpr uint64_t kSegment = 16 * 192 * 2;  // block size x kv_dim x f16

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Allocated as the engine's KV cache is (model/kv_cache.cpp): on 2 MiB
// boundaries, advised as transparent huge pages, or (a producer's) on shared
// memory.
struct Pool {
  Pool(int64_t n_blocks, bool shared) : n_blocks(n_blocks) {
    for (int i = 0; i < 2; ++i) {
      const size_t n = kLayers * n_blocks * kSegment;
      if (shared) {
        auto b = inferd::SharedBytes::create(n, "inferd-kv");
        if (!b) std::fprintf(stderr, "%s\n", b.error().message.c_str()), std::exit(1);
        shared_regions[i] = std::move(*b);
        base[i] = shared_regions[i].data();
      } else {
        regions[i] = inferd::AlignedBytes(n, /*huge_pages=*/true, /*zeroed=*/false);
        base[i] = regions[i].data();
      }
      std::memset(base[i], 1, n);  // touched: no page faults in the timed part
    }
  }
  std::byte* region(int i) { return reinterpret_cast<std::byte*>(base[i]); }
  PoolMemory memory(bool offer_fds) {
    PoolMemory m{{region(0), region(1)}, kLayers, n_blocks, kSegment};
    if (offer_fds && shared_regions[0]) {
      m.region_fds = {shared_regions[0].fd(), shared_regions[1].fd()};
      m.shared_name = "inferd-kv";
    }
    return m;
  }
  int64_t n_blocks;
  inferd::AlignedBytes regions[2];
  inferd::SharedBytes shared_regions[2];
  uint8_t* base[2] = {};
};

KVDescriptor descriptor() {
  KVDescriptor d;
  d.dtype = 1;
  d.block_size = 16;
  d.n_layers = kLayers;
  d.n_kv_heads = 3;
  d.head_dim = 64;
  d.layers_per_block = kLayers;
  d.block_bytes = 2 * kLayers * kSegment;
  d.group_windows = {0};
  d.layer_group.assign(kLayers, 0);
  return d;
}

// The floor: every segment of every block copied, as a pull moves them.
double memcpy_seconds(Pool& src, Pool& dst, const std::vector<std::pair<int32_t, int32_t>>& blocks) {
  const double t0 = now_s();
  for (const auto& [from, to] : blocks)
    for (int r = 0; r < 2; ++r)
      for (int32_t s = 0; s < kLayers; ++s)
        std::memcpy(dst.region(r) + (s * dst.n_blocks + to) * kSegment,
                    src.region(r) + (s * src.n_blocks + from) * kSegment, kSegment);
  return now_s() - t0;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t mib = argc > 1 ? std::atoll(argv[1]) : 64;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 5;
  const uint64_t block_bytes = 2 * kLayers * kSegment;
  const int64_t n = static_cast<int64_t>((mib << 20) / block_bytes);
  Pool prod(n + 1, /*shared=*/true), cons(n + 1, /*shared=*/false);
  // The producer runs in a child process (as a prefill instance would), its
  // leases all held; it tells its ports through a pipe and serves until
  // killed: the first agent offers the pool's memfds, the second does not.
  int fds[2];
  if (pipe(fds) != 0) return 1;
  const pid_t child = fork();
  if (child == 0) {
    LeaseTable leases;
    for (uint64_t id = 1; id < 1000; ++id) leases.add(id, now_s() + 3600);
    AgentConfig mapped{descriptor(), prod.memory(true), "bench-prefill", true, "127.0.0.1", 0, &leases};
    AgentConfig read{descriptor(), prod.memory(false), "bench-prefill", true, "127.0.0.1", 0, &leases};
    auto a = UcxAgent::create(mapped), b = UcxAgent::create(read);
    const uint16_t ports[2] = {a ? (*a)->port() : uint16_t{0}, b ? (*b)->port() : uint16_t{0}};
    if (write(fds[1], ports, sizeof ports) != sizeof ports) _exit(1);
    for (;;) pause();
  }
  struct KillChild {  // before anything can return: a producer that failed to start waits too
    pid_t pid;
    ~KillChild() {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  } kill_child{child};
  uint16_t ports[2] = {};
  if (read(fds[0], ports, sizeof ports) != sizeof ports || ports[0] == 0 || ports[1] == 0)
    return std::fprintf(stderr, "no producer\n"), 1;
  AgentConfig cc{descriptor(), cons.memory(false), "bench-decode", false, "", 0, nullptr};
  auto consumer = UcxAgent::create(cc);
  if (!consumer) return std::fprintf(stderr, "%s\n", consumer.error().message.c_str()), 1;

  const char* tls = std::getenv("UCX_TLS");
  std::printf("UCX_TLS=%s: %lld blocks of %llu KiB (%.1f MiB)\n", tls ? tls : "(default)", static_cast<long long>(n),
              static_cast<unsigned long long>(block_bytes >> 10), n * block_bytes / 1048576.0);
  // Consecutive blocks on both sides (one read per layer and K/V for the
  // whole run), and scattered ones (one read per segment).
  std::vector<std::pair<int32_t, int32_t>> consecutive, scattered;
  std::vector<int32_t> perm(n);
  std::iota(perm.begin(), perm.end(), 1);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(1));
  for (int32_t i = 0; i < n; ++i) {
    consecutive.emplace_back(i + 1, i + 1);
    scattered.emplace_back(perm[i], i + 1);
  }
  // The same copies from a pool on huge pages, as the floor would be without
  // shared memory (a memfd has 4 KiB pages where shared memory has no
  // transparent huge pages).
  {
    Pool huge(n + 1, /*shared=*/false);
    for (const auto& [pattern, blocks] : {std::pair{"consecutive", &consecutive}, std::pair{"scattered", &scattered}}) {
      double best = 1e9;
      for (int rep = 0; rep < repeats; ++rep) best = std::min(best, memcpy_seconds(huge, cons, *blocks));
      std::printf("%-11s memcpy from a pool on huge pages %7.2f ms (%6.2f GB/s)\n", pattern, best * 1e3,
                  static_cast<double>(blocks->size() * block_bytes) / best / 1e9);
    }
  }
  uint64_t lease = 1;
  for (const auto& [pattern, blocks] : {std::pair{"consecutive", &consecutive}, std::pair{"scattered", &scattered}})
  for (const auto& [how, port] : {std::pair{"memfd", ports[0]}, std::pair{"no memfd", ports[1]}}) {
    double best_pull = 1e9, best_copy = 1e9;
    for (int rep = 0; rep < repeats + 1; ++rep) {  // the first also connects: not counted
      const double t0 = now_s();
      (*consumer)->start_pull(PullSpec{lease, "127.0.0.1", port, "", lease, *blocks, 60.0});
      ++lease;
      std::vector<PullResult> done;
      while ((done = (*consumer)->take_finished()).empty()) std::this_thread::yield();
      const double t = now_s() - t0;
      if (!done[0].ok) return std::fprintf(stderr, "pull failed: %s\n", done[0].error.c_str()), 1;
      if (rep > 0) best_pull = std::min(best_pull, t);
      best_copy = std::min(best_copy, memcpy_seconds(prod, cons, *blocks));
    }
    const double bytes = static_cast<double>(blocks->size() * block_bytes);
    std::printf("%-11s %-8s  pull %7.2f ms (%6.2f GB/s)  memcpy %7.2f ms (%6.2f GB/s)  ratio %.2f\n", pattern, how,
                best_pull * 1e3, bytes / best_pull / 1e9, best_copy * 1e3, bytes / best_copy / 1e9,
                best_copy / best_pull);
  }
  return 0;
}
