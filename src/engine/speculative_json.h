// vLLM's speculative_config as JSON, read into a SpeculativeConfig: one parser
// for every front end (--speculative-config of the CLI and server, the Python
// package's speculative_config dict).
#pragma once
#include <optional>
#include <string>
#include <string_view>

#include "core/result.h"
#include "engine/speculative.h"

namespace inferd {

// {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_min": A,
// "prompt_lookup_max": B, "disable_by_batch_size": N, "state_rollback":
// "checkpoint" | "per-position"} or {"method": "draft_model", "model": PATH,
// ...}; "" turns speculation off. Errors start
// with `name` (the option as the user wrote it).
Result<SpeculativeConfig> parse_speculative_config(const std::string& json,
                                                   std::string_view name = "--speculative-config");

// "checkpoint" or "per-position" (SpeculativeConfig::StateRollback), or nullopt.
std::optional<SpeculativeConfig::StateRollback> parse_state_rollback(std::string_view name);

// The JSON `json` with "state_rollback" set to `method` (the CLI's
// --speculative-state-rollback, given beside --speculative-config).
Result<std::string> with_state_rollback(const std::string& json, const std::string& method);

}  // namespace inferd
