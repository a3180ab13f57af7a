#!/usr/bin/env bash
# Builds the structured-output libFuzzer target (clang, ASan+UBSan) and runs it
# for the given number of seconds (default 120). The build directory is
# $INFERD_FUZZ_BUILD (default build-fuzz, shared with run_gguf_fuzz.sh).
#   fuzz/run_structured_fuzz.sh [seconds] [extra libFuzzer flags...]
# New interesting inputs go to <build>/corpus/structured (the committed seeds
# in fuzz/corpus/structured stay untouched); crashes are written to <build>/.
set -euo pipefail
seconds="${1:-120}"
shift || true
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${INFERD_FUZZ_BUILD:-$root/build-fuzz}"
[[ -x "$HOME/.cargo/bin/cargo" ]] && export PATH="$HOME/.cargo/bin:$PATH"

if [ ! -f "$build/build.ninja" ]; then
  CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DINFERD_FUZZ=ON -DINFERD_BUILD_TESTS=OFF
fi
ninja -C "$build" -j2 structured_fuzz

mkdir -p "$build/corpus/structured"
cd "$build"
exec ./structured_fuzz -max_total_time="$seconds" -rss_limit_mb=2048 -max_len=4096 -timeout=10 \
  -dict="$root/fuzz/structured_fuzz.dict" -print_final_stats=1 "$@" \
  "$build/corpus/structured" "$root/fuzz/corpus/structured"
