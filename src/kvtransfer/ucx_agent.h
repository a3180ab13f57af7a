// The KV transfer's transport over UCX: one ucp context and worker per
// instance, driven by one progress thread that alone makes UCX calls (other
// threads talk to it through a locked queue), so the worker runs in UCX's
// single-thread mode.
//
// A producer maps its KV pool (ucp_mem_map) and listens on kv_ip:kv_port. A
// consumer connects to a producer on its first pull and handshakes: it sends
// its KVDescriptor and engine id, the producer compares the descriptors and
// answers with a refusal naming the first field that differs, or with its
// pool's base addresses, block count and packed rkeys. Blocks then move by
// one-sided reads (ucp_get_nbx) straight from the producer's pool into the
// consumer's allocated pool blocks: one read per contiguous segment (per
// layer, keys and values; a run of consecutive blocks is one segment per
// layer). Over TCP, UCX carries the reads as messages the producer's worker
// answers (its progress thread does); over shared memory they are copies by
// the kernel from one process into the other (CMA); with RDMA, the NIC's.
//
// After the reads complete, the consumer releases the lease; the producer
// answers whether it was still held (LeaseTable), and only then is the pull
// a success. A pull fails, and is reported failed only when nothing can
// write into its local blocks any more, when: the peer refuses the
// handshake, its connection breaks, a read fails, the lease had expired, or
// the deadline passes (the endpoint is then closed by force, which cancels
// its outstanding reads, before the failure is reported).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/result.h"
#include "kvtransfer/descriptor.h"
#include "kvtransfer/lease_table.h"

namespace inferd::kvtransfer {

struct AgentConfig {
  KVDescriptor descriptor;
  PoolMemory pool;        // this instance's KV pool
  std::string engine_id;  // told to peers; a consumer checks the producer's
  // Producer: listen here (port 0: any free port, see UcxAgent::port) and
  // answer releases from `leases` (which must outlive the agent).
  bool listen = false;
  std::string ip = "127.0.0.1";
  uint16_t port = 0;
  LeaseTable* leases = nullptr;
};

struct PullSpec {
  uint64_t id = 0;  // the caller's, reported back
  std::string host;
  uint16_t port = 0;
  std::string engine_id;  // the producer's expected engine id (empty: any)
  uint64_t lease_id = 0;
  std::vector<std::pair<int32_t, int32_t>> blocks;  // (producer's block, this pool's block)
  double timeout_s = 5.0;
};

struct PullResult {
  uint64_t id = 0;
  bool ok = false;
  std::string error;  // why not
  uint64_t bytes = 0;
  double seconds = 0.0;  // from start_pull to the lease's confirmation
};

struct AgentStats {
  int64_t handshakes = 0, refusals = 0;  // as a consumer: handshakes done, peers refused
  int64_t shared_memory_handshakes = 0;   // of those done, the ones whose reads go over shared memory
  int64_t mapped_handshakes = 0;          // of those, the ones that mapped the producer's pool (memcpy reads)
  int64_t leases_released_unused = 0;     // leases given back without a pull (release_lease), confirmed
  int64_t pulls_ok = 0, pulls_failed = 0, pulls_timed_out = 0;
  int64_t blocks_received = 0, bytes_received = 0;
  double pull_seconds = 0.0;  // summed over successful pulls
  int64_t peers_accepted = 0, peers_refused = 0;  // as a producer
};

class UcxAgent {
 public:
  static Result<std::unique_ptr<UcxAgent>> create(const AgentConfig& config);
  ~UcxAgent();  // stops the thread; unfinished pulls fail (reported to no one)
  UcxAgent(const UcxAgent&) = delete;
  UcxAgent& operator=(const UcxAgent&) = delete;

  // The port the producer listens on.
  uint16_t port() const { return port_; }
  // Any thread: starts moving blocks; the result comes from take_finished.
  void start_pull(PullSpec spec);
  // Any thread: ends a lease this instance will not pull (its own pool held
  // the prefix, or the request ended first), so that the producer frees the
  // blocks now rather than when the lease expires. Reported to no one; a
  // failure only leaves the lease to expire.
  void release_lease(const std::string& host, uint16_t port, const std::string& engine_id, uint64_t lease_id);
  // Any thread: pulls finished since the last call.
  std::vector<PullResult> take_finished();
  // Called on the progress thread after a pull finishes (wakes a waiting loop).
  void set_on_finished(std::function<void()> f);
  AgentStats stats() const;

  struct Impl;

 private:
  explicit UcxAgent(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  uint16_t port_ = 0;
};

}  // namespace inferd::kvtransfer
