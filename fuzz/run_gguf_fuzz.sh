#!/usr/bin/env bash
# Builds the GGUF reader's libFuzzer target (clang, ASan+UBSan) in build-fuzz
# and runs it for the given number of seconds (default 180).
#   fuzz/run_gguf_fuzz.sh [seconds] [extra libFuzzer flags...]
# New interesting inputs go to build-fuzz/corpus/gguf (the committed seeds in
# fuzz/corpus/gguf stay untouched); crashes are written to build-fuzz/.
set -euo pipefail
seconds="${1:-180}"
shift || true
root="$(cd "$(dirname "$0")/.." && pwd)"
build="$root/build-fuzz"

if [ ! -f "$build/build.ninja" ]; then
  CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DINFERD_FUZZ=ON -DINFERD_BUILD_TESTS=OFF
fi
ninja -C "$build" -j2 gguf_fuzz

mkdir -p "$build/corpus/gguf"
cd "$build"
exec ./gguf_fuzz -max_total_time="$seconds" -rss_limit_mb=2048 -max_len=65536 \
  -dict="$root/fuzz/gguf_fuzz.dict" -print_final_stats=1 "$@" \
  "$build/corpus/gguf" "$root/fuzz/corpus/gguf"
