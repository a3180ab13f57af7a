// Prefill/decode disaggregation on the serving side: vLLM's
// --kv-transfer-config and the per-request kv_transfer_params of its
// NixlConnector protocol.
//
// A kv_producer (prefill) instance asked with "do_remote_decode": true
// answers with kv_transfer_params naming where the prompt's KV blocks are:
// its engine id and transfer address, the request id, the prompt's block
// keys (the chained prefix hashes of its full blocks, as the pool caches them;
// KV group g's key is kv::group_block_hash(key, g)), and the lease that holds
// those blocks with their ids (per prompt, per KV group; 0 where a sliding
// window let a block go).
//
// A kv_consumer (decode) instance given "do_remote_prefill": true registers
// those blocks with its engine's transfer connector, which pulls the ones its
// prefix lookup wants over UCX (kvtransfer/). A prompt whose pull fails,
// times out or is refused, or that comes without a lease, is computed there
// and counted in inferd:kv_transfer_recomputed_prompts_total.
//
// An instance started without --kv-transfer-config ignores kv_transfer_params
// (after checking it is an object), as vLLM does without a connector.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/result.h"

namespace inferd::server {

enum class KVRole { kProducer, kConsumer, kBoth };
const char* kv_role_name(KVRole role);

struct KVTransferConfig {
  KVRole role = KVRole::kBoth;
  std::string connector = "NixlConnector";  // vLLM's name of the protocol spoken
  std::string ip = "127.0.0.1";             // where the transfer endpoint listens (the producer's address)
  uint16_t port = 14579;                    // vLLM's default kv_port
  std::string engine_id;                    // empty: a random one at start
  double lease_seconds = 30.0;    // kv_lease_seconds: a producer frees blocks no consumer released by then
  double timeout_seconds = 5.0;   // kv_transfer_timeout_seconds: a consumer's pull that takes longer recomputes

  bool produces() const { return role != KVRole::kConsumer; }
  bool consumes() const { return role != KVRole::kProducer; }
};

// --kv-transfer-config's JSON: {"kv_role": "kv_producer" | "kv_consumer" |
// "kv_both", "kv_connector": "NixlConnector", "kv_ip": "10.0.0.2",
// "kv_port": 14579, "engine_id": "...", "kv_lease_seconds": 30,
// "kv_transfer_timeout_seconds": 5}; kv_role is required. An error names the
// key at fault.
Result<KVTransferConfig> parse_kv_transfer_config(const std::string& json);

// A request's kv_transfer_params, checked. Keys the protocol does not name
// are left alone (a connector's own extensions).
struct KVTransferParams {
  bool do_remote_decode = false;   // prefill here, keep the blocks for a remote decode
  bool do_remote_prefill = false;  // the prompt's blocks are at the producer named below
  std::string remote_engine_id, remote_host, remote_request_id;
  std::optional<int64_t> remote_port;
  std::optional<int64_t> remote_block_size;
  // Per prompt, the producer's block keys (chained prefix hashes, 16 hex digits).
  std::vector<std::vector<uint64_t>> remote_block_keys;
  // Per prompt, the lease holding its blocks at the producer (16 hex digits;
  // 0: none), and the blocks' ids per KV group (0: not held).
  std::vector<uint64_t> remote_lease_ids;
  std::vector<std::vector<std::vector<int32_t>>> remote_block_ids;
};

// The parameters from the request field's JSON text; an error message names
// the sub-field ("kv_transfer_params.remote_port ...").
Result<KVTransferParams> parse_kv_transfer_params(const std::string& json);

// The chained prefix hashes of a prompt's full blocks (the keys the pool
// caches them under, group 0), as the engine computes them.
std::vector<uint64_t> prompt_block_keys(const std::vector<int32_t>& prompt, int32_t block_size,
                                        const std::string& cache_salt);

}  // namespace inferd::server
