#include "server/kv_transfer.h"

#include <boost/asio/ip/address.hpp>
#include <nlohmann/json.hpp>

#include <climits>
#include <cstdio>
#include <span>

#include "kv/block_hash.h"

namespace inferd::server {

using json = nlohmann::json;

const char* kv_role_name(KVRole role) {
  switch (role) {
    case KVRole::kProducer: return "kv_producer";
    case KVRole::kConsumer: return "kv_consumer";
    case KVRole::kBoth: return "kv_both";
  }
  return "kv_both";
}

Result<KVTransferConfig> parse_kv_transfer_config(const std::string& text) {
  const std::string flag = "--kv-transfer-config";
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return make_error(flag + ": expected a JSON object");
  KVTransferConfig c;
  for (const auto& [key, v] : j.items()) {
    const std::string at = flag + ": '" + key + "'";
    if (key == "kv_role") {
      const std::string role = v.is_string() ? v.get<std::string>() : std::string();
      if (role == "kv_producer") c.role = KVRole::kProducer;
      else if (role == "kv_consumer") c.role = KVRole::kConsumer;
      else if (role == "kv_both") c.role = KVRole::kBoth;
      else return make_error(at + " must be \"kv_producer\", \"kv_consumer\" or \"kv_both\", not " + v.dump());
    } else if (key == "kv_connector") {
      if (!v.is_string() || v.get<std::string>() != "NixlConnector")
        return make_error(at + " must be \"NixlConnector\" (the protocol inferd speaks), not " + v.dump());
      c.connector = v.get<std::string>();
    } else if (key == "kv_ip") {
      boost::system::error_code ec;
      if (v.is_string()) boost::asio::ip::make_address(v.get<std::string>(), ec);
      if (!v.is_string() || ec) return make_error(at + " must be an IP address (a string), not " + v.dump());
      c.ip = v.get<std::string>();
    } else if (key == "kv_port") {
      if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > 65535)
        return make_error(at + " must be a TCP port (1 to 65535), not " + v.dump());
      c.port = static_cast<uint16_t>(v.get<int64_t>());
    } else if (key == "kv_lease_seconds" || key == "kv_transfer_timeout_seconds") {
      if (!v.is_number() || !(v.get<double>() > 0) || v.get<double>() > 86400)
        return make_error(at + " must be a number of seconds (more than 0, at most 86400), not " + v.dump());
      (key == "kv_lease_seconds" ? c.lease_seconds : c.timeout_seconds) = v.get<double>();
    } else if (key == "engine_id") {
      if (!v.is_string() || v.get<std::string>().empty()) return make_error(at + " must be a non-empty string");
      c.engine_id = v.get<std::string>();
    } else {
      return make_error(flag + ": unknown key '" + key +
                        "' (known: kv_role, kv_connector, kv_ip, kv_port, engine_id, kv_lease_seconds, "
                        "kv_transfer_timeout_seconds)");
    }
  }
  if (!j.contains("kv_role")) return make_error(flag + ": 'kv_role' must be given (kv_producer, kv_consumer or kv_both)");
  return c;
}

namespace {
std::optional<uint64_t> parse_hex_key(const std::string& s) {
  if (s.empty() || s.size() > 16) return std::nullopt;
  uint64_t v = 0;
  for (char ch : s) {
    int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
    if (d < 0) return std::nullopt;
    v = v << 4 | static_cast<uint64_t>(d);
  }
  return v;
}
}  // namespace

Result<KVTransferParams> parse_kv_transfer_params(const std::string& text) {
  const std::string field = "kv_transfer_params";
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return make_error("'" + field + "' must be an object");
  KVTransferParams p;
  auto present = [&](const char* key) { return j.contains(key) && !j[key].is_null(); };
  auto at = [&](const char* key) { return "'" + field + "." + key + "'"; };
  for (const char* key : {"do_remote_decode", "do_remote_prefill"}) {
    if (!present(key)) continue;
    if (!j[key].is_boolean()) return make_error(at(key) + " must be a boolean");
    (std::string(key) == "do_remote_decode" ? p.do_remote_decode : p.do_remote_prefill) = j[key].get<bool>();
  }
  if (p.do_remote_decode && p.do_remote_prefill)
    return make_error("'" + field + "': do_remote_decode and do_remote_prefill cannot both be true");
  for (auto [key, out] : {std::pair<const char*, std::string*>{"remote_engine_id", &p.remote_engine_id},
                          {"remote_host", &p.remote_host},
                          {"remote_request_id", &p.remote_request_id}}) {
    if (!present(key)) continue;
    if (!j[key].is_string()) return make_error(at(key) + " must be a string");
    *out = j[key].get<std::string>();
  }
  if (present("remote_port")) {
    if (!j["remote_port"].is_number_integer() || j["remote_port"].get<int64_t>() < 1 ||
        j["remote_port"].get<int64_t>() > 65535)
      return make_error(at("remote_port") + " must be a TCP port (1 to 65535)");
    p.remote_port = j["remote_port"].get<int64_t>();
  }
  if (present("remote_block_size")) {
    if (!j["remote_block_size"].is_number_integer() || j["remote_block_size"].get<int64_t>() < 1)
      return make_error(at("remote_block_size") + " must be a positive integer");
    p.remote_block_size = j["remote_block_size"].get<int64_t>();
  }
  if (present("remote_block_keys")) {
    const json& keys = j["remote_block_keys"];
    const std::string bad = at("remote_block_keys") + " must be an array (one per prompt) of arrays of block keys "
                                                      "(16 hex digits)";
    if (!keys.is_array()) return make_error(bad);
    for (const json& prompt : keys) {
      if (!prompt.is_array()) return make_error(bad);
      std::vector<uint64_t>& out = p.remote_block_keys.emplace_back();
      for (const json& k : prompt) {
        std::optional<uint64_t> v = k.is_string() ? parse_hex_key(k.get<std::string>()) : std::nullopt;
        if (!v) return make_error(bad);
        out.push_back(*v);
      }
    }
  }
  if (present("remote_lease_ids")) {
    const json& ids = j["remote_lease_ids"];
    const std::string bad = at("remote_lease_ids") + " must be an array (one per prompt) of lease ids (16 hex digits)";
    if (!ids.is_array()) return make_error(bad);
    for (const json& id : ids) {
      std::optional<uint64_t> v = id.is_string() ? parse_hex_key(id.get<std::string>()) : std::nullopt;
      if (!v) return make_error(bad);
      p.remote_lease_ids.push_back(*v);
    }
  }
  if (present("remote_block_ids")) {
    const json& ids = j["remote_block_ids"];
    const std::string bad = at("remote_block_ids") +
                            " must be an array (one per prompt) of arrays (one per KV group) of block ids "
                            "(non-negative integers)";
    if (!ids.is_array()) return make_error(bad);
    for (const json& prompt : ids) {
      if (!prompt.is_array() || prompt.size() > 1024) return make_error(bad);
      auto& groups = p.remote_block_ids.emplace_back();
      for (const json& group : prompt) {
        if (!group.is_array()) return make_error(bad);
        auto& blocks = groups.emplace_back();
        for (const json& b : group) {
          if (!b.is_number_integer() || b.get<int64_t>() < 0 || b.get<int64_t>() > INT32_MAX) return make_error(bad);
          blocks.push_back(static_cast<int32_t>(b.get<int64_t>()));
        }
      }
    }
  }
  if (p.do_remote_prefill && (p.remote_engine_id.empty() || p.remote_host.empty() || !p.remote_port))
    return make_error("'" + field +
                      "' with do_remote_prefill needs remote_engine_id, remote_host and remote_port (the producer)");
  return p;
}

std::vector<uint64_t> prompt_block_keys(const std::vector<int32_t>& prompt, int32_t block_size,
                                        const std::string& cache_salt) {
  std::vector<uint64_t> keys;
  const uint64_t extra = kv::hash_bytes(cache_salt);
  kv::BlockHash parent = kv::kRootBlockHash;
  const std::span<const int32_t> tokens(prompt);
  for (size_t at = 0; at + static_cast<size_t>(block_size) <= prompt.size(); at += block_size) {
    parent = kv::hash_block(parent, tokens.subspan(at, block_size), extra);
    keys.push_back(parent);
  }
  return keys;
}

}  // namespace inferd::server
