# Sourced by setup.sh and test.sh: the compiler cache for every CMake build
# they make (release, the Python module's, the sanitized one).
#
# CMake takes CMAKE_<LANG>_COMPILER_LAUNCHER from the environment when it first
# configures a build folder. CCACHE_BASEDIR makes ccache hash the checkout's
# paths relative to it, so a fresh clone in another folder (as CI's is) reuses
# what an earlier build on this machine compiled; the compile commands carry
# no absolute path of the checkout (tests/unit/test_data.h says how the tests
# find their data). Without ccache the builds simply compile everything.
if command -v ccache >/dev/null; then
  export CMAKE_C_COMPILER_LAUNCHER="${CMAKE_C_COMPILER_LAUNCHER:-ccache}"
  export CMAKE_CXX_COMPILER_LAUNCHER="${CMAKE_CXX_COMPILER_LAUNCHER:-ccache}"
  export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$(pwd -P)}"
  export CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-true}"
  # The three builds of this tree take about 3 GB of cache: keep the default
  # 5 GB from evicting one build's objects while another is compiled.
  if [[ -z "${CCACHE_MAXSIZE:-}" && "$(ccache -k max_size 2>/dev/null)" == "5.0G" ]]; then
    export CCACHE_MAXSIZE=12G
  fi
fi
