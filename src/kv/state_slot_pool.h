// Fixed-size recurrent-state slots, one per running request of a model with
// recurrent layers (Gated DeltaNet, Mamba): each slot holds, for every such
// layer, the conv window and the recurrent matrices of one sequence
// (KVCacheSpec::recurrent_state gives the sizes). A slot is taken when a
// request first gets its attention blocks and returned when it finishes or is
// preempted: preemption is by recompute, so the state is dropped and rebuilt
// from the tokens. The pool only counts; the executor owns the bytes
// (model/kv_cache.h) and zeroes a slot when a sequence starts in it.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/result.h"

namespace inferd::kv {

class StateSlotPool {
 public:
  explicit StateSlotPool(int32_t n_slots);

  // A free slot for the request (the lowest free number, so a lone request
  // always runs in slot 0), or nullopt when all are taken. A contract check
  // stops a request taking two.
  std::optional<int32_t> allocate(const std::string& request_id);
  // Returns the request's slot; no-op for one that holds none.
  void free(const std::string& request_id);

  // The request's slot, or nullopt.
  std::optional<int32_t> slot_of(const std::string& request_id) const;
  int32_t num_slots() const { return static_cast<int32_t>(holder_.size()); }
  int32_t num_free() const { return num_slots() - static_cast<int32_t>(slot_of_.size()); }

  // Each slot has at most one holder, and the two maps agree.
  Status check_invariants() const;

 private:
  std::vector<std::string> holder_;  // per slot: the request id, empty when free
  std::unordered_map<std::string, int32_t> slot_of_;
};

}  // namespace inferd::kv
