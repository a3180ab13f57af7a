#include "server/embedding_protocol.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include <nlohmann/json.hpp>

namespace inferd::server {

namespace {

using json = nlohmann::json;

// The first problem found, thrown to the parser's entry point.
struct Invalid {
  ApiError error;
};
[[noreturn]] void fail(std::string message, std::string param) { throw Invalid{bad_request(std::move(message), std::move(param))}; }

json parse_object(std::string_view body) {
  json j = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) fail("the request body is not valid JSON (or not UTF-8)", "");
  if (!j.is_object()) fail("the request body must be a JSON object", "");
  return j;
}

std::string optional_string(const json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return {};
  if (!it->is_string()) fail(std::string("'") + name + "' must be a string", name);
  return it->get<std::string>();
}

std::vector<int32_t> token_ids(const json& arr, const std::string& where) {
  std::vector<int32_t> ids;
  for (const json& v : arr) {
    if (!v.is_number_integer()) fail("'" + where + "' must hold token ids (integers)", "input");
    const int64_t id = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{INT32_MAX} ? -1 : v.get<int64_t>();
    if (id < 0 || id > std::numeric_limits<int32_t>::max()) fail("'" + where + "' holds an invalid token id", "input");
    ids.push_back(static_cast<int32_t>(id));
  }
  if (ids.empty()) fail("'" + where + "' is an empty list of token ids", "input");
  return ids;
}

const char kBase64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string base64_of(const unsigned char* p, size_t n) {
  std::string out;
  out.reserve((n + 2) / 3 * 4);
  for (size_t i = 0; i < n; i += 3) {
    const uint32_t b = (uint32_t{p[i]} << 16) | (i + 1 < n ? uint32_t{p[i + 1]} << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
    out += kBase64[(b >> 18) & 63];
    out += kBase64[(b >> 12) & 63];
    out += i + 1 < n ? kBase64[(b >> 6) & 63] : '=';
    out += i + 2 < n ? kBase64[b & 63] : '=';
  }
  return out;
}

}  // namespace

std::variant<EmbeddingRequest, ApiError> parse_embedding_request(std::string_view body, const EmbeddingLimits& limits) {
  try {
    const json j = parse_object(body);
    EmbeddingRequest r;
    r.model = optional_string(j, "model");
    auto input = j.find("input");
    if (input == j.end() || input->is_null()) fail("'input' is required", "input");
    if (input->is_string()) {
      r.inputs.push_back(PromptInput{input->get<std::string>(), {}, false});
    } else if (input->is_array()) {
      if (input->empty()) fail("'input' must not be an empty list", "input");
      if ((*input)[0].is_number()) {
        r.inputs.push_back(PromptInput{{}, token_ids(*input, "input"), true});
      } else {
        for (size_t i = 0; i < input->size(); ++i) {
          const json& item = (*input)[i];
          const std::string where = "input[" + std::to_string(i) + "]";
          if (item.is_string()) {
            r.inputs.push_back(PromptInput{item.get<std::string>(), {}, false});
          } else if (item.is_array()) {
            r.inputs.push_back(PromptInput{{}, token_ids(item, where), true});
          } else {
            fail("'" + where + "' must be a string or a list of token ids", "input");
          }
        }
      }
    } else {
      fail("'input' must be a string, a list of strings, or token ids", "input");
    }
    if (r.inputs.size() > limits.max_inputs)
      fail("'input' has " + std::to_string(r.inputs.size()) + " items; at most " + std::to_string(limits.max_inputs) +
               " are allowed",
           "input");
    for (size_t i = 0; i < r.inputs.size(); ++i)
      if (!r.inputs[i].is_tokens && r.inputs[i].text.empty())
        fail("'input' holds an empty string (item " + std::to_string(i) + ")", "input");
    const std::string format = optional_string(j, "encoding_format");
    if (!format.empty() && format != "float" && format != "base64")
      fail("'encoding_format' must be \"float\" or \"base64\", got \"" + format + "\"", "encoding_format");
    r.base64 = format == "base64";
    if (auto d = j.find("dimensions"); d != j.end() && !d->is_null()) {
      if (!d->is_number_integer() || d->get<int64_t>() < 1) fail("'dimensions' must be a positive integer", "dimensions");
      r.dimensions = d->get<int64_t>();
    }
    return r;
  } catch (const Invalid& e) {
    return e.error;
  }
}

std::variant<RerankRequest, ApiError> parse_rerank_request(std::string_view body, const EmbeddingLimits& limits) {
  try {
    const json j = parse_object(body);
    RerankRequest r;
    r.model = optional_string(j, "model");
    auto query = j.find("query");
    if (query == j.end() || !query->is_string()) fail("'query' is required and must be a string", "query");
    r.query = query->get<std::string>();
    auto docs = j.find("documents");
    if (docs == j.end() || !docs->is_array() || docs->empty())
      fail("'documents' is required and must be a non-empty list", "documents");
    if (docs->size() > limits.max_documents)
      fail("'documents' has " + std::to_string(docs->size()) + " items; at most " +
               std::to_string(limits.max_documents) + " are allowed",
           "documents");
    for (size_t i = 0; i < docs->size(); ++i) {
      const json& d = (*docs)[i];
      if (d.is_string()) {
        r.documents.push_back(d.get<std::string>());
      } else if (d.is_object() && d.contains("text") && d["text"].is_string()) {
        r.documents.push_back(d["text"].get<std::string>());
      } else {
        fail("'documents[" + std::to_string(i) + "]' must be a string or an object with a string 'text'", "documents");
      }
    }
    r.top_n = r.documents.size();
    if (auto t = j.find("top_n"); t != j.end() && !t->is_null()) {
      if (!t->is_number_integer() || t->get<int64_t>() < 1) fail("'top_n' must be a positive integer", "top_n");
      r.top_n = std::min<size_t>(r.top_n, t->get<uint64_t>());
    }
    if (auto rd = j.find("return_documents"); rd != j.end() && !rd->is_null()) {
      if (!rd->is_boolean()) fail("'return_documents' must be a boolean", "return_documents");
      r.return_documents = rd->get<bool>();
    }
    return r;
  } catch (const Invalid& e) {
    return e.error;
  }
}

std::string embedding_response(const std::vector<std::vector<float>>& vectors, bool base64, const std::string& model,
                               int64_t prompt_tokens) {
  json data = json::array();
  for (size_t i = 0; i < vectors.size(); ++i) {
    json item = {{"object", "embedding"}, {"index", i}};
    if (base64) {
      // The float32 bytes as they lie in memory: little-endian on the hosts inferd runs on.
      item["embedding"] = base64_of(reinterpret_cast<const unsigned char*>(vectors[i].data()),
                                    vectors[i].size() * sizeof(float));
    } else {
      item["embedding"] = vectors[i];
    }
    data.push_back(std::move(item));
  }
  const json out = {{"object", "list"},
                    {"data", std::move(data)},
                    {"model", model},
                    {"usage", {{"prompt_tokens", prompt_tokens}, {"total_tokens", prompt_tokens}}}};
  return out.dump();
}

std::string rerank_response(const RerankRequest& request, const std::vector<float>& scores, const std::string& model,
                            int64_t prompt_tokens) {
  std::vector<size_t> order(scores.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return scores[a] > scores[b]; });
  order.resize(std::min(order.size(), request.top_n));
  json results = json::array();
  for (size_t i : order) {
    json item = {{"index", i}, {"relevance_score", scores[i]}};
    if (request.return_documents) item["document"] = {{"text", request.documents[i]}};
    results.push_back(std::move(item));
  }
  const json out = {{"model", model},
                    {"object", "list"},
                    {"usage", {{"prompt_tokens", prompt_tokens}, {"total_tokens", prompt_tokens}}},
                    {"results", std::move(results)}};
  return out.dump();
}

}  // namespace inferd::server
