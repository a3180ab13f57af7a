#include "server/serving_embedding.h"

#include "model/pooling.h"
#include "server/embedding_protocol.h"

namespace inferd::server {

namespace {

struct PreparedEmbedding {
  EmbeddingRequest req;
  std::vector<std::vector<int32_t>> inputs;
  int64_t prompt_tokens = 0;
};

ApiError cannot_embed(const ServingCore& core) {
  return bad_request("the model '" + core.options().served_model_name + "' cannot embed: its GGUF has no " +
                         (core.model().config().can_rank() ? "embedding pooling (it is a reranker: use /v1/rerank)"
                                                           : "pooling type (serve an embedding GGUF, e.g. a bert or Qwen3-Embedding one)"),
                     "model");
}

std::variant<PreparedEmbedding, ApiError> prepare_embedding(const ServingCore& core, const std::string& body) {
  auto parsed = parse_embedding_request(body, EmbeddingLimits{});
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  PreparedEmbedding pe;
  pe.req = std::move(std::get<EmbeddingRequest>(parsed));
  if (auto e = core.check_model(pe.req.model)) return *e;
  const ModelConfig& config = core.model().config();
  if (!config.can_embed()) return cannot_embed(core);
  // The model's vectors have one size; none of the models inferd runs is
  // trained to be cut shorter (Matryoshka), so only that size is accepted.
  if (pe.req.dimensions && *pe.req.dimensions != config.n_embd)
    return bad_request("this model does not support 'dimensions' other than its embeddings' " +
                           std::to_string(config.n_embd),
                       "dimensions");
  const Tokenizer& tok = core.tokenizer();
  for (PromptInput& in : pe.req.inputs) {
    if (in.is_tokens) {
      for (int32_t id : in.token_ids)
        if (id >= tok.n_vocab())
          return bad_request("token id " + std::to_string(id) + " in 'input' is outside the vocabulary of " +
                                 std::to_string(tok.n_vocab()) + " tokens",
                             "input");
      pe.inputs.push_back(std::move(in.token_ids));
    } else {
      pe.inputs.push_back(tok.encode(in.text, /*add_special=*/true, /*parse_special=*/true));
    }
    const int64_t n = static_cast<int64_t>(pe.inputs.back().size());
    if (n > config.context_length)
      return bad_request("input " + std::to_string(pe.inputs.size() - 1) + " has " + std::to_string(n) +
                             " tokens; this model reads at most " + std::to_string(config.context_length),
                         "input");
    pe.prompt_tokens += n;
  }
  return pe;
}

}  // namespace

boost::asio::awaitable<void> serve_embeddings(ServingCore& core, Exchange& ex) {
  const std::string& body = ex.request().body();
  auto work = [&core, &body] { return prepare_embedding(core, body); };
  std::variant<PreparedEmbedding, ApiError> prepared = co_await core.workers().run(std::move(work));
  if (auto* e = std::get_if<ApiError>(&prepared)) {
    co_await ex.respond(static_cast<http::status>(e->status), "application/json", error_json(*e));
    co_return;
  }
  PreparedEmbedding& pe = std::get<PreparedEmbedding>(prepared);
  std::optional<std::vector<std::vector<float>>> vectors =
      co_await core.run_pooled(ex, pe.inputs, "embd-" + random_hex(24));
  if (!vectors) co_return;  // answered with an error, or the client went away
  for (std::vector<float>& v : *vectors) v = l2_normalized(std::move(v));
  co_await ex.respond(http::status::ok, "application/json",
                      embedding_response(*vectors, pe.req.base64, core.options().served_model_name, pe.prompt_tokens));
}

}  // namespace inferd::server
