// Two connectors behind the one seam the scheduler has (kv/kv_connector.h): a
// local one whose loads finish at once (the offload tiers) in front of one
// whose loads take time (the KV transfer of a decode instance). A prefix
// lookup finds a block in either; of a request's loads, the blocks the local
// connector holds are filled from it at once and the rest are pulled by the
// other, so a decode instance with tiers reads its own copies and pulls only
// what it lacks. Evicted and computed blocks go to the local connector only:
// the transfer keeps nothing.
#pragma once
#include "kv/kv_connector.h"

namespace inferd::kv {

class ChainedConnector : public KVConnector {
 public:
  // Both must outlive this.
  ChainedConnector(KVConnector& local, KVConnector& remote) : local_(local), remote_(remote) {}

  bool contains(BlockHash key) const override;
  std::vector<bool> load(std::span<const BlockTransfer> loads, bool stopped_at_miss) override;
  // The local blocks first, at once; if any of them fails, nothing is pulled
  // and the failure is the answer. Otherwise the rest as the remote connector
  // starts them: deferred (nullopt) or answered at once.
  std::optional<std::vector<bool>> start_load(const std::string& request_id, std::span<const BlockTransfer> loads,
                                              bool stopped_at_miss, bool may_defer) override;
  std::vector<FinishedLoad> take_finished_loads() override { return remote_.take_finished_loads(); }
  bool has_unfinished_loads() const override { return remote_.has_unfinished_loads(); }
  void save_evicted(std::span<const BlockTransfer> evicted) override { local_.save_evicted(evicted); }
  void save_computed(std::span<const BlockTransfer> computed) override { local_.save_computed(computed); }

 private:
  // Loads of one connector, with each one's index in the request's loads.
  struct Part {
    std::vector<BlockTransfer> loads;
    std::vector<size_t> at;
  };

  KVConnector& local_;
  KVConnector& remote_;
};

}  // namespace inferd::kv
