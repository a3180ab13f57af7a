// --kv-transfer-config and kv_transfer_params, parsed and checked without a model.
#include <gtest/gtest.h>

#include "kv/block_hash.h"
#include "server/kv_transfer.h"
#include "server/openai_protocol.h"

namespace inferd::server {
namespace {

std::string error_of(const std::string& json) {
  auto c = parse_kv_transfer_config(json);
  return c ? std::string() : c.error().message;
}

TEST(KVTransferConfig, RolesAndDefaults) {
  auto c = parse_kv_transfer_config(R"({"kv_role": "kv_producer"})");
  ASSERT_TRUE(c);
  EXPECT_EQ(c->role, KVRole::kProducer);
  EXPECT_TRUE(c->produces());
  EXPECT_FALSE(c->consumes());
  EXPECT_EQ(c->port, 14579);
  c = parse_kv_transfer_config(
      R"({"kv_role": "kv_both", "kv_connector": "NixlConnector", "kv_ip": "10.0.0.2", "kv_port": 9000, "engine_id": "e1"})");
  ASSERT_TRUE(c);
  EXPECT_TRUE(c->produces() && c->consumes());
  EXPECT_EQ(c->ip, "10.0.0.2");
  EXPECT_EQ(c->port, 9000);
  EXPECT_EQ(c->engine_id, "e1");
}

TEST(KVTransferConfig, BadInputNamesTheKey) {
  EXPECT_NE(error_of("{kv_role"), "");
  EXPECT_NE(error_of("[]").find("JSON object"), std::string::npos);
  EXPECT_NE(error_of("{}").find("'kv_role' must be given"), std::string::npos);
  EXPECT_NE(error_of(R"({"kv_role": "sender"})").find("'kv_role'"), std::string::npos);
  EXPECT_NE(error_of(R"({"kv_role": "kv_both", "kv_port": 0})").find("'kv_port'"), std::string::npos);
  EXPECT_NE(error_of(R"({"kv_role": "kv_both", "kv_ip": "not an ip"})").find("'kv_ip'"), std::string::npos);
  EXPECT_NE(error_of(R"({"kv_role": "kv_both", "kv_connector": "Other"})").find("'kv_connector'"), std::string::npos);
  EXPECT_NE(error_of(R"({"kv_role": "kv_both", "kv_rank": 1})").find("unknown key 'kv_rank'"), std::string::npos);
  EXPECT_NE(error_of(R"({"kv_role": "kv_both", "kv_lease_seconds": 0})").find("'kv_lease_seconds'"), std::string::npos);
  EXPECT_NE(error_of(R"({"kv_role": "kv_both", "kv_transfer_timeout_seconds": "5"})").find("'kv_transfer_timeout_seconds'"),
            std::string::npos);
}

TEST(KVTransferConfig, LeaseAndTimeout) {
  auto c = parse_kv_transfer_config(R"({"kv_role": "kv_producer"})");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->lease_seconds, 30.0);
  EXPECT_EQ(c->timeout_seconds, 5.0);
  c = parse_kv_transfer_config(R"({"kv_role": "kv_both", "kv_lease_seconds": 2.5, "kv_transfer_timeout_seconds": 1})");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->lease_seconds, 2.5);
  EXPECT_EQ(c->timeout_seconds, 1.0);
}

TEST(KVTransferParams, ParsedFromTheRequestAndChecked) {
  auto r = parse_completion_request(
      R"({"prompt": "x", "kv_transfer_params": {"do_remote_prefill": true, "remote_engine_id": "e",
          "remote_host": "10.0.0.1", "remote_port": 14579, "remote_block_keys": [["00000000000000ff"]],
          "remote_lease_ids": ["000000000000002a"], "remote_block_ids": [[[7], [0]]],
          "some_connector_extension": 1}})",
      ProtocolLimits{});
  ASSERT_TRUE(std::holds_alternative<GenerationRequest>(r));
  const auto& p = *std::get<GenerationRequest>(r).kv_transfer;
  EXPECT_TRUE(p.do_remote_prefill);
  EXPECT_EQ(p.remote_block_keys, (std::vector<std::vector<uint64_t>>{{0xff}}));
  EXPECT_EQ(p.remote_lease_ids, std::vector<uint64_t>{42});
  EXPECT_EQ(p.remote_block_ids, (std::vector<std::vector<std::vector<int32_t>>>{{{7}, {0}}}));

  auto bad = [](const std::string& params) {
    auto r = parse_chat_request(R"({"messages": [{"role": "user", "content": "x"}], "kv_transfer_params": )" +
                                    params + "}",
                                ProtocolLimits{});
    EXPECT_TRUE(std::holds_alternative<ApiError>(r)) << params;
    return std::holds_alternative<ApiError>(r) ? std::get<ApiError>(r) : ApiError{};
  };
  EXPECT_EQ(bad("3").param, "kv_transfer_params");
  EXPECT_NE(bad(R"({"do_remote_decode": "yes"})").message.find("do_remote_decode"), std::string::npos);
  EXPECT_NE(bad(R"({"do_remote_decode": true, "do_remote_prefill": true})").message.find("both"), std::string::npos);
  EXPECT_NE(bad(R"({"do_remote_prefill": true})").message.find("remote_engine_id"), std::string::npos);
  EXPECT_NE(bad(R"({"remote_block_keys": [["xyz"]]})").message.find("remote_block_keys"), std::string::npos);
  EXPECT_NE(bad(R"({"remote_lease_ids": [42]})").message.find("remote_lease_ids"), std::string::npos);
  EXPECT_NE(bad(R"({"remote_block_ids": [[[-1]]]})").message.find("remote_block_ids"), std::string::npos);
  EXPECT_NE(bad(R"({"remote_block_ids": [[7]]})").message.find("remote_block_ids"), std::string::npos);
}

TEST(PromptBlockKeys, TheEnginesChainedHashesOfFullBlocks) {
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  const auto keys = prompt_block_keys(prompt, 4, "");
  ASSERT_EQ(keys.size(), 2u);
  const std::span<const int32_t> t(prompt);
  EXPECT_EQ(keys[0], kv::hash_block(kv::kRootBlockHash, t.subspan(0, 4), 0));
  EXPECT_EQ(keys[1], kv::hash_block(keys[0], t.subspan(4, 4), 0));
  EXPECT_NE(prompt_block_keys(prompt, 4, "salt")[0], keys[0]);
}

}  // namespace
}  // namespace inferd::server
