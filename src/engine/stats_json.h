// The engine's counters as JSON, named once for every reader: `bench
// throughput --output-json` (its "engine" object) and the Python package's
// LLM.stats().
#pragma once
#include <nlohmann/json.hpp>

#include "engine/engine.h"

namespace inferd {

nlohmann::json engine_stats_json(const EngineStats& stats);

}  // namespace inferd
