// Each subcommand registers its flags on the app and runs from its callback,
// leaving the process exit code in `exit_code`.
#pragma once
#include <CLI/CLI.hpp>

namespace inferd::cli {
void register_generate(CLI::App& app, int& exit_code);
void register_chat(CLI::App& app, int& exit_code);
void register_info(CLI::App& app, int& exit_code);
void register_serve(CLI::App& app, int& exit_code);
void register_router(CLI::App& app, int& exit_code);
void register_perplexity(CLI::App& app, int& exit_code);
// Benchmarks register under the `bench` subcommand.
void register_bench_throughput(CLI::App& bench, int& exit_code);
void register_bench_serve(CLI::App& bench, int& exit_code);
void register_bench_latency(CLI::App& bench, int& exit_code);
}  // namespace inferd::cli
