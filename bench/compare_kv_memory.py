#!/usr/bin/env python3
"""KV-cache bytes one request takes, inferd beside llama.cpp, for a model with
sliding-window layers (Gemma 3) at several context lengths.

  inferd:    `inferd bench latency` runs one request of N prompt tokens and a few
             output tokens and reports the most KV blocks it held at once (during
             prefill: a windowed layer holds its window plus the step's chunk)
             and what it held at its last token (full-attention layers: every
             token; windowed layers: the window, rounded to blocks).
  llama.cpp: llama-server with -c N, one slot and --swa-full off (its default)
             allocates its KV cache at start-up and logs its size: the full
             layers get N cells, the windowed ones the window plus one ubatch
             (padded); that is what one request of N tokens occupies.

Usage: bench/compare_kv_memory.py [--model PATH] [--lengths 4096 8192]
       [--max-num-batched-tokens 512]
Prints a Markdown table for docs/benchmarks.md.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("INFERD_CACHE", Path.home() / ".cache" / "inferd"))
MODEL_DIR = Path(os.environ.get("INFERD_MODEL_DIR", CACHE / "models"))
LLAMA_BIN = CACHE / "llama.cpp" / "build" / "bin"
MIB = 1 << 20


def inferd_kv(binary, model, n_tokens, chunk, threads):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run([str(binary), "bench", "latency", "-m", str(model), "--input-len", str(n_tokens),
                        "--output-len", "4", "--num-iters", "1", "--num-iters-warmup", "0",
                        "--max-num-batched-tokens", str(chunk), "--kv-cache-memory", "2G",
                        "-t", str(threads), "--output-json", out.name],
                       check=True, capture_output=True, text=True)
        j = json.loads(Path(out.name).read_text())
    return j["peak_kv_bytes_per_request"], j["last_token_kv_bytes_per_request"]


def llama_cpp_kv(model, n_tokens, ubatch, threads):
    """Sum of the KV caches llama-server allocates for one slot of n_tokens."""
    env = dict(os.environ, LD_LIBRARY_PATH=str(LLAMA_BIN))
    with tempfile.TemporaryFile(mode="w+") as log:
        p = subprocess.Popen([str(LLAMA_BIN / "llama-server"), "-m", str(model), "-c", str(n_tokens), "-np", "1",
                              "-ub", str(ubatch), "-t", str(threads), "--port", "18997", "--host", "127.0.0.1",
                              "-v"],  # the KV cache sizes are logged only with -v
                             stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            deadline = time.time() + 300
            while time.time() < deadline and p.poll() is None:
                time.sleep(1)
                log.seek(0)
                text = log.read()
                if "listening" in text:
                    break
            else:
                sys.exit("llama-server did not start:\n" + text[-2000:])
        finally:
            p.terminate()
            p.wait()
    # One line per cache (non-SWA, SWA), logged once for a memory probe with
    # no buffer and again for the real allocation: keep the last of each.
    sizes = re.findall(r"llama_kv_cache: size =\s*([\d.]+) MiB \(\s*(\d+) cells,\s*(\d+) layers", text)
    if not sizes:
        sys.exit("no KV cache size in llama-server's log")
    caches = {}
    for mib, cells, layers in sizes:
        caches[(int(cells), int(layers))] = float(mib)
    last = sizes[-len(caches):]
    return sum(float(mib) for mib, _, _ in last) * MIB, [(int(c), int(l)) for _, c, l in last]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(MODEL_DIR / "gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("--binary", default=str(ROOT / "build" / "inferd"))
    ap.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192])
    ap.add_argument("--max-num-batched-tokens", type=int, default=512,
                    help="inferd's chunk (and llama.cpp's ubatch): both hold it beside the window")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    if not (LLAMA_BIN / "llama-server").exists():
        subprocess.run(["bash", str(ROOT / "bench" / "build_llama_cpp.sh")], check=True)

    print(f"Model: {Path(a.model).name}; chunk/ubatch {a.max_num_batched_tokens}; one request, f16 keys and values\n")
    print("| tokens | llama.cpp (--swa-full off) | inferd at its peak (prefill) | inferd at the last token | "
          "every layer full |")
    print("|---:|---:|---:|---:|---:|")
    for n in a.lengths:
        ref, caches = llama_cpp_kv(a.model, n, a.max_num_batched_tokens, a.threads)
        peak, last = inferd_kv(a.binary, a.model, n - 4, a.max_num_batched_tokens, a.threads)
        cells = ", ".join(f"{c} cells x {l} layers" for c, l in caches)
        layers = sum(l for _, l in caches)
        full = sum(ref / sum(c * l for c, l in caches) * n * l for _, l in caches) if caches else 0
        print(f"| {n} | {ref / MIB:.2f} MiB ({cells}) | {peak / MIB:.2f} MiB ({peak / ref:.2f}x) | "
              f"{last / MIB:.2f} MiB ({last / ref:.2f}x) | {full / MIB:.2f} MiB ({layers} layers x {n}) |")


if __name__ == "__main__":
    main()
