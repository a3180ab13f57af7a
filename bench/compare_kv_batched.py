#!/usr/bin/env python3
"""Many streams at a long context per KV cache type, inferd beside llama.cpp, same model, same run
(issue 39: "16-stream output tokens/s at 4k-token contexts" and "concurrent 4k-token requests that fit in
1 GiB of KV", per dtype).

Decode of S streams that each hold C tokens of context, timed apart from their prompts:

  llama.cpp  llama-batched-bench -npp C -ntg N -npl S -ctk T -ctv T -fa on: it prefills the S prompts,
             then decodes N tokens for all S at once; its speed_tg = S * N / the decode time.
  inferd     `inferd bench throughput` of S random C-token prompts with a step budget of S * C tokens,
             so that one step prefills every prompt and each step after it decodes all S streams
             (N + 1 tokens out); decode tok/s = S / the mean time per output token after the first
             (TPOT: every request's decode steps are the same S-stream steps). (Subtracting a
             prefill-only run's time from the whole run's, as before, left the decode's few seconds
             at the mercy of a minute of prefill on a shared host: once above the memory floor.)

KV capacity: requests of C + N tokens that fit in 1 GiB of KV, from each engine's bytes per token:
inferd's `kv_bytes_per_token` (its engine stats), llama.cpp's KV buffer size over its cells (its log).

Usage: bench/compare_kv_batched.py [--model PATH] [--types f16,q8_0,q4_0] [--streams 16] [--context 4096]
       [--n 32] [--threads 2] [--skip-llama]
Prints a Markdown table for docs/benchmarks.md.
"""
import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare_llama_bench as clb  # noqa: E402

ROOT, CACHE = clb.ROOT, clb.CACHE
BATCHED_BENCH = CACHE / "llama.cpp" / "build" / "bin" / "llama-batched-bench"
GIB = 1 << 30


def loadavg():
    return float(Path("/proc/loadavg").read_text().split()[0])


def llama_batched(args, kv_type):
    """(decode tok/s, KV bytes per token) from one llama-batched-bench run."""
    cells = args.streams * (args.context + args.n)
    out = subprocess.run([str(BATCHED_BENCH), "-m", args.model, "-c", str(cells), "-b", "2048", "-ub", "512",
                          "-npp", str(args.context), "-ntg", str(args.n), "-npl", str(args.streams),
                          "-ctk", kv_type, "-ctv", kv_type, "-fa", "on", "-t", str(args.threads),
                          "--output-format", "jsonl", "-v"], check=True, capture_output=True, text=True)
    result = json.loads([line for line in out.stdout.splitlines() if line.startswith("{")][-1])
    # "llama_kv_cache: size = X MiB (CELLS cells, L layers, S/S seqs)": without a unified cache each of
    # the S sequences has CELLS cells of every layer.
    m = re.search(r"llama_kv_cache: size =\s*([\d.]+) MiB \(\s*(\d+) cells,\s*\d+ layers,\s*(\d+)/\d+ seqs",
                  out.stderr + out.stdout)
    per_token = float(m.group(1)) * (1 << 20) / (int(m.group(2)) * int(m.group(3))) if m else float("nan")
    return result["speed_tg"], per_token


def inferd_throughput(args, kv_type, output_len):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run([args.inferd, "bench", "throughput", "-m", args.model, "--num-prompts", str(args.streams),
                        "--max-num-seqs", str(args.streams), "--input-len", str(args.context),
                        "--output-len", str(output_len), "--max-num-batched-tokens", str(args.streams * args.context),
                        "--no-enable-prefix-caching", "--temp", "0", "--seed", "1", "-t", str(args.threads),
                        "--kv-cache-dtype", kv_type, "--kv-cache-memory", args.kv_cache_memory,
                        "--output-json", f.name], check=True, capture_output=True, text=True)
        return json.load(open(f.name))


def inferd_decode(args, kv_type):
    """(decode tok/s, KV bytes per token)."""
    whole = inferd_throughput(args, kv_type, args.n + 1)
    steps = whole["engine"]["steps"]
    if steps != args.n + 1:  # the prompts did not all fit one step: decode steps would carry prefill
        raise SystemExit(f"inferd ran {steps} steps for {args.n + 1} tokens; raise --kv-cache-memory")
    return args.streams / (whole["mean_tpot_ms"] / 1000.0), whole["engine"]["kv_bytes_per_token"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(CACHE / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--types", default="f16,q8_0,q4_0")
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kv-cache-memory", default="4G")
    ap.add_argument("--skip-llama", action="store_true")
    ap.add_argument("--inferd", default=str(ROOT / "build" / "inferd"))
    args = ap.parse_args()
    request_tokens = args.context + args.n
    rows, loads = [], [loadavg()]
    for t in args.types.split(","):
        llama = (float("nan"), float("nan")) if args.skip_llama else llama_batched(args, t)
        loads.append(loadavg())
        ours = inferd_decode(args, t)
        loads.append(loadavg())
        rows.append((t, llama, ours))
    base = {r[0]: r for r in rows}.get("f16")
    print(f"Model {Path(args.model).name}; {args.streams} streams of {args.context} tokens of context each, "
          f"{args.n} decode steps; {args.threads} threads; {clb.cpu_name()}; load {min(loads):.2f}-{max(loads):.2f}.\n")
    print("| KV cache | llama.cpp tg (tok/s) | inferd tg (tok/s) | inferd / llama.cpp | inferd / inferd f16 | "
          f"{request_tokens}-token requests per GiB: llama.cpp | inferd |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for t, (l_tps, l_bpt), (o_tps, o_bpt) in rows:
        rel = f"{o_tps / base[2][0]:.2f}" if base else ""
        per_gib = lambda bpt: f"{int(GIB // (bpt * request_tokens))}" if bpt == bpt else "-"
        print(f"| {t} | {l_tps:.1f} | {o_tps:.1f} | {o_tps / l_tps:.2f} | {rel} | {per_gib(l_bpt)} | {per_gib(o_bpt)} |")


if __name__ == "__main__":
    main()
