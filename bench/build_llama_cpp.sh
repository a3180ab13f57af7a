#!/usr/bin/env bash
# Builds llama.cpp's native tools (llama-bench, llama-server, llama-cli,
# llama-perplexity, llama-quantize, llama-batched-bench) from the
# llama-cpp-python source package on PyPI, for side-by-side benchmarks.
# Usage: bench/build_llama_cpp.sh [DEST]   (default ~/.cache/inferd/llama.cpp)
set -euo pipefail
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
DEST="${1:-${INFERD_CACHE:-$HOME/.cache/inferd}/llama.cpp}"
JOBS="${JOBS:-$(nproc)}"
if [[ -x "$DEST/build/bin/llama-bench" && -x "$DEST/build/bin/llama-server" ]]; then
  # A build from before llama-perplexity was on the list gets just that tool.
  [[ -x "$DEST/build/bin/llama-perplexity" ]] || ninja -C "$DEST/build" -j "$JOBS" llama-perplexity
  # bench/make_synthetic_moe.py quantizes with llama-quantize.
  [[ -x "$DEST/build/bin/llama-quantize" ]] || ninja -C "$DEST/build" -j "$JOBS" llama-quantize
  # bench/compare_kv_batched.py decodes many streams with llama-batched-bench.
  [[ -x "$DEST/build/bin/llama-batched-bench" ]] || ninja -C "$DEST/build" -j "$JOBS" llama-batched-bench
  echo "llama.cpp tools already built in $DEST/build/bin"; exit 0
fi
mkdir -p "$DEST"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
pip download --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$work" >/dev/null
tar -xzf "$work"/llama_cpp_python-*.tar.gz -C "$work"
rm -rf "$DEST/src"
mv "$work"/llama_cpp_python-*/vendor/llama.cpp "$DEST/src"
# On CPUs with AMX (Intel Sapphire Rapids and later) a native build compiles
# GGML's AMX matmuls, and this version's crash there: llama-bench and
# llama-server die of SIGILL in tinygemm_kernel_amx on an OpenMP worker thread
# at the first matmul (seen on a 2-core Xeon VM, 2026-11-26, where AMX itself
# works once a process asks for it). Such hosts get the native build without
# AMX, i.e. GGML's AVX-512/VNNI kernels, the fastest llama.cpp that runs there.
NATIVE_FLAGS=""
if grep -qw amx_int8 /proc/cpuinfo 2>/dev/null; then
  NATIVE_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
fi
cmake -S "$DEST/src" -B "$DEST/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
  -DCMAKE_C_FLAGS="$NATIVE_FLAGS" -DCMAKE_CXX_FLAGS="$NATIVE_FLAGS" \
  -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON \
  -DLLAMA_BUILD_SERVER=ON >/dev/null
ninja -C "$DEST/build" -j "$JOBS" llama-bench llama-server llama-cli llama-perplexity llama-quantize llama-batched-bench
echo "built: $DEST/build/bin"
