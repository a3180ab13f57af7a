#!/usr/bin/env python3
"""llama.cpp's perplexity of models over the committed corpus, for tests/unit/engine_perplexity_test.cpp.

Runs llama-perplexity (bench/build_llama_cpp.sh builds it) without flash attention, the path
whose logits inferd reproduces bit for bit, over tests/data/text/perplexity_corpus.txt with small
windows, and writes tests/data/perplexity/<name>.json: the running perplexity after each window
and the final estimate with its error, as llama-perplexity prints them (4 decimals; 5 for the
error).

Usage: tools/reference/perplexity_reference.py [--context 128] [--chunks 4]
"""
import argparse
import json
import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("INFERD_CACHE", Path.home() / ".cache" / "inferd"))
LLAMA = CACHE / "llama.cpp" / "build" / "bin" / "llama-perplexity"
CORPUS = ROOT / "tests" / "data" / "text" / "perplexity_corpus.txt"
MODELS = {
    "smollm2-135m": CACHE / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf",
    "tiny-qwen3": ROOT / "tests" / "data" / "models" / "tiny-qwen3.gguf",
    "tiny-gemma3": ROOT / "tests" / "data" / "models" / "tiny-gemma3.gguf",
}


def run(model, context, chunks):
    out = subprocess.run([str(LLAMA), "-m", str(model), "-f", str(CORPUS), "-c", str(context), "-b", str(context),
                          "--chunks", str(chunks), "-fa", "off", "-t", "2"],
                         capture_output=True, text=True, check=True)
    text = out.stdout + out.stderr
    windows = [float(x) for x in re.findall(r"\[\d+\]([0-9.]+),", text)]
    final = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", text)
    if not final or len(windows) != chunks:
        raise RuntimeError(f"unexpected llama-perplexity output for {model}:\n{text[-2000:]}")
    return windows, float(final.group(1)), float(final.group(2))


def ggml_flavour():
    """The GGML build llama-perplexity is (bench/build_llama_cpp.sh builds natively): the
    arithmetic the test loads the model to follow."""
    flags = Path("/proc/cpuinfo").read_text()
    return "avx512" if re.search(r"\bavx512f\b", flags) else "avx2"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--chunks", type=int, default=4)
    args = ap.parse_args()
    dest = ROOT / "tests" / "data" / "perplexity"
    dest.mkdir(parents=True, exist_ok=True)
    for name, model in MODELS.items():
        windows, ppl, err = run(model, args.context, args.chunks)
        data = {"model": model.name, "corpus": str(CORPUS.relative_to(ROOT)), "context": args.context,
                "chunks": args.chunks, "flash_attention": False, "ggml_flavour": ggml_flavour(), "window_perplexity": windows,
                "perplexity": ppl, "perplexity_error": err,
                "made_by": "tools/reference/perplexity_reference.py (llama-perplexity, llama-cpp-python 0.3.36)"}
        (dest / f"{name}.json").write_text(json.dumps(data, indent=2) + "\n")
        print(name, ppl, err)


if __name__ == "__main__":
    main()
