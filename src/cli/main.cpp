// inferd: one binary, many subcommands.
#include <CLI/CLI.hpp>

#include "cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"inferd: LLM inference and serving engine"};
  app.require_subcommand(1);
  int exit_code = 0;
  inferd::cli::register_generate(app, exit_code);
  inferd::cli::register_chat(app, exit_code);
  inferd::cli::register_info(app, exit_code);
  inferd::cli::register_serve(app, exit_code);
  inferd::cli::register_router(app, exit_code);
  inferd::cli::register_perplexity(app, exit_code);
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks");
  bench->require_subcommand(1);
  inferd::cli::register_bench_throughput(*bench, exit_code);
  inferd::cli::register_bench_serve(*bench, exit_code);
  inferd::cli::register_bench_latency(*bench, exit_code);
  CLI11_PARSE(app, argc, argv);
  return exit_code;
}
