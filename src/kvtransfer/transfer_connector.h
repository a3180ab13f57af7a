// The decode side of the KV transfer behind the connector seam
// (kv/kv_connector.h). The server registers, for a request told to pull its
// prompt from a producer, which of its block keys the producer holds and
// where (its address, lease and block ids); a prefix lookup then finds those
// keys here (contains), and the scheduler's start_load turns the request's
// loads into one pull of the agent: the request waits, its blocks are filled
// by one-sided reads, and the finished pull is reported as a finished load.
// A failed pull (refused, broken, timed out, lease expired) reports a failed
// load and the scheduler recomputes the prompt.
//
// Only the registered request pulls with its registration: another request
// whose lookup finds the same keys here (the same prompt, admitted first)
// gets a failed synchronous load and falls back to the pool's own blocks.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "kv/kv_connector.h"
#include "kvtransfer/ucx_agent.h"

namespace inferd::kvtransfer {

// A producer's copy of a prompt's blocks.
struct RemotePrompt {
  std::string host;
  uint16_t port = 0;
  std::string engine_id;
  uint64_t lease_id = 0;
  std::unordered_map<kv::BlockHash, int32_t> blocks;  // the pool's key (group key) -> producer's block id
};

struct TransferStats {
  int64_t registered = 0;        // prompts registered to pull
  int64_t received = 0;          // pulled whole
  int64_t failed = 0;            // pull failed: the prompt was recomputed
  int64_t unused = 0;            // ended with no pull (the pool held the prefix, or no full block)
  AgentStats agent;
};

class TransferConnector : public kv::KVConnector {
 public:
  // `agent` must outlive the connector; pulls get `timeout_s` each.
  TransferConnector(UcxAgent& agent, double timeout_s) : agent_(agent), timeout_s_(timeout_s) {}

  // Any thread, before the request is added.
  void register_pull(const std::string& request_id, RemotePrompt prompt);
  // Any thread, once the request has finished (however): forgets what was
  // registered and not pulled, and gives that lease back to the producer.
  void forget(const std::string& request_id);

  bool contains(kv::BlockHash key) const override;
  std::vector<bool> load(std::span<const kv::BlockTransfer> loads, bool stopped_at_miss) override;
  std::optional<std::vector<bool>> start_load(const std::string& request_id, std::span<const kv::BlockTransfer> loads,
                                              bool stopped_at_miss, bool may_defer) override;
  std::vector<kv::FinishedLoad> take_finished_loads() override;
  bool has_unfinished_loads() const override;
  void save_evicted(std::span<const kv::BlockTransfer>) override {}
  void save_computed(std::span<const kv::BlockTransfer>) override {}

  TransferStats stats() const;

 private:
  void drop_registration(const std::string& request_id);  // mu_ held

  UcxAgent& agent_;
  double timeout_s_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, RemotePrompt> registered_;
  std::unordered_map<kv::BlockHash, int32_t> key_count_;  // registrations holding each key
  std::unordered_map<uint64_t, std::string> pulling_;     // pull id -> request id
  uint64_t next_pull_ = 1;
  TransferStats stats_;
};

}  // namespace inferd::kvtransfer
