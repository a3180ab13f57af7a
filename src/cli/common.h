// Pieces shared by the CLI subcommands: model path defaults, loading with a
// progress bar, and flag groups.
#pragma once
#include <CLI/CLI.hpp>
#include <signal.h>
#include <functional>
#include <nlohmann/json.hpp>
#include <memory>
#include <string>
#include <vector>

#include "core/byte_size.h"
#include "core/result.h"
#include "engine/engine.h"
#include "engine/engine_args.h"
#include "engine/speculative_json.h"
#include "kernels/cpu/flavour.h"
#include "model/model.h"
#include "sampling/sampler.h"

namespace inferd::cli {

// $INFERD_MODEL_DIR, else ~/.cache/inferd/models.
std::string model_dir();
// Where `scripts/fetch_models.sh` puts the default model.
std::string default_model_path();

// Loads a model, drawing a progress bar on stderr when it is a terminal.
// Prints the error and returns nullptr on failure.
// n_threads: the forward pass's threads (0: one per hardware thread).
// flavour: which llama.cpp CPU build's arithmetic to follow (kernels/cpu/flavour.h).
// numerics: exact or fast kernels (kernels/cpu/numerics.h).
std::unique_ptr<Model> load_model_or_report(const std::string& path, bool quiet, int n_threads = 0,
                                            kernels::GgmlFlavour flavour = kernels::native_ggml_flavour(),
                                            kernels::Numerics numerics = kernels::Numerics::kExact,
                                            PipelineStage stage = {}, TensorShard shard = {},
                                            std::shared_ptr<TensorParallelComm> tensor_comm = nullptr);

struct SamplingFlags {
  float temperature = 0.8f;
  int32_t top_k = 40;
  float top_p = 0.95f;
  float min_p = 0.05f;
  float repeat_penalty = 1.0f;
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  int64_t seed = -1;  // -1: random
  void add_to(CLI::App& app);
  SamplingParams params() const;
};

// The engine's scheduling and KV-cache flags, named as vLLM's (serve, bench
// throughput); config() (EngineArgs) reads them.
struct EngineFlags : EngineArgs {
  void add_to(CLI::App& app);
};

void add_speculative_option(CLI::App& app, std::string& json);

// --kv-cache-dtype (vLLM's) and --cache-type-k / --cache-type-v (llama.cpp's;
// -ctk / -ctv are rewritten to them before parsing, see
// expand_llama_cpp_short_flags): EngineArgs' three names of the KV dtype,
// read by resolve_kv_cache_dtype.
void add_kv_cache_dtype_options(CLI::App& app, std::string& kv_cache_dtype, std::string& cache_type_k,
                                std::string& cache_type_v);

// --numerics exact|fast, read by resolve_numerics (engine_args.h).
void add_numerics_option(CLI::App& app, std::string& numerics);

// The command line with llama.cpp's multi-letter short flags (-ctk, -ctv)
// spelled as their long names: CLI11 takes a single dash for one letter, so
// `-ctk q8_0` would read as `-c tk`. Only whole arguments are rewritten.
std::vector<std::string> expand_llama_cpp_short_flags(int argc, char** argv);

// One request at a time through the serving engine, driven step by step on
// the calling thread: `generate` and `chat` use the same loop, sampler, stop
// handling and prefix cache as `serve` (a chat's earlier turns are prefix-cache
// hits), not a loop of their own.
class SingleRequestEngine {
 public:
  // An engine for one request of up to `max_model_len` tokens, run as up to
  // `max_sequences` sequences (a beam search's beams).
  // Its KV cache holds them in kv_cache_dtype (sized in that dtype's bytes).
  static Result<SingleRequestEngine> create(Model& model, int64_t max_model_len,
                                            const SpeculativeConfig& speculative = {}, int32_t max_sequences = 1,
                                            DType kv_cache_dtype = kv::kDefaultKVCacheDType);
  // The engine config that create() uses (a pipeline's other stages size
  // their KV caches from it), and create() from one.
  static EngineConfig engine_config(const Model& model, int64_t max_model_len, const SpeculativeConfig& speculative = {},
                                    int32_t max_sequences = 1, DType kv_cache_dtype = kv::kDefaultKVCacheDType);
  static Result<SingleRequestEngine> create(Model& model, const EngineConfig& config);
  // Runs `params` to the end, calling on_delta with each output as it comes;
  // returns the final output with every token id and the whole text.
  Result<RequestOutput> run(GenerationParams params, const std::function<void(const RequestOutput&)>& on_delta);

 private:
  explicit SingleRequestEngine(std::unique_ptr<Engine> engine) : engine_(std::move(engine)) {}
  std::unique_ptr<Engine> engine_;
};

// Writes `j` (indented) to `path`; prints the error and returns false if it cannot.
bool write_json_file(const std::string& path, const nlohmann::json& j);

int default_threads();

// What a server process (serve, router) does before it starts threads:
// SIGINT and SIGTERM blocked in every thread, to be taken by sigwait on the
// returned set; SIGPIPE ignored (a peer gone mid-write is an error code, not
// a death); the open-file limit raised to the hard limit (a descriptor per
// connection, not the usual 1,024).
sigset_t prepare_server_process();

// The graceful drain after a first SIGTERM (the server already refuses new
// requests): waits until `in_flight()` is zero, `timeout_seconds` have passed,
// or a second SIGINT or SIGTERM (from `signals`) asks to end at once. Returns
// whether every request finished; logs what happened.
bool drain_requests(const sigset_t& signals, double timeout_seconds, const std::function<int64_t()>& in_flight);

}  // namespace inferd::cli
