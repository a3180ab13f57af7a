#include "server/disaggregation.h"

#include <spdlog/fmt/fmt.h>

#include "kv/block_hash.h"

namespace inferd::server {

using json = nlohmann::json;

std::optional<ApiError> check_kv_transfer(const std::optional<KVTransferConfig>& config,
                                          std::optional<KVTransferParams>& params) {
  if (!params) return std::nullopt;
  if (!config) {
    params.reset();
    return std::nullopt;
  }
  if (params->do_remote_decode && !config->produces())
    return bad_request("this instance's kv_role is " + std::string(kv_role_name(config->role)) +
                           ": it does not prefill for remote decode ('kv_transfer_params.do_remote_decode')",
                       "kv_transfer_params");
  if (params->do_remote_prefill && !config->consumes())
    return bad_request("this instance's kv_role is " + std::string(kv_role_name(config->role)) +
                           ": it does not take KV blocks from a producer ('kv_transfer_params.do_remote_prefill')",
                       "kv_transfer_params");
  return std::nullopt;
}

json producer_params(const KVTransferConfig& config, uint16_t port, const std::string& api_id,
                     const std::vector<std::vector<int32_t>>& prompts, const std::vector<HeldPrompt>& held,
                     int32_t block_size, const std::string& salt) {
  json keys = json::array(), leases = json::array(), block_ids = json::array();
  for (size_t p = 0; p < prompts.size(); ++p) {
    json per_prompt = json::array();
    for (uint64_t k : prompt_block_keys(prompts[p], block_size, salt)) per_prompt.push_back(fmt::format("{:016x}", k));
    keys.push_back(std::move(per_prompt));
    const HeldPrompt none;
    const HeldPrompt& h = p < held.size() ? held[p] : none;
    leases.push_back(fmt::format("{:016x}", h.lease_id));
    block_ids.push_back(h.lease_id != 0 ? json(h.block_ids) : json::array());
  }
  return json{{"do_remote_prefill", true},
              {"do_remote_decode", false},
              {"remote_engine_id", config.engine_id},
              {"remote_host", config.ip},
              {"remote_port", port},
              {"remote_request_id", api_id},
              {"remote_block_size", block_size},
              {"remote_block_keys", std::move(keys)},
              {"remote_lease_ids", std::move(leases)},
              {"remote_block_ids", std::move(block_ids)}};
}

std::optional<kvtransfer::RemotePrompt> remote_prompt(const KVTransferParams& t, size_t p) {
  if (p >= t.remote_lease_ids.size() || p >= t.remote_block_ids.size() || p >= t.remote_block_keys.size() ||
      t.remote_lease_ids[p] == 0)
    return std::nullopt;
  kvtransfer::RemotePrompt r;
  r.host = t.remote_host;
  r.port = static_cast<uint16_t>(*t.remote_port);
  r.engine_id = t.remote_engine_id;
  r.lease_id = t.remote_lease_ids[p];
  const std::vector<uint64_t>& keys = t.remote_block_keys[p];
  const std::vector<std::vector<int32_t>>& groups = t.remote_block_ids[p];
  for (size_t g = 0; g < groups.size(); ++g)
    for (size_t i = 0; i < groups[g].size() && i < keys.size(); ++i)
      if (groups[g][i] != 0) r.blocks[kv::group_block_hash(keys[i], static_cast<int32_t>(g))] = groups[g][i];
  if (r.blocks.empty()) return std::nullopt;
  return r;
}

}  // namespace inferd::server
