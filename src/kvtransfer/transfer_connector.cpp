#include "kvtransfer/transfer_connector.h"

namespace inferd::kvtransfer {

void TransferConnector::register_pull(const std::string& request_id, RemotePrompt prompt) {
  std::lock_guard lock(mu_);
  drop_registration(request_id);
  for (const auto& [key, block] : prompt.blocks) ++key_count_[key];
  registered_[request_id] = std::move(prompt);
  ++stats_.registered;
}

void TransferConnector::drop_registration(const std::string& request_id) {
  auto it = registered_.find(request_id);
  if (it == registered_.end()) return;
  for (const auto& [key, block] : it->second.blocks)
    if (auto c = key_count_.find(key); c != key_count_.end() && --c->second == 0) key_count_.erase(c);
  registered_.erase(it);
}

void TransferConnector::forget(const std::string& request_id) {
  std::lock_guard lock(mu_);
  if (!registered_.count(request_id)) return;  // pulled (or never registered)
  for (const auto& [pull, id] : pulling_)
    if (id == request_id) return;  // its pull ends on its own
  // Never pulled: the producer's blocks are given back now instead of when
  // the lease expires.
  const RemotePrompt& r = registered_.at(request_id);
  agent_.release_lease(r.host, r.port, r.engine_id, r.lease_id);
  drop_registration(request_id);
  ++stats_.unused;
}

bool TransferConnector::contains(kv::BlockHash key) const {
  std::lock_guard lock(mu_);
  return key_count_.count(key) > 0;
}

std::vector<bool> TransferConnector::load(std::span<const kv::BlockTransfer> loads, bool) {
  return std::vector<bool>(loads.size(), false);  // a transfer never completes at once
}

std::optional<std::vector<bool>> TransferConnector::start_load(const std::string& request_id,
                                                               std::span<const kv::BlockTransfer> loads, bool,
                                                               bool may_defer) {
  std::lock_guard lock(mu_);
  auto it = registered_.find(request_id);
  const std::vector<bool> none(loads.size(), false);
  if (!may_defer || loads.empty() || it == registered_.end()) return none;
  for (const auto& [pull, id] : pulling_)
    if (id == request_id) return none;  // one pull per registration
  const RemotePrompt& r = it->second;
  PullSpec spec;
  for (const kv::BlockTransfer& l : loads) {
    auto b = r.blocks.find(l.key);
    if (b == r.blocks.end()) return none;  // a key of another registration
    spec.blocks.emplace_back(b->second, l.block);
  }
  spec.id = next_pull_++;
  spec.host = r.host;
  spec.port = r.port;
  spec.engine_id = r.engine_id;
  spec.lease_id = r.lease_id;
  spec.timeout_s = timeout_s_;
  pulling_[spec.id] = request_id;
  agent_.start_pull(std::move(spec));
  return std::nullopt;
}

std::vector<kv::FinishedLoad> TransferConnector::take_finished_loads() {
  std::vector<kv::FinishedLoad> out;
  std::vector<PullResult> done = agent_.take_finished();
  std::lock_guard lock(mu_);
  for (const PullResult& r : done) {
    auto it = pulling_.find(r.id);
    if (it == pulling_.end()) continue;
    out.push_back({it->second, r.ok});
    ++(r.ok ? stats_.received : stats_.failed);
    // Pulled once, well or not: a later admission of the request (after a
    // failure, or a preemption) computes instead.
    drop_registration(it->second);
    pulling_.erase(it);
  }
  return out;
}

bool TransferConnector::has_unfinished_loads() const {
  std::lock_guard lock(mu_);
  return !pulling_.empty();
}

TransferStats TransferConnector::stats() const {
  TransferStats s;
  {
    std::lock_guard lock(mu_);
    s = stats_;
  }
  s.agent = agent_.stats();
  return s;
}

}  // namespace inferd::kvtransfer
