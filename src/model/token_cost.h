// What one token of a prompt costs a forward pass, in multiply-adds: its
// projections (every layer's weight matrices, read once per token), and the
// attention it adds per position of context it attends to. The scheduler
// uses the ratio to keep a prefill chunk's work level deep into a long prompt
// (SchedulerConfig::context_positions_per_token): at 16k tokens of context
// a 0.5B model's attention costs several times its projections.
#pragma once
#include <cstdint>

namespace inferd {

class Model;

struct TokenCost {
  // Multiply-adds of the layers' weight matrices per token: every `blk.*`
  // tensor of the file, a mixture's expert tensors counted for the experts a
  // token uses (n_expert_used of n_expert); not the embeddings or the LM head
  // (a prompt's positions skip the head). A tensor-parallel rank's share.
  double projection_macs = 0.0;
  // Multiply-adds of attention per token per position attended: scores and
  // weighted values of every head in the layers that attend to the whole
  // context (windowed layers' cost stops growing at their window, recurrent
  // layers have none). Latent attention counts its absorbed form (scores and
  // values over the latent, plus the RoPE key).
  double attention_macs_per_position = 0.0;

  // Context positions whose attention costs as much as one token's
  // projections when one attention multiply-add costs `attention_mac_cost`
  // projection multiply-adds; 0 when either is 0 (no growing attention, or
  // the caller turned it off).
  double context_positions_per_token(double attention_mac_cost) const {
    if (attention_mac_cost <= 0.0 || attention_macs_per_position <= 0.0) return 0.0;
    return projection_macs / (attention_macs_per_position * attention_mac_cost);
  }
};

TokenCost token_cost(const Model& model);

}  // namespace inferd
