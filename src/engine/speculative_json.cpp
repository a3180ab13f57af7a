#include "engine/speculative_json.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <utility>

namespace inferd {

Result<SpeculativeConfig> parse_speculative_config(const std::string& text, std::string_view name) {
  const std::string prefix = std::string(name) + ": ";
  if (text.empty()) return SpeculativeConfig{};  // off
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return make_error(prefix + "expected a JSON object");
  SpeculativeConfig c;
  const auto int_field = [&](const char* key, int32_t& out) -> Status {
    if (!j.contains(key)) return {};
    const nlohmann::json& v = j[key];
    if (!v.is_number_integer() || v.get<int64_t>() < INT32_MIN || v.get<int64_t>() > INT32_MAX)
      return make_error(prefix + "'" + key + "' must be an integer");
    out = v.get<int32_t>();
    return {};
  };
  for (const auto& [key, value] : j.items()) {
    if (key != "method" && key != "num_speculative_tokens" && key != "prompt_lookup_min" &&
        key != "prompt_lookup_max" && key != "disable_by_batch_size" && key != "model" && key != "draft_p_min" &&
        key != "draft_vocab_size" && key != "first_draft_tokens" && key != "state_rollback")
      return make_error(prefix + "unknown key '" + key + "'");
  }
  if (j.contains("model") && !j["model"].is_string())
    return make_error(prefix + "'model' must be a path (a string)");
  // vLLM: a draft model given without a method is the draft-model method.
  if (!j.contains("method") && j.contains("model")) j["method"] = "draft_model";
  if (!j.contains("method") || !j["method"].is_string())
    return make_error(prefix + "'method' must be given (\"ngram\" or \"draft_model\")");
  const std::string method = j["method"].get<std::string>();
  if (method == "ngram") {
    c.method = SpeculativeConfig::Method::kNgram;
    if (j.contains("model") || j.contains("draft_p_min") || j.contains("draft_vocab_size"))
      return make_error(prefix + "'model', 'draft_p_min' and 'draft_vocab_size' are for method "
                        "\"draft_model\"");
  } else if (method == "draft_model") {
    c.method = SpeculativeConfig::Method::kDraftModel;
    // A draft pass per step costs about a third of a target step at batch 1
    // and more at larger batches, which a CPU already runs compute-bound: by
    // default a draft model drafts only while fewer than 4 requests run
    // (docs/benchmarks.md: 0.66x at 16 streams without this).
    c.disable_by_batch_size = 4;
    if (!j.contains("model")) return make_error(prefix + "method \"draft_model\" needs 'model' (a GGUF path)");
    c.draft_model = j["model"].get<std::string>();
    if (j.contains("prompt_lookup_min") || j.contains("prompt_lookup_max"))
      return make_error(prefix + "'prompt_lookup_min' and 'prompt_lookup_max' are for method \"ngram\"");
    if (j.contains("draft_p_min")) {
      if (!j["draft_p_min"].is_number()) return make_error(prefix + "'draft_p_min' must be a number");
      c.draft_p_min = j["draft_p_min"].get<double>();
    }
    if (j.contains("draft_vocab_size")) {
      if (!j["draft_vocab_size"].is_number_integer())
        return make_error(prefix + "'draft_vocab_size' must be an integer");
      c.draft_vocab_size = j["draft_vocab_size"].get<int64_t>();
    }
  } else {
    return make_error(prefix + "method '" + method + "' is not supported (supported: ngram, draft_model)");
  }
  if (j.contains("state_rollback")) {
    const auto rollback = j["state_rollback"].is_string()
                              ? parse_state_rollback(j["state_rollback"].get<std::string>())
                              : std::nullopt;
    if (!rollback) return make_error(prefix + "'state_rollback' must be \"checkpoint\" or \"per-position\"");
    c.state_rollback = *rollback;
  }
  if (!j.contains("num_speculative_tokens"))
    return make_error(prefix + "'num_speculative_tokens' must be given");
  for (auto [key, field] : {std::pair<const char*, int32_t*>{"num_speculative_tokens", &c.num_speculative_tokens},
                            {"prompt_lookup_min", &c.prompt_lookup_min},
                            {"prompt_lookup_max", &c.prompt_lookup_max},
                            {"disable_by_batch_size", &c.disable_by_batch_size},
                            {"first_draft_tokens", &c.first_draft_tokens}})
    if (Status st = int_field(key, *field); !st) return st.error();
  // vLLM: a missing bound takes the other's value.
  if (!j.contains("prompt_lookup_max") && j.contains("prompt_lookup_min")) c.prompt_lookup_max = c.prompt_lookup_min;
  if (!j.contains("prompt_lookup_min") && j.contains("prompt_lookup_max")) c.prompt_lookup_min = c.prompt_lookup_max;
  if (Status st = c.validate(); !st) return make_error(prefix + st.error().message);
  return c;
}

std::optional<SpeculativeConfig::StateRollback> parse_state_rollback(std::string_view name) {
  if (name == "checkpoint") return SpeculativeConfig::StateRollback::kCheckpoint;
  if (name == "per-position") return SpeculativeConfig::StateRollback::kPerPosition;
  return std::nullopt;
}

Result<std::string> with_state_rollback(const std::string& json, const std::string& method) {
  nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (json.empty() || j.is_discarded() || !j.is_object())
    return make_error("--speculative-state-rollback needs --speculative-config (a JSON object)");
  if (!parse_state_rollback(method))
    return make_error("--speculative-state-rollback: expected checkpoint or per-position, not '" + method + "'");
  j["state_rollback"] = method;
  return j.dump();
}

}  // namespace inferd
