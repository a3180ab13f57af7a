// What the scheduler decided for one step, as plain data: everything the model
// runner needs to build the step's flattened batch, and nothing it could use
// to make policy. For a scheduled request, token i of `token_ids` goes at
// position num_computed_tokens + i, in KV slot kv_slot(block_table, block_size,
// position) of each KV group's table; the request's attention reads positions
// [0, that position] through the tables (a sliding-window group's table has the
// null block where the window no longer reaches). Before the step's forward
// pass the runner copies `block_copies` (beam search: a block shared by forked
// requests that one of them now writes gets a private copy). When `sample` is set the runner samples one token
// from the logits of the request's last scheduled token, or, for a request
// that verifies drafts, from each of its last num_draft_tokens + 1 tokens.
#pragma once
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kv/kv_cache_manager.h"

namespace inferd {

struct ScheduledRequest {
  std::string request_id;
  int64_t num_computed_tokens = 0;  // tokens already cached: position of the first new one
  int64_t num_new_tokens = 0;       // 1 for a decode, more for a prefill chunk
  std::vector<int32_t> token_ids;   // the num_new_tokens tokens to feed
  // The request's whole block table per KV group; each covers every position
  // up to the last new token. Tables only grow at the end while a request
  // runs (sliding-window entries turn null, and a shared block a forked
  // request writes is replaced by its copy).
  std::vector<std::vector<int32_t>> block_tables;
  std::vector<int32_t> new_block_ids;  // appended to the tables this step, group by group
  // Recurrent layers: the request's state slot (the same from admission to
  // finish or preemption; is_new or resumed: the runner starts it from zero).
  // -1: the model has none.
  int32_t state_slot = -1;
  // Recurrent layers: the slot whose state this step starts from instead of
  // its own (a prefix hit's snapshot, or the checkpoint kept before drafts
  // that were rejected), or -1; and where the state is saved after the token
  // before each save's position (snapshots at block boundaries, the
  // checkpoint before drafts), positions in (num_computed_tokens,
  // num_computed_tokens + num_new_tokens], ascending.
  int32_t state_source = -1;
  std::vector<kv::StateSave> state_saves;
  bool is_new = false;   // admitted this step: the runner has no state for it yet
  bool resumed = false;  // admitted after a preemption: recomputes prompt and earlier output
  bool sample = false;   // this step reaches the request's last token: sample one
  // The last num_draft_tokens of token_ids are speculative drafts to verify
  // (after the request's last real token); each of them and the token before
  // them gets a row of logits, computed as a one-token decode would be.
  int64_t num_draft_tokens = 0;
  // Prompt logprobs (Request::needs_prompt_logits): each scheduled position
  // before the prompt's last also gets a row of logits, ahead of the sample
  // rows; the row of position p scores prompt token p + 1.
  bool prompt_logits = false;
  // Positions from here on hold output tokens (the default, kUnmarked: none
  // does, and no position is marked a prompt's either: a draft model's own
  // steps, tests).
  static constexpr int64_t kUnmarked = std::numeric_limits<int64_t>::max();
  int64_t num_prompt_tokens = kUnmarked;
  int64_t num_cached_tokens = 0;  // if is_new: tokens taken from the prefix cache
};

struct SchedulerOutput {
  int64_t step = 0;
  std::vector<ScheduledRequest> scheduled;  // running requests first, then admitted ones
  int64_t total_num_scheduled_tokens = 0;
  // Copy on write, to do before the forward pass, in order: every layer's
  // keys and values of block src into block dst.
  std::vector<kv::BlockCopy> block_copies;
  std::vector<std::string> preempted_request_ids;  // preempted this step; not scheduled
  // Finished or aborted since the previous schedule(): the runner may drop
  // whatever it keeps for them.
  std::vector<std::string> finished_request_ids;

  bool empty() const { return scheduled.empty(); }
};

// The cache slot of `position` for a request with this block table.
inline int64_t kv_slot(const std::vector<int32_t>& block_table, int64_t block_size,
                       int64_t position) {
  return int64_t{block_table[position / block_size]} * block_size + position % block_size;
}

}  // namespace inferd
