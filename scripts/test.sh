#!/usr/bin/env bash
# Runs every test: the release build's unit and reference tests, then the
# input-parsing modules again under AddressSanitizer + UndefinedBehaviorSanitizer.
# Expects scripts/setup.sh to have run (the README's test command does both).
#   scripts/test.sh                  # what CI runs (within its time on 2 cores)
#   scripts/test.sh --large-models   # and the forward passes of Gemma 3 270M and
#                                    # Qwen2.5-Coder-0.5B/-1.5B (about 25 minutes more)
set -euo pipefail
cd "$(dirname "$0")/.."
# The full-size models beside the default one take minutes a test on 2 cores;
# their tests skip, saying so, unless asked for (tests/unit/engine_test_util.h,
# tests/e2e/conftest.py). Their tokenizers are tested either way.
export INFERD_TEST_LARGE_MODELS=0
for arg in "$@"; do
  case "$arg" in
    --large-models) INFERD_TEST_LARGE_MODELS=1 ;;
    *) echo "usage: scripts/test.sh [--large-models]" >&2; exit 2 ;;
  esac
done
[[ -x "$HOME/.cargo/bin/cargo" ]] && export PATH="$HOME/.cargo/bin:$PATH"
JOBS="$(nproc)"
source scripts/build_env.sh

# The tests read every model (each architecture is checked against llama.cpp);
# setup.sh fetches only the default one that serving needs. Cached after once.
scripts/fetch_models.sh --all

echo "== release build"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C build -j "$JOBS"
echo "== unit and reference tests (release)"
ctest --test-dir build --output-on-failure -j "$JOBS"

echo "== end-to-end: the server on the default model (pytest, openai client)"
python3 -m pytest -q tests/e2e
# The two-machine tests leave their network namespaces up (kept for reruns); take
# them down, so the UCX tests below do not try the namespace link: a refused
# connect there once tripped an assertion inside libucp.
bash scripts/netns_hosts.sh down

echo "== the Python package: pip install . and its tests"
# The build dependencies come from setup.sh, so pip need not fetch them into an
# isolated environment; build/python keeps the module's build between runs.
PIP_INSTALL=(python3 -m pip install -q --no-build-isolation .)
CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" "${PIP_INSTALL[@]}" 2>/dev/null ||
  CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" "${PIP_INSTALL[@]}" --break-system-packages
python3 -m pytest -q tests/python

echo "== sanitizer build (ASan + UBSan)"
# The modules that parse untrusted input or own memory, and their tests.
SANITIZED_TESTS=(gguf_loader_test tokenizer_test chat_template_test kernels_quants_test kernels_packed_test
                 kernels_attention_test kernels_attention_quant_test kernels_fp8_test kernels_activation_test kernels_rms_norm_test
                 kernels_matmul_test kernels_fast_gemm_test kernels_bf16_gemm_test kernels_dense_attention_test kernels_moe_routing_test kv_block_pool_test kv_cache_manager_test kv_connector_test kvstore_tiers_test kvtransfer_ucx_agent_test engine_scheduler_test engine_beam_search_test engine_sampling_stage_test
                 server_openai_protocol_test server_messages_protocol_test bench_sse_test bench_openai_api_test bench_dataset_test
                 bench_serve_client_test core_thread_pool_test model_weight_prefetch_test kernels_ggml_matmul_test
                 model_architecture_test kernels_float_table_test kernels_kquant_pack_test
                 structured_grammar_test structured_vocab_test sampling_token_mask_test server_structured_outputs_test
                 chat_tool_calls_test server_tool_calling_test server_webui_test engine_engine_args_test
                 chat_harmony_test server_chat_formats_test server_responses_protocol_test
                 tokenizer_wordpiece_test server_embedding_protocol_test kernels_delta_net_test kernels_selective_scan_test)
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DINFERD_SANITIZE=ON >/dev/null
ninja -C build-asan -j "$JOBS" "${SANITIZED_TESTS[@]}"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# One test per core at a time (each runs on one thread), each to its own log,
# shown whole when it fails.
mkdir -p build-asan/logs
run_sanitized() {
  if ./build-asan/"$1" --gtest_brief=1 >"build-asan/logs/$1.log" 2>&1; then
    echo "-- $1 (sanitized): passed"
  else
    echo "-- $1 (sanitized): FAILED"
    cat "build-asan/logs/$1.log"
    return 1
  fi
}
export -f run_sanitized
results="$(printf '%s\n' "${SANITIZED_TESTS[@]}" | xargs -P "$JOBS" -I{} bash -c 'run_sanitized {}' || true)"
echo "$results"
passed="$(grep -c ': passed$' <<<"$results" || true)"
failed=$(( ${#SANITIZED_TESTS[@]} - passed ))
echo "sanitized: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
