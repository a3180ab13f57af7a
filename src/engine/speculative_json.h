// vLLM's speculative_config as JSON, read into a SpeculativeConfig: one parser
// for every front end (--speculative-config of the CLI and server, the Python
// package's speculative_config dict).
#pragma once
#include <string>
#include <string_view>

#include "core/result.h"
#include "engine/speculative.h"

namespace inferd {

// {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_min": A,
// "prompt_lookup_max": B, "disable_by_batch_size": N} or {"method":
// "draft_model", "model": PATH, ...}; "" turns speculation off. Errors start
// with `name` (the option as the user wrote it).
Result<SpeculativeConfig> parse_speculative_config(const std::string& json,
                                                   std::string_view name = "--speculative-config");

}  // namespace inferd
