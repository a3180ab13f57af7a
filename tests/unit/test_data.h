// Where the committed test data (tests/data) lives, for every unit test.
//
// The build passes INFERD_TEST_DATA_FROM_BINARY as a path relative to the
// test binary's own directory and the binary resolves it at run time, so no
// compile command holds the checkout's absolute path: the compiler cache
// (ccache with CCACHE_BASEDIR, scripts/build_env.sh) then serves the same
// objects to a clone in another folder, as CI's fresh clone is.
#pragma once
#include <filesystem>
#include <string>
#include <system_error>

namespace inferd::test {

inline std::string test_data_root() {
  static const std::string root = [] {
    std::error_code ec;
    const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
    const std::filesystem::path from = ec ? std::filesystem::current_path() : exe.parent_path();
    return (from / INFERD_TEST_DATA_FROM_BINARY).lexically_normal().string();
  }();
  return root;
}

}  // namespace inferd::test
