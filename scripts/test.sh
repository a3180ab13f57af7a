#!/usr/bin/env bash
# Runs every test: the release build's unit and reference tests, then the
# input-parsing modules again under AddressSanitizer + UndefinedBehaviorSanitizer.
# Expects scripts/setup.sh to have run (the README's test command does both).
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -x "$HOME/.cargo/bin/cargo" ]] && export PATH="$HOME/.cargo/bin:$PATH"
JOBS="$(nproc)"

echo "== release build"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C build -j "$JOBS"
echo "== unit and reference tests (release)"
ctest --test-dir build --output-on-failure -j "$JOBS"

echo "== sanitizer build (ASan + UBSan)"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DINFERD_SANITIZE=ON >/dev/null
ninja -C build-asan -j "$JOBS" gguf_loader_test tokenizer_test chat_template_test kernels_quants_test
echo "== loader, tokenizer, chat template and kernel tests under the sanitizers"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j "$JOBS" -R '^(Gguf|Tokenizer|Chat|Quant|Kernel)'
