#!/usr/bin/env python3
"""Decode speed at a long context per KV cache type, inferd beside llama.cpp, same model, same run.

At long context the KV cache, not the weights, is most of what a decode step reads, so a smaller
cache element should decode faster. For each type:

  llama.cpp  llama-bench -p 0 -n N -d DEPTH -ctk T -ctv T -fa 1 (flash attention: llama.cpp
             needs it for a quantized V cache; used for f16 too, its faster long-context path)
  inferd     `inferd generate` of N + 1 tokens after a DEPTH-token prompt, --kv-cache-dtype T;
             decode tok/s = (generated - 1) / decode seconds (the first token comes from prefill)

Usage: bench/compare_kv_decode.py --model PATH [--types f16,q8_0,q4_0] [--depth 16384] [--n 64]
Prints a Markdown table for docs/benchmarks.md.
"""
import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare_llama_bench as clb  # noqa: E402

ROOT, CACHE = clb.ROOT, clb.CACHE
LLAMA_BENCH = CACHE / "llama.cpp" / "build" / "bin" / "llama-bench"


def loadavg():
    return float(Path("/proc/loadavg").read_text().split()[0])


def inferd_generate(args, prompt, n, kv_type):
    out = subprocess.run([args.inferd, "generate", "-m", args.model, "-p", prompt, "-n", str(n), "--temp", "0",
                          "--ignore-eos", "--json", "-t", str(args.threads), "-c", str(args.depth + args.n + 256),
                          "--kv-cache-dtype", kv_type], check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def long_prompt(args):
    """The longest repetition of the committed corpus's text of at most --depth tokens (bisecting on
    its length in characters)."""
    corpus = (ROOT / "tests" / "data" / "text" / "perplexity_corpus.txt").read_text()
    text = corpus * (1 + args.depth * 8 // len(corpus))
    def count(k):
        try:
            return len(inferd_generate(args, text[:k], 0, "f16")["prompt_ids"])
        except subprocess.CalledProcessError:  # longer than the context: refused
            return args.depth + args.n + 257
    lo, hi = 1, len(text)
    while hi - lo > 64:
        mid = (lo + hi) // 2
        if count(mid) <= args.depth:
            lo = mid
        else:
            hi = mid
    return text[:lo]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--types", default="f16,q8_0,q4_0")
    ap.add_argument("--depth", type=int, default=16384)
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--inferd", default=str(ROOT / "build" / "inferd"))
    args = ap.parse_args()
    prompt = long_prompt(args)
    rows = []
    loads = [loadavg()]
    for t in args.types.split(","):
        o = subprocess.run([str(LLAMA_BENCH), "-m", args.model, "-p", "0", "-n", str(args.n), "-d", str(args.depth),
                            "-ctk", t, "-ctv", t, "-fa", "1", "-t", str(args.threads), "-r", "1", "-o", "json"],
                           check=True, capture_output=True, text=True).stdout
        llama = json.loads(o)[0]["avg_ts"]
        j = inferd_generate(args, prompt, args.n + 1, t)
        tm = j["timings"]
        ours = (tm["generated_tokens"] - 1) / tm["decode_seconds"]
        rows.append((t, tm["prompt_tokens"], llama, ours))
        loads.append(loadavg())
    base = {r[0]: r for r in rows}.get("f16")
    print(f"Model {Path(args.model).name}; decode of {args.n} tokens after {args.depth} tokens of context; "
          f"{args.threads} threads; {clb.cpu_name()}; load {min(loads):.2f}-{max(loads):.2f}.\n")
    print("| KV cache | inferd prompt tokens | llama.cpp tg (tok/s) | inferd tg (tok/s) | inferd / llama.cpp | "
          "inferd / inferd f16 |")
    print("|---|---:|---:|---:|---:|---:|")
    for t, n_prompt, llama, ours in rows:
        rel = f"{ours / base[3]:.2f}" if base else ""
        print(f"| {t} | {n_prompt} | {llama:.2f} | {ours:.2f} | {ours / llama:.2f} | {rel} |")


if __name__ == "__main__":
    main()
