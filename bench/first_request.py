#!/usr/bin/env python3
"""Is the first request after start-up as fast as the next? TTFT of requests 1,
2 and 3 of a freshly created engine, with the start-up warm-up pass and
without it, the two alternating process by process.

Each run is one `inferd bench latency --num-iters-warmup 0 --num-iters 3` (a new
process: model load, engine creation, then three 32-token prompts one after
another). Reports the median over runs of each request's TTFT and the first
request's ratio to the third.

Usage: bench/first_request.py [--model PATH] [--runs 5] [--input-len 32]
"""
import argparse
import json
import statistics
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def ttfts(binary, model, warm, input_len, threads):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [str(binary), "bench", "latency", "--input-len", str(input_len), "--output-len", "1",
               "--num-iters", "3", "--num-iters-warmup", "0", "-t", str(threads),
               "--warm-up" if warm else "--no-warm-up", "--output-json", out.name]
        if model:
            cmd += ["-m", model]
        subprocess.run(cmd, check=True, capture_output=True)
        return json.loads(Path(out.name).read_text())["ttfts"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="", help="GGUF file (default: inferd's default model)")
    ap.add_argument("--binary", default=str(ROOT / "build" / "inferd"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    runs = {True: [], False: []}
    for _ in range(a.runs):
        for warm in (True, False):
            runs[warm].append(ttfts(a.binary, a.model, warm, a.input_len, a.threads))
    print(f"TTFT in ms, median of {a.runs} runs, {a.input_len}-token prompts, {a.threads} threads\n")
    print("| start-up | request 1 | request 2 | request 3 | request 1 / request 3 |")
    print("|---|---:|---:|---:|---:|")
    for warm in (True, False):
        med = [statistics.median(r[i] for r in runs[warm]) * 1e3 for i in range(3)]
        print(f"| {'warm-up pass' if warm else 'no warm-up'} | {med[0]:.1f} | {med[1]:.1f} | {med[2]:.1f} | "
              f"{med[0] / med[2]:.2f} |")


if __name__ == "__main__":
    main()
