// Prefill/decode disaggregation in a generation request's life: its
// kv_transfer_params checked against this instance's role, a consumer's view
// of the blocks a producer holds for it, and a producer's answer naming them
// (vLLM's NixlConnector fields; server/kv_transfer.h has the configuration).
#pragma once
#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kvtransfer/transfer_connector.h"
#include "server/kv_transfer.h"
#include "server/openai_protocol.h"

namespace inferd::server {

// The prompt's blocks a producer holds for a remote decode: its lease (0:
// none) and the blocks' ids per KV group.
struct HeldPrompt {
  uint64_t lease_id = 0;
  std::vector<std::vector<int32_t>> block_ids;
};

// kv_transfer_params against this instance's role: a role's own requests
// pass; without --kv-transfer-config they are dropped (vLLM ignores them
// without a connector).
std::optional<ApiError> check_kv_transfer(const std::optional<KVTransferConfig>& config,
                                          std::optional<KVTransferParams>& params);

// A producer's answer to "do_remote_decode": where the prompts' blocks are:
// per prompt, its block keys, and the lease that holds its blocks with their
// ids per KV group (lease 0 and no ids when nothing is held: the consumer
// then computes the prompt).
nlohmann::json producer_params(const KVTransferConfig& config, uint16_t port, const std::string& api_id,
                               const std::vector<std::vector<int32_t>>& prompts,
                               const std::vector<HeldPrompt>& held, int32_t block_size, const std::string& salt);

// A consumer's view of what a producer holds for prompt p: each KV group's
// key of each block -> the producer's block id. Empty when the parameters
// name no lease or no blocks for it.
std::optional<kvtransfer::RemotePrompt> remote_prompt(const KVTransferParams& t, size_t p);

}  // namespace inferd::server
