#include <CLI/CLI.hpp>
int main(int argc, char** argv) {
  CLI::App app{"inferd: LLM inference and serving engine"};
  CLI11_PARSE(app, argc, argv);
  return 0;
}
