// The request and response shapes of /v1/embeddings (OpenAI's) and
// /v1/rerank (Jina's, as llama-server and vLLM serve it). Pure (no engine, no
// tokenizer): every bad-input case is unit-tested without a model.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "server/openai_protocol.h"

namespace inferd::server {

struct EmbeddingLimits {
  size_t max_inputs = 2048;     // inputs of one /v1/embeddings request (OpenAI's limit)
  size_t max_documents = 1024;  // documents of one /v1/rerank request
};

// /v1/embeddings: `input` as a string, a list of strings, a list of token
// ids or a list of such lists; encoding_format "float" or "base64";
// `dimensions` as the client gave it (the server checks it against the model).
struct EmbeddingRequest {
  std::string model;
  std::vector<PromptInput> inputs;
  bool base64 = false;
  std::optional<int64_t> dimensions;
};

// /v1/rerank: the query, the documents (strings, or objects with "text"),
// the best top_n to return (default: all) and whether to return each
// document's text with its result.
struct RerankRequest {
  std::string model;
  std::string query;
  std::vector<std::string> documents;
  size_t top_n = 0;
  bool return_documents = true;
};

std::variant<EmbeddingRequest, ApiError> parse_embedding_request(std::string_view body, const EmbeddingLimits& limits);
std::variant<RerankRequest, ApiError> parse_rerank_request(std::string_view body, const EmbeddingLimits& limits);

// The vectors are L2-normalized before they are written (l2_normalized, model/pooling.h).

// OpenAI's embedding list: {"object": "list", "data": [{"object":
// "embedding", "index", "embedding"}], "model", "usage"}, each vector as
// floats or as base64 of its little-endian float32 bytes.
std::string embedding_response(const std::vector<std::vector<float>>& vectors, bool base64, const std::string& model,
                               int64_t prompt_tokens);

// Jina's rerank result: {"model", "object": "list", "usage", "results":
// [{"index", "relevance_score", "document": {"text"}}]}, the best top_n by
// score, highest first (ties by index).
std::string rerank_response(const RerankRequest& request, const std::vector<float>& scores, const std::string& model,
                            int64_t prompt_tokens);

}  // namespace inferd::server
