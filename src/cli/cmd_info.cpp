// `inferd info`: what a model file holds, without running it.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/common.h"
#include "engine/engine.h"
#include "engine/kv_capacity.h"
#include "kernels/cpu/kernel_table.h"
#include "kv/kv_cache_dtype.h"

namespace inferd::cli {

namespace {
struct InfoFlags {
  std::string model;
  bool json = false;
  bool show_template = false;
  std::string numerics = kernels::numerics_name(kernels::kDefaultNumerics);
};

// What --numerics picks on this CPU, in words.
std::string numerics_description(kernels::Numerics n) {
  if (n == kernels::Numerics::kExact) return "exact: bit-identical with llama.cpp's CPU build";
  return std::string("fast: activations quantized once per row, integer sums per weight block (") +
         kernels::kernel_table().level + " kernels)";
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  while (b >= 1024 && u < 3) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f %s", b, units[u]);
  return buf;
}

struct KVCacheRow {
  std::string dtype;
  int64_t bytes_per_token = 0;
  int64_t tokens_per_gib = 0;  // in blocks of 16 tokens, as serve sizes them
};

constexpr int32_t kBlockSize = 16;  // EngineArgs' default

// A model with recurrent layers: its per-sequence state, which the KV budget
// holds for max_num_seqs sequences and the prefix cache's snapshots (serve's
// defaults here) before its blocks.
KVCapacity recurrent_state(const ModelConfig& c) {
  if (!c.has_recurrent_layers()) return {};
  const EngineConfig d;
  return kv_capacity_for_bytes(c, kBlockSize, DType::F16, 0, d.max_num_seqs + d.state_snapshots);
}

std::vector<KVCacheRow> kv_cache_rows(const ModelConfig& c) {
  std::vector<KVCacheRow> rows;
  if (c.n_layer < 1 || c.head_dim < 1) return rows;
  // Tokens a GiB of blocks holds: a hybrid model's states come on top.
  const int64_t state_bytes = recurrent_state(c).state_bytes;
  // A model with sliding-window layers: each quantized dtype also with those
  // layers kept f16 (--kv-cache-dtype-skip-layers sliding_window).
  const bool windowed = std::any_of(c.layers.begin(), c.layers.end(),
                                    [](const LayerConfig& l) { return l.sliding_window > 0 && !l.recurrent; });
  for (DType t : {DType::F16, DType::Q8_0, DType::Q4_0}) {
    for (const bool skip : {false, true}) {
      if (skip && (!windowed || t == DType::F16)) continue;
      const kv::KVCacheSpec spec = KVLayout::plan(c, kBlockSize, t, skip).storage_spec();
      if (!spec.validate()) continue;
      const KVCapacity cap = kv_capacity_for_bytes(c, kBlockSize, t, (int64_t{1} << 30) + state_bytes,
                                                   EngineConfig{}.max_num_seqs, skip);
      rows.push_back({kv::kv_cache_dtype_name(t) + (skip ? " (sliding_window f16)" : ""),
                      static_cast<int64_t>(cap.bytes_per_token), cap.tokens});
    }
  }
  return rows;
}

int run_info(const InfoFlags& f) {
  const auto numerics = resolve_numerics(f.numerics);
  if (!numerics) {
    std::fprintf(stderr, "error: %s\n", numerics.error().message.c_str());
    return 1;
  }
  // Described, not loaded for running: a file inferd cannot run (another
  // architecture, a weight type without kernels) is still shown, with why.
  LoadOptions options;
  options.describe_only = true;
  options.prefault = false;
  auto loaded = Model::load(f.model, options);
  if (!loaded) {
    std::fprintf(stderr, "error: cannot load model: %s\n", loaded.error().message.c_str());
    return 1;
  }
  const std::unique_ptr<Model>& model = *loaded;
  const ModelConfig& c = model->config();
  std::string cannot_run;
  if (!c.can_generate()) {
    cannot_run = unsupported_architecture_message(c.architecture);
  } else if (auto w = ModelWeights::from_gguf(model->file(), c); !w) {
    cannot_run = w.error().message;
  }
  const gguf::File& file = model->file();
  // A tokenizer inferd cannot read is one more reason the file does not run.
  const Tokenizer* tok = model->tokenizer_error().empty() ? &model->tokenizer() : nullptr;
  if (!tok && cannot_run.empty()) cannot_run = model->tokenizer_error();
  std::string tokenizer_name;
  if (file.find("tokenizer.ggml.model"))
    if (auto s = file.get_string("tokenizer.ggml.model")) tokenizer_name = *s;
  int64_t params = 0;
  std::map<std::string, std::pair<int64_t, uint64_t>> by_type;  // count, bytes
  for (const auto& t : file.tensors()) {
    params += t.n_elements();
    auto& e = by_type[dtype_name(t.dtype)];
    e.first++;
    e.second += t.n_bytes;
  }
  std::string tmpl;
  if (file.find("tokenizer.chat_template"))
    if (auto s = file.get_string("tokenizer.chat_template")) tmpl = *s;

  nlohmann::json j;
  j["path"] = f.model;
  j["gguf_version"] = file.version();
  j["file_bytes"] = file.file_size();
  j["architecture"] = c.architecture;
  j["name"] = c.name;
  j["can_generate"] = cannot_run.empty();
  if (!cannot_run.empty()) j["cannot_run"] = cannot_run;
  j["parameters"] = params;
  j["layers"] = c.n_layer;
  j["embedding_length"] = c.n_embd;
  j["feed_forward_length"] = c.n_ff;
  j["attention_heads"] = c.n_head;
  j["kv_heads"] = c.n_head_kv;
  j["head_dim"] = c.head_dim;
  if (c.moe.n_expert > 0) {
    j["experts"] = {{"count", c.moe.n_expert},
                    {"used", c.moe.n_expert_used},
                    {"feed_forward_length", c.moe.n_ff_exp},
                    {"leading_dense_layers", c.moe.n_leading_dense},
                    {"shared", c.moe.n_expert_shared}};
  }
  if (c.mla) {
    j["latent_attention"] = {{"q_lora_rank", c.mla.q_lora_rank},
                             {"kv_lora_rank", c.mla.kv_lora_rank},
                             {"qk_nope_head_dim", c.mla.qk_nope},
                             {"qk_rope_head_dim", c.mla.qk_rope},
                             {"v_head_dim", c.mla.v_head}};
  }
  if (c.n_layer_nextn > 0) j["nextn_layers"] = c.n_layer_nextn;  // in the file after `layers`, not run
  j["context_length"] = c.context_length;
  j["rope_freq_base"] = c.rope_freq_base;
  j["sliding_window"] = c.sliding_window;
  j["vocab_size"] = c.n_vocab;
  if (tok) {
    j["tokenizer"] = tok->model_name();
    j["bos_token_id"] = tok->bos_id();
    j["eos_token_id"] = tok->eos_id();
  } else {
    j["tokenizer"] = tokenizer_name;
    j["tokenizer_error"] = model->tokenizer_error();
  }
  // What the KV cache costs per token in the dtypes --kv-cache-dtype offers
  // most (a dtype whose blocks do not divide the head size has no row).
  const std::vector<KVCacheRow> kv_rows = kv_cache_rows(c);
  j["kv_cache"] = nlohmann::json::array();
  for (const KVCacheRow& r : kv_rows)
    j["kv_cache"].push_back(
        {{"dtype", r.dtype}, {"bytes_per_token", r.bytes_per_token}, {"tokens_per_gib", r.tokens_per_gib}});
  const KVCapacity state = recurrent_state(c);
  if (state.state_slots > 0) {
    j["recurrent_state"] = {{"layers", c.n_recurrent_layers()},
                            {"bytes_per_sequence", state.state_bytes_per_sequence},
                            {"sequences_per_gib", (int64_t{1} << 30) / static_cast<int64_t>(state.state_bytes_per_sequence)},
                            {"default_max_num_seqs", EngineConfig{}.max_num_seqs},
                            {"default_state_snapshots", EngineConfig{}.state_snapshots},
                            {"state_snapshot_interval", EngineConfig{}.state_snapshot_interval},
                            {"default_bytes", state.state_bytes}};
  }
  j["tensor_count"] = file.tensors().size();
  for (const auto& [name, e] : by_type) j["tensor_types"][name] = {{"count", e.first}, {"bytes", e.second}};
  j["numerics"] = {{"tier", kernels::numerics_name(*numerics)}, {"description", numerics_description(*numerics)}};
  j["chat_template"] = tmpl.empty() ? nlohmann::json(nullptr) : nlohmann::json(tmpl);
  if (f.json) {
    std::cout << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    return 0;
  }
  std::printf("model          %s\n", f.model.c_str());
  std::printf("name           %s\n", c.name.c_str());
  std::printf("format         GGUF v%u, %s\n", file.version(), human_bytes(file.file_size()).c_str());
  std::printf("architecture   %s\n", c.architecture.c_str());
  std::printf("runs          %s%s\n", cannot_run.empty() ? " yes" : " no: ", cannot_run.c_str());
  std::printf("parameters     %.1f M\n", params / 1e6);
  std::printf("layers         %lld, embedding %lld, feed-forward %lld%s\n", (long long)c.n_layer,
              (long long)c.n_embd, (long long)c.n_ff,
              c.n_layer_nextn > 0 ? (" (then " + std::to_string(c.n_layer_nextn) + " NextN, not run)").c_str() : "");
  if (c.moe.n_expert > 0)
    std::printf("experts        %lld of %lld per token, feed-forward %lld each%s%s\n", (long long)c.moe.n_expert_used,
                (long long)c.moe.n_expert, (long long)c.moe.n_ff_exp,
                c.moe.n_expert_shared > 0 ? (", " + std::to_string(c.moe.n_expert_shared) + " shared").c_str() : "",
                c.moe.n_leading_dense > 0
                    ? (", " + std::to_string(c.moe.n_leading_dense) + " leading dense layers").c_str()
                    : "");
  int64_t windowed = 0;
  for (const LayerConfig& layer : c.layers) windowed += layer.sliding_window > 0;
  std::string window;
  if (windowed > 0)
    window = ", sliding window " + std::to_string(c.sliding_window) + " on " + std::to_string(windowed) + " of " +
             std::to_string(c.n_layer) + " layers";
  else if (c.sliding_window > 0)
    window = ", sliding window " + std::to_string(c.sliding_window);
  if (c.mla) {
    // The cache keeps one latent + RoPE key a token (head_dim), not per-head keys and values.
    std::printf("attention      %lld heads, latent (MLA): cache %lld = latent %lld + RoPE key %lld, query %s, "
                "heads' keys %lld, values %lld\n",
                (long long)c.n_head, (long long)c.mla.latent_width(), (long long)c.mla.kv_lora_rank,
                (long long)c.mla.qk_rope,
                c.mla.q_lora_rank > 0 ? ("compressed to " + std::to_string(c.mla.q_lora_rank)).c_str() : "direct",
                (long long)c.mla.q_head(), (long long)c.mla.v_head);
  } else {
    std::printf("attention      %lld heads, %lld KV heads, head size %lld%s\n", (long long)c.n_head,
                (long long)c.n_head_kv, (long long)c.head_dim, window.c_str());
  }
  if (c.is_encoder()) {
    std::printf("context        %lld tokens (learned positions), non-causal (an encoder)\n", (long long)c.context_length);
  } else {
    std::printf("context        %lld tokens (RoPE base %g)\n", (long long)c.context_length, c.rope_freq_base);
  }
  if (c.pooling != PoolingType::kNone)
    std::printf("pooling        %s (%s)\n", pooling_name(c.pooling),
                c.can_rank() ? "a reranker: /v1/rerank" : c.can_embed() ? "embeddings: /v1/embeddings" : "not run");
  if (tok) {
    std::printf("vocabulary     %lld tokens, %s, BOS %d, EOS %d\n", (long long)c.n_vocab, tok->model_name().c_str(),
                tok->bos_id(), tok->eos_id());
  } else {
    std::printf("vocabulary     %lld tokens, %s (not read: %s)\n", (long long)c.n_vocab, tokenizer_name.c_str(),
                model->tokenizer_error().c_str());
  }
  if (!kv_rows.empty()) {
    int width = 7;  // the dtype column fits its longest name ("q8_0 (sliding_window f16)")
    for (const KVCacheRow& r : kv_rows) width = std::max(width, static_cast<int>(r.dtype.size()));
    std::printf("KV cache       %-*s %15s %15s\n", width, "dtype", "bytes/token", "tokens/GiB");
    for (const KVCacheRow& r : kv_rows)
      std::printf("               %-*s %15lld %15lld\n", width, r.dtype.c_str(),
                  static_cast<long long>(r.bytes_per_token), static_cast<long long>(r.tokens_per_gib));
  }
  std::printf("numerics       %s\n", numerics_description(*numerics).c_str());
  if (state.state_slots > 0)
    std::printf("state          %s a sequence (f32; %lld recurrent layers), %lld sequences/GiB; "
                "--max-num-seqs %d and %d prefix-cache snapshots (the defaults; one every %lld prompt tokens) "
                "take %s of the KV budget before the blocks above\n",
                human_bytes(static_cast<double>(state.state_bytes_per_sequence)).c_str(),
                static_cast<long long>(j["recurrent_state"]["layers"].get<int64_t>()),
                static_cast<long long>(j["recurrent_state"]["sequences_per_gib"].get<int64_t>()),
                EngineConfig{}.max_num_seqs, EngineConfig{}.state_snapshots,
                static_cast<long long>(EngineConfig{}.state_snapshot_interval),
                human_bytes(static_cast<double>(state.state_bytes)).c_str());
  std::printf("tensors        %zu\n", file.tensors().size());
  for (const auto& [name, e] : by_type)
    std::printf("  %-6s       %4lld tensors, %s\n", name.c_str(), (long long)e.first,
                human_bytes(e.second).c_str());
  if (tmpl.empty()) {
    std::printf("chat template  (none)\n");
  } else if (f.show_template) {
    std::printf("chat template\n%s\n", tmpl.c_str());
  } else {
    std::printf("chat template  %zu characters (--template to print it)\n", tmpl.size());
  }
  return 0;
}
}  // namespace

void register_info(CLI::App& app, int& exit_code) {
  auto flags = std::make_shared<InfoFlags>();
  CLI::App* sub = app.add_subcommand("info", "Describe a model file");
  sub->add_option("model", flags->model, "GGUF model file")->required();
  sub->add_flag("--json", flags->json, "Print as JSON");
  sub->add_flag("--template", flags->show_template, "Print the chat template");
  add_numerics_option(*sub, flags->numerics);
  sub->callback([flags, &exit_code] { exit_code = run_info(*flags); });
}

}  // namespace inferd::cli
