// The producer's leases on KV blocks held for a remote decode. The engine
// holds a finished prompt's blocks (reference counts in its pool) under a
// lease and frees them once the lease ends: when the consumer says it has read
// them, or when the lease expires. The consumer then asks whether the lease was
// still held when it said so, since blocks of an expired lease may have been
// reused while it read them; a lease that ends here is never held again, so
// "still held" proves the bytes read were the prompt's.
//
// The transport's thread releases, the engine's thread adds and frees;
// both go through this table's lock.
#pragma once
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace inferd::kvtransfer {

struct LeaseStats {
  int64_t held = 0;      // leases now held
  int64_t released = 0;  // ended by the consumer
  int64_t expired = 0;   // ended by their deadline
};

class LeaseTable {
 public:
  // Engine thread: a new lease, ending at `deadline` (steady-clock seconds) at the latest.
  void add(uint64_t id, double deadline);
  // Any thread: the consumer has read the blocks. True when the lease was
  // still held (its blocks unchanged); it ends now either way.
  bool release(uint64_t id);
  // Engine thread: the leases that ended (released, or expired by `now`)
  // since the last call; their blocks may be freed now, not before.
  std::vector<uint64_t> take_ended(double now);
  // Engine thread (shutdown): every lease ends now.
  std::vector<uint64_t> take_all();
  LeaseStats stats() const;

 private:
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, double> held_;  // id -> deadline
  std::vector<uint64_t> ended_;
  LeaseStats stats_;
};

}  // namespace inferd::kvtransfer
