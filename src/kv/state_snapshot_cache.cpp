#include "kv/state_snapshot_cache.h"

#include <string>

#include "kv/check.h"

namespace inferd::kv {

StateSnapshotCache::StateSnapshotCache(int32_t first_slot, int32_t n_slots) : first_slot_(first_slot) {
  INFERD_KV_CHECK(first_slot >= 0 && n_slots >= 0, "a negative snapshot slot");
  slots_.resize(static_cast<size_t>(n_slots));
}

StateSnapshotCache::Slot& StateSnapshotCache::at(int32_t slot) {
  INFERD_KV_CHECK(slot >= first_slot_ && slot - first_slot_ < num_slots(), "not a snapshot slot");
  return slots_[static_cast<size_t>(slot - first_slot_)];
}

const StateSnapshotCache::Slot& StateSnapshotCache::at(int32_t slot) const {
  INFERD_KV_CHECK(slot >= first_slot_ && slot - first_slot_ < num_slots(), "not a snapshot slot");
  return slots_[static_cast<size_t>(slot - first_slot_)];
}

std::optional<int32_t> StateSnapshotCache::reserve() {
  int32_t victim = -1;
  for (int32_t i = 0; i < num_slots(); ++i) {
    const Slot& s = slots_[i];
    if (s.state == State::kFree) {
      victim = i;
      break;
    }
    if (s.state == State::kCached && s.pins == 0 && (victim < 0 || s.last_use < slots_[victim].last_use)) victim = i;
  }
  if (victim < 0) return std::nullopt;
  const int32_t slot = first_slot_ + victim;
  if (slots_[victim].state == State::kCached) drop(slot);
  slots_[victim].state = State::kReserved;
  ++num_reserved_;
  return slot;
}

void StateSnapshotCache::commit(int32_t slot, BlockHash key, int32_t anchor) {
  Slot& s = at(slot);
  INFERD_KV_CHECK(s.state == State::kReserved, "committing a snapshot slot that was not reserved");
  --num_reserved_;
  if (by_key_.count(key) || by_anchor_.count(anchor)) {
    s.state = State::kFree;
    return;
  }
  s.state = State::kCached;
  s.key = key;
  s.anchor = anchor;
  s.last_use = ++use_clock_;
  by_key_.emplace(key, slot);
  by_anchor_.emplace(anchor, slot);
}

void StateSnapshotCache::release(int32_t slot) {
  Slot& s = at(slot);
  INFERD_KV_CHECK(s.state == State::kReserved, "releasing a snapshot slot that was not reserved");
  --num_reserved_;
  s.state = State::kFree;
}

std::optional<int32_t> StateSnapshotCache::lookup(BlockHash key) const {
  auto it = by_key_.find(key);
  if (it == by_key_.end()) return std::nullopt;
  return it->second;
}

void StateSnapshotCache::pin(int32_t slot) {
  Slot& s = at(slot);
  INFERD_KV_CHECK(s.state == State::kCached, "pinning a snapshot slot that holds no snapshot");
  ++s.pins;
  s.last_use = ++use_clock_;
}

void StateSnapshotCache::unpin(int32_t slot) {
  Slot& s = at(slot);
  INFERD_KV_CHECK(s.pins > 0, "unpinning a snapshot slot that is not pinned");
  --s.pins;
}

void StateSnapshotCache::drop(int32_t slot) {
  Slot& s = at(slot);
  by_key_.erase(s.key);
  by_anchor_.erase(s.anchor);
  s.state = State::kFree;
}

void StateSnapshotCache::drop_anchored(std::span<const int32_t> blocks) {
  if (by_anchor_.empty()) return;
  for (int32_t b : blocks) {
    auto it = by_anchor_.find(b);
    if (it == by_anchor_.end()) continue;
    // A block is reused only with no reference, and a reader holds the blocks of its prefix.
    INFERD_KV_CHECK(at(it->second).pins == 0, "a pinned snapshot's anchor block is reused");
    drop(it->second);
  }
}

std::vector<std::pair<BlockHash, int32_t>> StateSnapshotCache::cached() const {
  std::vector<std::pair<BlockHash, int32_t>> out;
  for (const Slot& s : slots_)
    if (s.state == State::kCached) out.emplace_back(s.key, s.anchor);
  return out;
}

Status StateSnapshotCache::check_invariants() const {
  auto fail = [](const std::string& what) { return Status(make_error("StateSnapshotCache: " + what)); };
  int32_t cached = 0, reserved = 0;
  for (int32_t i = 0; i < num_slots(); ++i) {
    const Slot& s = slots_[i];
    const int32_t slot = first_slot_ + i;
    if (s.pins < 0 || (s.pins > 0 && s.state != State::kCached))
      return fail("slot " + std::to_string(slot) + " is pinned but holds no snapshot");
    reserved += s.state == State::kReserved;
    if (s.state != State::kCached) continue;
    ++cached;
    auto k = by_key_.find(s.key);
    auto a = by_anchor_.find(s.anchor);
    if (k == by_key_.end() || k->second != slot || a == by_anchor_.end() || a->second != slot)
      return fail("slot " + std::to_string(slot) + " is not listed under its key and anchor");
  }
  if (cached != static_cast<int32_t>(by_key_.size()) || cached != static_cast<int32_t>(by_anchor_.size()))
    return fail("the maps list slots that hold no snapshot");
  if (reserved != num_reserved_) return fail("the count of reserved slots is wrong");
  return {};
}

}  // namespace inferd::kv
