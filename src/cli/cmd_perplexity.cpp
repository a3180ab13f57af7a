// `inferd perplexity`: a model's perplexity over a text file, llama-perplexity's
// windows and positions, and with --kl-divergence how far the chosen KV cache
// dtype moves each prediction from an f16 cache's (engine/perplexity.h); with
// --numerics fast too, from the exact tier's with an f16 cache.
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "cli/commands.h"
#include "cli/common.h"
#include "engine/perplexity.h"
#include "kv/kv_cache_dtype.h"

namespace inferd::cli {

namespace {

struct PerplexityFlags {
  std::string model;
  std::string file;
  int64_t context = 512;
  int64_t batch = 512;
  int64_t chunks = -1;
  std::string kv_cache_dtype = "auto", cache_type_k, cache_type_v;
  std::string numerics = kernels::numerics_name(kernels::kDefaultNumerics);  // resolve_numerics
  bool kl_divergence = false;
  bool json = false;
  int threads = default_threads();
};

int run_perplexity(const PerplexityFlags& f) {
  const Result<DType> dtype = resolve_kv_cache_dtype(f.kv_cache_dtype, f.cache_type_k, f.cache_type_v);
  if (!dtype) {
    std::fprintf(stderr, "error: %s\n", dtype.error().message.c_str());
    return 1;
  }
  std::ifstream in(f.file, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "error: cannot read %s\n", f.file.c_str());
    return 1;
  }
  std::stringstream text;
  text << in.rdbuf();
  const auto numerics = resolve_numerics(f.numerics);
  if (!numerics) {
    std::fprintf(stderr, "error: %s\n", numerics.error().message.c_str());
    return 1;
  }
  auto model = load_model_or_report(f.model, f.json, f.threads, kernels::native_ggml_flavour(), *numerics);
  if (!model) return 1;
  if (!model->can_generate()) {
    std::fprintf(stderr, "error: %s\n", unsupported_architecture_message(model->config().architecture).c_str());
    return 1;
  }
  // Special-token text in the file stays text, as llama-perplexity reads it.
  const std::vector<int32_t> tokens = model->tokenizer().encode(text.str(), /*add_special=*/true, false);
  PerplexityOptions o;
  o.context = f.context;
  o.batch = f.batch;
  o.max_windows = f.chunks;
  o.kv_dtype = *dtype;
  o.compare_with_f16 = f.kl_divergence;
  // The fast tier is compared with the exact one: the same file loaded again.
  std::unique_ptr<Model> exact;
  if (f.kl_divergence && *numerics != kernels::Numerics::kExact) {
    exact = load_model_or_report(f.model, true, f.threads, kernels::native_ggml_flavour(), kernels::Numerics::kExact);
    if (!exact) return 1;
    o.base_model = exact.get();
  }
  const std::string base_name = exact ? "exact numerics, f16 KV cache" : "f16 KV cache";
  if (!f.json)
    std::fprintf(stderr, "%zu tokens, windows of %lld, KV cache %s, %s numerics%s\n", tokens.size(),
                 static_cast<long long>(f.context), kv::kv_cache_dtype_name(*dtype).c_str(),
                 kernels::numerics_name(*numerics), f.kl_divergence ? (" against " + base_name).c_str() : "");
  auto r = measure_perplexity(*model, tokens, o, [&](const PerplexityResult& p) {
    if (!f.json) std::fprintf(stderr, "[%lld]%.4f ", static_cast<long long>(p.windows), p.perplexity());
  });
  if (!f.json) std::fprintf(stderr, "\n");
  if (!r) {
    std::fprintf(stderr, "error: %s\n", r.error().message.c_str());
    return 1;
  }
  if (f.json) {
    nlohmann::json j = {{"tokens", tokens.size()},       {"context", f.context},
                        {"windows", r->windows},         {"scored", r->scored},
                        {"kv_cache_dtype", kv::kv_cache_dtype_name(*dtype)},
                        {"numerics", kernels::numerics_name(*numerics)}, {"perplexity", r->perplexity()},
                        {"perplexity_error", r->perplexity_error()}};
    if (r->compared) {
      j["baseline"] = base_name;
      j["perplexity_f16"] = r->perplexity_base();
      j["kl_divergence_mean"] = r->kl_mean();
      j["kl_divergence_mean_error"] = r->kl_mean_error();
      j["kl_divergence_median"] = r->kl_quantile(0.5);
      j["kl_divergence_p99"] = r->kl_quantile(0.99);
      j["kl_divergence_max"] = r->kl_quantile(1.0);
      j["p_diff_rms"] = r->p_diff_rms();
      j["same_top"] = r->same_top_share();
    }
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("Final estimate: PPL = %.4f +/- %.5f (%lld windows, %lld positions, KV cache %s)\n", r->perplexity(),
              r->perplexity_error(), static_cast<long long>(r->windows), static_cast<long long>(r->scored),
              kv::kv_cache_dtype_name(*dtype).c_str());
  if (r->compared) {
    std::printf("%s: PPL = %.4f; ratio %.6f\n", base_name.c_str(), r->perplexity_base(),
                r->perplexity() / r->perplexity_base());
    std::printf("KL divergence from it: mean %.6f +/- %.6f, median %.6f, 99%% %.6f, max %.6f\n", r->kl_mean(),
                r->kl_mean_error(), r->kl_quantile(0.5), r->kl_quantile(0.99), r->kl_quantile(1.0));
    std::printf("Same top token: %.3f%%; RMS change of p(next token): %.4f%%\n", 100.0 * r->same_top_share(),
                100.0 * r->p_diff_rms());
  }
  return 0;
}

}  // namespace

void register_perplexity(CLI::App& app, int& exit_code) {
  auto flags = std::make_shared<PerplexityFlags>();
  flags->model = default_model_path();
  CLI::App* sub = app.add_subcommand("perplexity", "Perplexity over a text file, and a KV cache dtype's KL divergence");
  sub->add_option("-m,--model", flags->model, "GGUF model file")->capture_default_str();
  sub->add_option("-f,--file", flags->file, "Text file to score")->required();
  sub->add_option("-c,--ctx-size", flags->context, "Tokens per window (the second half of each is scored)")
      ->capture_default_str()
      ->check(CLI::Range(4, 1 << 20));
  sub->add_option("-b,--batch-size", flags->batch, "Tokens per forward pass")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  sub->add_option("--chunks", flags->chunks, "Windows to score (-1: all)")->capture_default_str();
  add_kv_cache_dtype_options(*sub, flags->kv_cache_dtype, flags->cache_type_k, flags->cache_type_v);
  add_numerics_option(*sub, flags->numerics);
  sub->add_flag("--kl-divergence", flags->kl_divergence,
                "Also run an f16 KV cache (with --numerics fast: and exact numerics) and report the KL divergence "
                "of each prediction from it");
  sub->add_option("-t,--threads", flags->threads, "Threads")->capture_default_str()->check(CLI::Range(1, 1024));
  sub->add_flag("--json", flags->json, "Print the figures as JSON");
  sub->callback([flags, &exit_code] { exit_code = run_perplexity(*flags); });
}

}  // namespace inferd::cli
