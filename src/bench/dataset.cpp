#include "bench/dataset.h"

#include <algorithm>
#include <fstream>

namespace inferd::bench {

namespace {

// splitmix64: a small, well-mixed generator whose sequence is the same on
// every platform (std::uniform_int_distribution is not), so a seed names
// the same prompts everywhere.
uint64_t next_random(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform in [0, n) (n > 0); the modulo bias is below 2^-40 for any vocabulary.
uint64_t uniform_below(uint64_t n, uint64_t& state) { return next_random(state) % n; }

std::vector<int32_t> random_tokens(int64_t n, const std::vector<int32_t>& pool, uint64_t& state) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& id : t) id = pool[uniform_below(pool.size(), state)];
  return t;
}

// The message list of a line: "messages" as is, or ShareGPT "conversations"
// mapped to OpenAI roles. Empty if the line has neither.
Result<nlohmann::json> messages_of(const nlohmann::json& line) {
  nlohmann::json out = nlohmann::json::array();
  if (line.contains("messages")) {
    const nlohmann::json& m = line["messages"];
    if (!m.is_array() || m.empty()) return make_error("\"messages\" must be a non-empty array");
    for (const nlohmann::json& msg : m) {
      if (!msg.is_object() || !msg.contains("role") || !msg["role"].is_string() ||
          !msg.contains("content") || !msg["content"].is_string())
        return make_error("each message needs string \"role\" and \"content\"");
      out.push_back({{"role", msg["role"]}, {"content", msg["content"]}});
    }
    return out;
  }
  if (line.contains("conversations")) {
    const nlohmann::json& c = line["conversations"];
    if (!c.is_array() || c.empty()) return make_error("\"conversations\" must be a non-empty array");
    for (const nlohmann::json& turn : c) {
      if (!turn.is_object() || !turn.contains("from") || !turn["from"].is_string() ||
          !turn.contains("value") || !turn["value"].is_string())
        return make_error("each conversation turn needs string \"from\" and \"value\"");
      const std::string from = turn["from"];
      std::string role = "user";
      if (from == "gpt" || from == "assistant" || from == "chatgpt" || from == "bard") role = "assistant";
      else if (from == "system") role = "system";
      out.push_back({{"role", role}, {"content", turn["value"]}});
    }
    return out;
  }
  return out;
}

// A line's own output length ("output_len" or "max_tokens"), or 0.
int64_t stated_output_len(const nlohmann::json& line) {
  for (const char* key : {"output_len", "max_tokens"})
    if (line.contains(key) && line[key].is_number_integer() && line[key].get<int64_t>() > 0)
      return line[key].get<int64_t>();
  return 0;
}

Result<SampleRequest> request_of(const nlohmann::json& line, const JsonlDatasetOptions& options,
                                 const TokenCounter& count_tokens) {
  if (!line.is_object()) return make_error("expected a JSON object");
  auto count = [&](const std::string& s) -> int64_t { return count_tokens ? count_tokens(s) : 0; };
  SampleRequest r;
  std::string reference;  // the reply the dataset recorded, if any
  if (line.contains("prompt")) {
    if (!line["prompt"].is_string()) return make_error("\"prompt\" must be a string");
    const std::string prompt = line["prompt"];
    if (options.chat)
      r.prompt = ChatMessages{nlohmann::json::array({{{"role", "user"}, {"content", prompt}}})};
    else
      r.prompt = prompt;
    r.prompt_len = count(prompt);
    if (line.contains("completion") && line["completion"].is_string()) reference = line["completion"];
  } else {
    auto messages = messages_of(line);
    if (!messages) return messages.error();
    nlohmann::json& m = *messages;
    if (m.empty()) return make_error("a line needs \"prompt\", \"messages\" or \"conversations\"");
    if (options.chat) {
      if (m.back()["role"] == "assistant") {
        reference = m.back()["content"];
        m.erase(m.size() - 1);
      }
      if (m.empty()) return make_error("the conversation has no turn before the assistant's");
      for (const nlohmann::json& msg : m) r.prompt_len += count(msg["content"]);
      r.prompt = ChatMessages{m};
    } else {
      size_t user = 0;
      while (user < m.size() && m[user]["role"] != "user") ++user;
      if (user == m.size()) return make_error("the conversation has no user turn");
      const std::string prompt = m[user]["content"];
      if (user + 1 < m.size() && m[user + 1]["role"] == "assistant") reference = m[user + 1]["content"];
      r.prompt = prompt;
      r.prompt_len = count(prompt);
    }
  }
  r.expected_output_len = options.output_len;
  if (r.expected_output_len <= 0) r.expected_output_len = stated_output_len(line);
  if (r.expected_output_len <= 0 && !reference.empty()) r.expected_output_len = count(reference);
  if (r.expected_output_len <= 0) r.expected_output_len = options.default_output_len;
  return r;
}

}  // namespace

int64_t spread_length(int64_t len, double range_ratio, uint64_t& rng_state) {
  const int64_t lo = std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(len) * (1.0 - range_ratio)));
  const int64_t hi = std::max(lo, static_cast<int64_t>(static_cast<double>(len) * (1.0 + range_ratio)));
  return lo + static_cast<int64_t>(uniform_below(static_cast<uint64_t>(hi - lo + 1), rng_state));
}

std::vector<SampleRequest> make_random_dataset(const RandomDatasetOptions& options,
                                               const std::vector<int32_t>& token_pool) {
  std::vector<SampleRequest> out;
  if (token_pool.empty()) return out;
  uint64_t state = options.seed;
  const std::vector<int32_t> prefix = random_tokens(options.prefix_len, token_pool, state);
  for (int64_t i = 0; i < options.num_prompts; ++i) {
    std::vector<int32_t> ids = prefix;
    const std::vector<int32_t> rest =
        random_tokens(spread_length(options.input_len, options.range_ratio, state), token_pool, state);
    ids.insert(ids.end(), rest.begin(), rest.end());
    SampleRequest r;
    r.prompt_len = static_cast<int64_t>(ids.size());
    r.expected_output_len = spread_length(options.output_len, options.range_ratio, state);
    r.prompt = std::move(ids);
    out.push_back(std::move(r));
  }
  return out;
}

Result<std::vector<SampleRequest>> load_jsonl_dataset(const std::string& path,
                                                      const JsonlDatasetOptions& options,
                                                      const TokenCounter& count_tokens) {
  std::ifstream in(path);
  if (!in) return make_error("cannot open " + path);
  std::vector<SampleRequest> lines;
  std::string text;
  int64_t line_no = 0;
  while (static_cast<int64_t>(lines.size()) < options.num_prompts && std::getline(in, text)) {
    ++line_no;
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json line = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (line.is_discarded())
      return make_error(path + ":" + std::to_string(line_no) + ": not valid JSON");
    auto r = request_of(line, options, count_tokens);
    if (!r) return make_error(path + ":" + std::to_string(line_no) + ": " + r.error().message);
    lines.push_back(std::move(*r));
  }
  if (lines.empty()) return make_error(path + ": no requests in the file");
  std::vector<SampleRequest> out;
  out.reserve(static_cast<size_t>(options.num_prompts));
  for (int64_t i = 0; i < options.num_prompts; ++i) out.push_back(lines[static_cast<size_t>(i) % lines.size()]);
  return out;
}

}  // namespace inferd::bench
