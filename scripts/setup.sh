#!/usr/bin/env bash
# All set-up on a fresh Debian machine: system packages, the models, and a
# release build in build/. Safe to run again: each step skips what is done.
set -euo pipefail
cd "$(dirname "$0")/.."

# chromium and chromium-driver: the web page's tests drive a real headless browser;
# libxxhash-dev: checksums and fingerprints of offloaded KV blocks.
# libucx-dev: UCX, the transport of the KV transfer between prefill and decode instances.
# libicu-dev: Unicode data (categories, NFD, lowercasing) for BERT's WordPiece tokenizer.
# openmpi-bin, libopenmpi-dev: MPI, which launches and connects the ranks of a pipeline-parallel model.
# ccache: the compiler cache of every build here (scripts/build_env.sh).
APT_PACKAGES=(cmake ninja-build ccache g++ pkg-config nlohmann-json3-dev libcli11-dev libpcre2-dev
              libboost-dev libspdlog-dev libicu-dev libgtest-dev libxxhash-dev libucx-dev openmpi-bin libopenmpi-dev python3 python3-pip python3-dev curl
              chromium chromium-driver)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# npm: the Codex CLI end-to-end test installs @openai/codex with it. Where
# Node.js came from elsewhere (NodeSource's nodejs bundles npm and conflicts
# with Debian's npm package) it is there already; the test skips, saying why,
# if npm cannot be had.
if ! command -v npm >/dev/null; then
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq npm >/dev/null ||
    echo "warning: npm could not be installed; the Codex CLI test will skip" >&2
fi
# Chat templates (minijinja) and structured outputs (llguidance) are Rust
# crates: use the rustup toolchain if present, else Debian's.
if ! command -v cargo >/dev/null; then
  [[ -x "$HOME/.cargo/bin/cargo" ]] && export PATH="$HOME/.cargo/bin:$PATH"
fi
if ! command -v cargo >/dev/null; then
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq cargo rustc >/dev/null
fi
# llguidance needs Rust 1.87 or newer; Debian 12's is 1.63 (too old for
# minijinja too). rustup's toolchains cannot be fetched from here (only package
# registries are reachable), so say what is missing instead of failing later.
RUST_MIN=1.87
rust_version() { rustc --version 2>/dev/null | awk '{print $2}'; }
if [[ "$(printf '%s\n%s\n' "$RUST_MIN" "$(rust_version)" | sort -V | head -1)" != "$RUST_MIN" ]]; then
  echo "error: Rust $RUST_MIN or newer is needed (found: $(rust_version || true)); install it with rustup" >&2
  exit 1
fi

scripts/fetch_models.sh ${INFERD_FETCH_ALL_MODELS:+--all}

# The end-to-end tests talk to the server through the official OpenAI client;
# the structured-output tests validate its answers with pydantic and jsonschema;
# the web page's tests drive Chromium with selenium. The Python package
# (pip install .) builds with scikit-build-core and pybind11 and draws its
# progress bar with tqdm. lm-evaluation-harness (with its API models' extra)
# scores the server as evaluators do (tests/e2e/test_lm_eval.py). The Messages
# API is tested with Anthropic's official client (anthropic).
PY_PACKAGES=(openai anthropic pytest requests pydantic jsonschema selenium "scikit-build-core>=0.10" "pybind11>=2.10" tqdm
             "lm-eval[api]==0.4.13")
if ! python3 -c "import openai, anthropic, pytest, requests, pydantic, jsonschema, selenium, scikit_build_core, pybind11, tqdm, lm_eval, tenacity" 2>/dev/null; then
  python3 -m pip install -q "${PY_PACKAGES[@]}" 2>/dev/null ||
    python3 -m pip install -q --break-system-packages "${PY_PACKAGES[@]}"
fi

source scripts/build_env.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C build -j "$(nproc)" inferd
