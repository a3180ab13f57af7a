#include "server/embedding_protocol.h"
#include "server/serving_embedding.h"

namespace inferd::server {

namespace {

struct PreparedRerank {
  RerankRequest req;
  std::vector<std::vector<int32_t>> pairs;  // per document: [CLS] query [SEP] document [SEP]
  int64_t prompt_tokens = 0;
};

std::variant<PreparedRerank, ApiError> prepare_rerank(const ServingCore& core, const std::string& body) {
  auto parsed = parse_rerank_request(body, EmbeddingLimits{});
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  PreparedRerank pr;
  pr.req = std::move(std::get<RerankRequest>(parsed));
  if (auto e = core.check_model(pr.req.model)) return *e;
  const ModelConfig& config = core.model().config();
  if (!config.can_rank())
    return bad_request("the model '" + core.options().served_model_name +
                           "' cannot rerank: its GGUF has no rank pooling (serve a reranker, e.g. a bert cross-encoder "
                           "GGUF with pooling_type rank)",
                       "model");
  for (size_t i = 0; i < pr.req.documents.size(); ++i) {
    pr.pairs.push_back(encode_pair(core.tokenizer(), pr.req.query, pr.req.documents[i]));
    const int64_t n = static_cast<int64_t>(pr.pairs.back().size());
    if (n > config.context_length)
      return bad_request("the query with document " + std::to_string(i) + " has " + std::to_string(n) +
                             " tokens; this model reads at most " + std::to_string(config.context_length),
                         "documents");
    pr.prompt_tokens += n;
  }
  return pr;
}

}  // namespace

boost::asio::awaitable<void> serve_rerank(ServingCore& core, Exchange& ex) {
  const std::string& body = ex.request().body();
  auto work = [&core, &body] { return prepare_rerank(core, body); };
  std::variant<PreparedRerank, ApiError> prepared = co_await core.workers().run(std::move(work));
  if (auto* e = std::get_if<ApiError>(&prepared)) {
    co_await ex.respond(static_cast<http::status>(e->status), "application/json", error_json(*e));
    co_return;
  }
  PreparedRerank& pr = std::get<PreparedRerank>(prepared);
  std::optional<std::vector<std::vector<float>>> outputs =
      co_await core.run_pooled(ex, pr.pairs, "rerank-" + random_hex(24));
  if (!outputs) co_return;  // answered with an error, or the client went away
  // The first of the head's outputs is the relevance score (llama.cpp's rank pooling).
  std::vector<float> scores;
  for (const std::vector<float>& v : *outputs)
    scores.push_back(v.empty() ? 0.0f : v[0]);
  co_await ex.respond(http::status::ok, "application/json",
                      rerank_response(pr.req, scores, core.options().served_model_name, pr.prompt_tokens));
}

}  // namespace inferd::server
