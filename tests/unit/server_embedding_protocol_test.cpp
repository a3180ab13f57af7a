// /v1/embeddings and /v1/rerank bodies: what parses, what is refused (with
// the field named), and the response shapes.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "model/pooling.h"
#include "server/embedding_protocol.h"

namespace inferd::server {
namespace {

using json = nlohmann::json;

EmbeddingRequest embed_ok(const std::string& body) {
  auto r = parse_embedding_request(body, EmbeddingLimits{});
  if (auto* e = std::get_if<ApiError>(&r)) ADD_FAILURE() << body << ": " << e->message;
  return std::get_if<EmbeddingRequest>(&r) ? std::get<EmbeddingRequest>(r) : EmbeddingRequest{};
}

ApiError embed_bad(const std::string& body, EmbeddingLimits limits = {}) {
  auto r = parse_embedding_request(body, limits);
  EXPECT_TRUE(std::holds_alternative<ApiError>(r)) << body;
  return std::holds_alternative<ApiError>(r) ? std::get<ApiError>(r) : ApiError{};
}

TEST(EmbeddingProtocol, InputShapes) {
  EmbeddingRequest r = embed_ok(R"({"model": "m", "input": "hello"})");
  ASSERT_EQ(r.inputs.size(), 1u);
  EXPECT_EQ(r.inputs[0].text, "hello");
  EXPECT_FALSE(r.base64);
  r = embed_ok(R"({"input": ["a", "b", [101, 102]], "encoding_format": "base64", "dimensions": 384})");
  ASSERT_EQ(r.inputs.size(), 3u);
  EXPECT_TRUE(r.inputs[2].is_tokens);
  EXPECT_EQ(r.inputs[2].token_ids, (std::vector<int32_t>{101, 102}));
  EXPECT_TRUE(r.base64);
  EXPECT_EQ(r.dimensions, 384);
  r = embed_ok(R"({"input": [101, 7592, 102]})");
  ASSERT_EQ(r.inputs.size(), 1u);
  EXPECT_EQ(r.inputs[0].token_ids.size(), 3u);
}

TEST(EmbeddingProtocol, BadInputNamesTheField) {
  EXPECT_EQ(embed_bad(R"({"model": "m"})").param, "input");
  EXPECT_EQ(embed_bad(R"({"input": []})").param, "input");
  EXPECT_EQ(embed_bad(R"({"input": ""})").param, "input");
  EXPECT_EQ(embed_bad(R"({"input": [[]]})").param, "input");
  EXPECT_EQ(embed_bad(R"({"input": [1, -2]})").param, "input");
  EXPECT_EQ(embed_bad(R"({"input": [{"x": 1}]})").param, "input");
  EXPECT_EQ(embed_bad(R"({"input": 5})").param, "input");
  EXPECT_EQ(embed_bad(R"({"input": "a", "encoding_format": "int8"})").param, "encoding_format");
  EXPECT_EQ(embed_bad(R"({"input": "a", "dimensions": 0})").param, "dimensions");
  EXPECT_EQ(embed_bad(R"({"input": "a", "model": 3})").param, "model");
  EXPECT_EQ(embed_bad(R"({"input": ["a", "b", "c"]})", EmbeddingLimits{.max_inputs = 2}).param, "input");
  EXPECT_EQ(embed_bad("not json").status, 400);
  EXPECT_EQ(embed_bad("[1]").status, 400);
}

TEST(EmbeddingProtocol, ResponseShape) {
  const json out = json::parse(embedding_response({{1.0f, 0.0f}, {0.0f, -2.0f}}, false, "m", 7));
  EXPECT_EQ(out["object"], "list");
  EXPECT_EQ(out["model"], "m");
  EXPECT_EQ(out["usage"]["prompt_tokens"], 7);
  EXPECT_EQ(out["usage"]["total_tokens"], 7);
  ASSERT_EQ(out["data"].size(), 2u);
  EXPECT_EQ(out["data"][1]["index"], 1);
  EXPECT_EQ(out["data"][1]["object"], "embedding");
  EXPECT_EQ(out["data"][1]["embedding"][1], -2.0);
  // 1.0f is 00 00 80 3f little-endian.
  const json b64 = json::parse(embedding_response({{1.0f}}, true, "m", 1));
  EXPECT_EQ(b64["data"][0]["embedding"], "AACAPw==");
  const std::vector<float> unit = l2_normalized({3.0f, 4.0f});
  EXPECT_FLOAT_EQ(unit[0], 0.6f);
  EXPECT_FLOAT_EQ(unit[1], 0.8f);
  EXPECT_EQ(l2_normalized({0.0f, 0.0f}), (std::vector<float>{0.0f, 0.0f}));
}

TEST(RerankProtocol, ParsesAndRefuses) {
  auto r = parse_rerank_request(R"({"query": "q", "documents": ["a", {"text": "b"}, "c"], "top_n": 2,
                                    "return_documents": false})",
                                EmbeddingLimits{});
  ASSERT_TRUE(std::holds_alternative<RerankRequest>(r));
  const RerankRequest& req = std::get<RerankRequest>(r);
  EXPECT_EQ(req.documents, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(req.top_n, 2u);
  EXPECT_FALSE(req.return_documents);
  auto bad = [](const std::string& body, EmbeddingLimits limits = {}) {
    auto p = parse_rerank_request(body, limits);
    EXPECT_TRUE(std::holds_alternative<ApiError>(p)) << body;
    return std::holds_alternative<ApiError>(p) ? std::get<ApiError>(p).param : std::string();
  };
  EXPECT_EQ(bad(R"({"documents": ["a"]})"), "query");
  EXPECT_EQ(bad(R"({"query": "q"})"), "documents");
  EXPECT_EQ(bad(R"({"query": "q", "documents": []})"), "documents");
  EXPECT_EQ(bad(R"({"query": "q", "documents": [1]})"), "documents");
  EXPECT_EQ(bad(R"({"query": "q", "documents": ["a"], "top_n": 0})"), "top_n");
  EXPECT_EQ(bad(R"({"query": "q", "documents": ["a", "b"]})", EmbeddingLimits{.max_documents = 1}), "documents");
}

TEST(RerankProtocol, ResultsSortedByScoreWithIndex) {
  RerankRequest req;
  req.documents = {"a", "b", "c", "d"};
  req.top_n = 3;
  const json out = json::parse(rerank_response(req, {0.5f, 2.0f, -1.0f, 0.5f}, "m", 12));
  EXPECT_EQ(out["object"], "list");
  EXPECT_EQ(out["usage"]["prompt_tokens"], 12);
  ASSERT_EQ(out["results"].size(), 3u);
  EXPECT_EQ(out["results"][0]["index"], 1);
  EXPECT_EQ(out["results"][0]["relevance_score"], 2.0);
  EXPECT_EQ(out["results"][0]["document"]["text"], "b");
  EXPECT_EQ(out["results"][1]["index"], 0);  // ties keep the documents' order
  EXPECT_EQ(out["results"][2]["index"], 3);
}

}  // namespace
}  // namespace inferd::server
