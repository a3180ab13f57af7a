// The plain-data description of one forward pass: a flattened, unpadded batch
// of every scheduled token of every sequence, with per-token positions and KV
// slots and per-sequence block tables. Built by whoever schedules the step; the
// model only executes it.
#pragma once
#include <cstdint>
#include <vector>

namespace inferd {

struct SequenceSlice {
  int32_t first_token = 0;  // index of the sequence's first token in the batch
  int32_t n_tokens = 0;     // its tokens are consecutive in the batch and in position
  std::vector<int32_t> block_table;  // cache blocks holding positions [0, last position]
};

struct ForwardBatch {
  std::vector<int32_t> tokens;
  std::vector<int32_t> positions;
  std::vector<int64_t> slots;  // cache slot (block * block_size + offset) per token
  std::vector<SequenceSlice> sequences;
  std::vector<int32_t> logit_rows;  // batch indices whose logits are returned, in order

  int64_t size() const { return static_cast<int64_t>(tokens.size()); }
  void clear() {
    tokens.clear();
    positions.clear();
    slots.clear();
    sequences.clear();
    logit_rows.clear();
  }
};

}  // namespace inferd
