// The plain-data description of one forward pass: a flattened, unpadded batch
// of every scheduled token of every sequence, with per-token positions and KV
// slots and per-sequence block tables, one of each per KV group (see KVLayout).
// Built by whoever schedules the step; the model only executes it.
#pragma once
#include <cstdint>
#include <vector>

namespace inferd {

struct SequenceSlice {
  int32_t first_token = 0;  // index of the sequence's first token in the batch
  int32_t n_tokens = 0;     // its tokens are consecutive in the batch and in position
  // Each token is computed with the arithmetic of a one-token decode step
  // (kernel orders, attention pass) rather than as one chunk: speculative
  // verification, whose logits must equal plain decoding's to the bit.
  bool decode_each = false;
  // Its tokens are part of a prompt of more than one token that the step
  // feeds in pieces (chunked prefill, a preempted request's recompute, a cut
  // at a state snapshot): they take a prompt pass's attention order even when
  // the piece is one token, so that how a prompt is cut changes no bit (a
  // one-token piece in a one-token decode's order would).
  bool prompt_piece = false;
  // Whether its tokens' attention runs in the order of a prompt pass (GGML's
  // batched product) rather than a one-token decode's (kernels::AttentionPass).
  bool prompt_pass() const { return prompt_piece || (n_tokens > 1 && !decode_each); }
  // Its state slot in the cache (recurrent layers: KVCache::conv_state), or -1
  // for the cache's spare slot. A slice starting at position 0 starts from a
  // zero state; any other continues the slot's, or, when load_state_from is
  // set, a copy of that slot's (a cached prefix's snapshot, or the checkpoint
  // taken before rejected drafts). After its last token, when save_state_to
  // is set, the slot's state is copied there too (a snapshot at a block
  // boundary, a checkpoint before drafts). Whole slots, every recurrent layer.
  int32_t state_slot = -1;
  int32_t load_state_from = -1;
  int32_t save_state_to = -1;
  // Per KV group, the cache blocks holding positions [0, last position]; a
  // windowed group may have the null block where the window no longer reaches.
  std::vector<std::vector<int32_t>> block_tables;
};

struct ForwardBatch {
  std::vector<int32_t> tokens;
  std::vector<int32_t> positions;
  // Per KV group, the cache slot (block * block_size + offset) of each token.
  std::vector<std::vector<int64_t>> slots;
  std::vector<SequenceSlice> sequences;
  std::vector<int32_t> logit_rows;  // batch indices whose logits are returned, in order

  int64_t size() const { return static_cast<int64_t>(tokens.size()); }
  void clear() {
    tokens.clear();
    positions.clear();
    for (std::vector<int64_t>& group_slots : slots) group_slots.clear();
    sequences.clear();
    logit_rows.clear();
  }
};

}  // namespace inferd
