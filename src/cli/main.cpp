// inferd: one binary, many subcommands.
#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/common.h"

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
  std::vector<std::string> args = inferd::cli::expand_llama_cpp_short_flags(argc, argv);
  std::vector<char*> arg_ptrs;
  for (std::string& a : args) arg_ptrs.push_back(a.data());
  CLI11_PARSE(app, static_cast<int>(arg_ptrs.size()), arg_ptrs.data());
  return exit_code;
}
