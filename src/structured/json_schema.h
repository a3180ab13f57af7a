// JSON schemas as the grammar engines people compare us with read them.
#pragma once
#include <nlohmann/json.hpp>

namespace inferd {

// Sets "additionalProperties": false on every object schema inside `schema`
// that lists "properties" and says nothing about other keys. JSON Schema
// allows unlisted keys there, and llguidance follows it; llama.cpp's grammar
// and vLLM's default engine (xgrammar) do not, and OpenAI's strict mode
// forbids them. Left open, a small model invents keys until max_tokens.
// A schema that asks for other keys ("additionalProperties",
// "patternProperties" or "unevaluatedProperties") keeps its own rule, and the
// members of an allOf stay open (each closed would refuse the others'
// properties); what lies inside them is still closed.
void close_json_schema_objects(nlohmann::ordered_json& schema);

}  // namespace inferd
