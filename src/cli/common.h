// Pieces shared by the CLI subcommands: model path defaults, loading with a
// progress bar, and flag groups.
#pragma once
#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "model/model.h"
#include "sampling/sampler.h"

namespace inferd::cli {

// $INFERD_MODEL_DIR, else ~/.cache/inferd/models.
std::string model_dir();
// Where `scripts/fetch_models.sh` puts the default model.
std::string default_model_path();

// Loads a model, drawing a progress bar on stderr when it is a terminal.
// Prints the error and returns nullptr on failure.
std::unique_ptr<Model> load_model_or_report(const std::string& path, bool quiet);

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

int default_threads();

// "1073741824", "512M", "2G", "1.5GiB" -> bytes; -1 if malformed or not positive.
int64_t parse_bytes(const std::string& s);

}  // namespace inferd::cli
