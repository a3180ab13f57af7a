#include "kv/chained_connector.h"

#include <algorithm>

namespace inferd::kv {

bool ChainedConnector::contains(BlockHash key) const { return local_.contains(key) || remote_.contains(key); }

std::vector<bool> ChainedConnector::load(std::span<const BlockTransfer> loads, bool stopped_at_miss) {
  // Synchronous: the remote part is asked too, and answers what it can at once.
  std::optional<std::vector<bool>> done = start_load({}, loads, stopped_at_miss, /*may_defer=*/false);
  return done ? *done : std::vector<bool>(loads.size(), false);
}

std::optional<std::vector<bool>> ChainedConnector::start_load(const std::string& request_id,
                                                              std::span<const BlockTransfer> loads,
                                                              bool stopped_at_miss, bool may_defer) {
  Part local, remote;
  for (size_t i = 0; i < loads.size(); ++i) {
    // A block both hold comes from the local copy: no network, no wait.
    Part& part = local_.contains(loads[i].key) ? local : remote;
    part.loads.push_back(loads[i]);
    part.at.push_back(i);
  }
  std::vector<bool> ok(loads.size(), false);
  if (!local.loads.empty()) {
    // For the local connector's hit and miss counts, the lookup went past it
    // whenever the remote one held blocks it did not.
    const std::vector<bool> got = local_.load(local.loads, stopped_at_miss || !remote.loads.empty());
    for (size_t i = 0; i < got.size(); ++i) ok[local.at[i]] = got[i];
    if (!std::all_of(got.begin(), got.end(), [](bool b) { return b; })) return ok;
  }
  if (remote.loads.empty()) return ok;
  const std::optional<std::vector<bool>> got =
      remote_.start_load(request_id, remote.loads, stopped_at_miss, may_defer);
  if (!got) return std::nullopt;  // its finished load answers for all of them
  for (size_t i = 0; i < got->size(); ++i) ok[remote.at[i]] = (*got)[i];
  return ok;
}

}  // namespace inferd::kv
