#!/usr/bin/env python3
"""Prefill/decode disaggregation against one instance with the same cores
(issue 20, benchmark a).

Workload, the same against both deployments: --streams requests decode long
answers back to back (short prompts, --stream-output tokens each), while long
prompts (--long-input tokens, --long-output tokens out) arrive at
--long-rate per second. Two `inferd bench serve` clients run at once: one
keeps the streams going, the other sends the long prompts. Reported: the
streams' inter-token latency (median, p99) and TTFT, and the long prompts'
TTFT.

  single   one `inferd serve --threads 2`
  1P1D     `inferd router` in front of a kv_producer (--threads 1, pinned to
           CPU 0) and a kv_consumer (--threads 1, pinned to CPU 1): the
           consumer takes the prompt's KV blocks from the producer and only
           decodes

On one instance every long prompt's prefill chunks share steps with the
decoding streams, so their tokens wait; with 1P1D the decode instance's steps
hold only decodes (and the copying of received blocks). Deployments alternate
over --rounds; the median of each figure is printed. Not a test: run it on a
quiet machine. The consumer's metrics show whether prompts were received or
recomputed (printed after each 1P1D run).

Usage: bench/compare_disaggregation.py [--rounds 2] [--streams 4] [--long-input 1536] [--long-rate 0.15]
           [--max-num-batched-tokens N]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


class Process:
    """One inferd process (serve or router), waited on until /health answers."""

    def __init__(self, cmd: list[str], port: int, log: Path, cpus: str | None = None):
        if cpus is not None:
            cmd = ["taskset", "-c", cpus] + cmd
        self.log = log
        self.proc = subprocess.Popen(cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 180
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"{cmd[0]} exited: {log.read_text()[-2000:]}")
            try:
                if requests.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.2)
        raise SystemExit(f"not ready: {' '.join(cmd)}")

    def metrics(self) -> str:
        return requests.get(self.url + "/metrics", timeout=10).text

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def metric_sum(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and (line[len(name)] in " {"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def serve_cmd(args, port: int, threads: int, extra: list[str]) -> list[str]:
    cmd = [args.binary, "serve", "--host", "127.0.0.1", "--port", str(port), "--threads", str(threads),
           "--max-num-seqs", str(args.streams + 8)] + extra
    if args.max_num_batched_tokens:
        cmd += ["--max-num-batched-tokens", str(args.max_num_batched_tokens)]
    if args.model:
        cmd += ["-m", args.model]
    return cmd


def start_single(args, tmp: Path) -> tuple[list[Process], str]:
    port = free_port()
    p = Process(serve_cmd(args, port, 2, []), port, tmp / "single.log")
    return [p], p.url


def start_1p1d(args, tmp: Path) -> tuple[list[Process], str]:
    pport, dport, rport, kvport = free_port(), free_port(), free_port(), free_port()
    producer_cfg = json.dumps({"kv_role": "kv_producer", "kv_port": kvport})
    consumer_cfg = json.dumps({"kv_role": "kv_consumer"})
    prefill = Process(serve_cmd(args, pport, 1, ["--kv-transfer-config", producer_cfg]), pport,
                      tmp / "prefill.log", cpus="0")
    decode = Process(serve_cmd(args, dport, 1, ["--kv-transfer-config", consumer_cfg]), dport,
                     tmp / "decode.log", cpus="1")
    router = Process([args.binary, "router", "--port", str(rport), "--prefill", prefill.url, "--decode", decode.url],
                     rport, tmp / "router.log")
    return [router, prefill, decode], router.url


def client(args, url: str, out: Path, num: int, input_len: int, output_len: int, seed: int,
           concurrency: int | None = None, rate: float | None = None, test_run: bool = True) -> subprocess.Popen:
    # test_run: bench serve first sends the first prompt once, untimed, until the server answers. Off for a
    # server already up: a server that keeps a slot's tokens (llama-server) would answer the timed copy of
    # that prompt from them.
    cmd = [args.binary, "bench", "serve", "--base-url", url, "--num-prompts", str(num),
           "--random-input-len", str(input_len), "--random-output-len", str(output_len),
           "--metric-percentiles", "50,99,99.9", "--seed", str(seed), "--output-json", str(out),
           "--request-timeout-sec", "3600"]  # long prompts' prefill can be silent for minutes
    if args.model:
        cmd += ["--tokenizer", args.model]
    if concurrency:
        cmd += ["--max-concurrency", str(concurrency)]
    if rate:
        cmd += ["--request-rate", str(rate)]
    if not test_run:
        cmd += ["--ready-check-timeout-sec", "0"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def run_once(args, name: str, tmp: Path, round_no: int) -> dict:
    procs, url = (start_single if name == "single" else start_1p1d)(args, tmp)
    try:
        # A few requests first, so both deployments start warm.
        warm = client(args, url, tmp / "warm.json", 4, 64, 8, seed=10_000 + round_no, concurrency=2)
        warm.wait()
        streams_json, long_json = tmp / f"{name}-streams.json", tmp / f"{name}-long.json"
        streams = client(args, url, streams_json, args.streams * args.stream_requests, args.stream_input,
                         args.stream_output, seed=round_no * 2, concurrency=args.streams)
        time.sleep(2.0)  # the streams are decoding when the first long prompt arrives
        longs = client(args, url, long_json, args.long_prompts, args.long_input, args.long_output,
                       seed=round_no * 2 + 1, rate=args.long_rate)
        for c in (longs, streams):
            _, err = c.communicate()
            if c.returncode != 0:
                raise SystemExit(f"bench serve failed: {err[-2000:]}")
        s, l = json.load(open(streams_json)), json.load(open(long_json))
        if s["failed"] or l["failed"]:
            raise SystemExit(f"{name}: failed requests ({s['failed']} streams, {l['failed']} long)")
        result = {
            "itl_median": s["median_itl_ms"], "itl_p99": s["p99_itl_ms"], "itl_p999": s["p99.9_itl_ms"],
            "stream_ttft_median": s["median_ttft_ms"],
            "long_ttft_median": l["median_ttft_ms"], "long_ttft_p99": l["p99_ttft_ms"],
            "stream_tok_s": s["output_throughput"],
        }
        if name == "1P1D":
            m = procs[2].metrics()
            result["recomputed"] = metric_sum(m, "inferd:kv_transfer_recomputed_prompts_total")
            result["received_blocks"] = metric_sum(m, "inferd:kv_transfer_received_blocks_total")
        return result
    finally:
        for p in procs:
            p.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=str(ROOT / "build" / "inferd"))
    ap.add_argument("--model", default=None, help="GGUF file (default: the default model)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--streams", type=int, default=4, help="requests decoding at once")
    ap.add_argument("--stream-requests", type=int, default=6, help="requests per stream, back to back")
    ap.add_argument("--stream-input", type=int, default=64)
    ap.add_argument("--stream-output", type=int, default=256)
    ap.add_argument("--long-prompts", type=int, default=6)
    ap.add_argument("--long-input", type=int, default=1536)
    ap.add_argument("--long-output", type=int, default=16)
    ap.add_argument("--long-rate", type=float, default=0.15, help="long prompts per second (Poisson)")
    ap.add_argument("--max-num-batched-tokens", type=int, default=0,
                    help="every instance's token budget a step (0: the server's default, 2048); below the long "
                         "prompts' length, one instance prefills them in chunks that share steps with the streams")
    args = ap.parse_args()

    results: dict[str, list[dict]] = {"single": [], "1P1D": []}
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        for r in range(args.rounds):
            for name in ("single", "1P1D"):
                res = run_once(args, name, tmp, r)
                results[name].append(res)
                print(f"round {r + 1} {name}: " + ", ".join(f"{k} {v:.1f}" for k, v in res.items()), flush=True)

    med = {n: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for n, rs in results.items()}
    print(f"\n{cpu_name()}, {os.cpu_count()} CPUs; {args.streams} streams of {args.stream_input}->"
          f"{args.stream_output} tokens; {args.long_prompts} prompts of {args.long_input}->{args.long_output} "
          f"tokens at {args.long_rate}/s; token budget {args.max_num_batched_tokens or 'default'}; medians of "
          f"{args.rounds} rounds\n")
    print("| figure (ms; tok/s) | single, 2 threads | 1P1D, 1 + 1 threads | single / 1P1D |")
    print("|---|---:|---:|---:|")
    for k, label in [("itl_median", "streams' ITL, median"), ("itl_p99", "streams' ITL, p99"),
                     ("itl_p999", "streams' ITL, p99.9"),
                     ("stream_ttft_median", "streams' TTFT, median"), ("long_ttft_median", "long prompts' TTFT, median"),
                     ("long_ttft_p99", "long prompts' TTFT, p99"), ("stream_tok_s", "streams' output tok/s")]:
        a, b = med["single"][k], med["1P1D"][k]
        print(f"| {label} | {a:.1f} | {b:.1f} | {a / b:.2f} |")
    print(f"\n1P1D consumer: {med['1P1D']['received_blocks']:.0f} blocks received, "
          f"{med['1P1D']['recomputed']:.0f} prompts recomputed (medians per run)")


if __name__ == "__main__":
    main()
