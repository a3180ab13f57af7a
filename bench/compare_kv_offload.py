#!/usr/bin/env python3
"""Multi-turn TTFT with KV offload tiers against recompute (issue 20, benchmark c).

Several chat conversations take turns round-robin against one `inferd serve`
whose KV pool holds a quarter of their working set, so each conversation comes
back after the others have pushed its blocks out. Each turn adds a user
message of about --turn-tokens tokens; TTFT is measured with streaming on every
turn after the first. Three servers run the same workload one after another,
interleaved over --rounds:

  recompute   no tiers: an evicted conversation is computed again
  host        --kv-offload-size: evicted blocks come back from memory
  disk        --kv-store-path only: evicted blocks come back from disk files
              (written through; on a warm page cache)

The pool is sized from the workload: the conversations' final prompts, in
blocks, divided by --pool-fraction-inverse (4: the working set is 4x the pool).
Prints a markdown table: median and p90 TTFT of the later turns, and ratios.

Usage: bench/compare_kv_offload.py [--conversations 8] [--turns 4] [--turn-tokens 300] [--rounds 2]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
BLOCK_BYTES = 368_640  # SmolLM2-135M: 30 layers x 16 tokens x 192 x 2 (K, V) x 2 bytes
WORDS = ("river mountain forest ocean island glacier desert valley canyon meadow harbor bridge tower "
         "garden market library station castle village lantern compass anchor journey summer winter").split()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def user_message(conv: int, turn: int, n_words: int) -> str:
    words = [WORDS[(conv * 7 + turn * 13 + i * 5 + i * i) % len(WORDS)] for i in range(n_words)]
    return f"Conversation {conv}, turn {turn}. Read these words and answer with the first one: " + " ".join(words)


class Server:
    def __init__(self, binary: str, model: str, args: list[str], log: Path):
        self.port = free_port()
        cmd = [binary, "serve", "--host", "127.0.0.1", "--port", str(self.port), "--threads", "2"] + args
        if model:
            cmd += ["-m", model]
        self.proc = subprocess.Popen(cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"server exited: {log.read_text()[-2000:]}")
            try:
                if requests.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.1)
        raise SystemExit("server not ready")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)

    def metric(self, name: str, **labels) -> float:
        total = 0.0
        for line in requests.get(self.url + "/metrics", timeout=10).text.splitlines():
            if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def ttft(self, messages: list[dict], max_tokens: int) -> tuple[float, str]:
        t0 = time.perf_counter()
        first = None
        text = []
        with requests.post(self.url + "/v1/chat/completions", stream=True, timeout=600,
                           json={"messages": messages, "max_tokens": max_tokens, "temperature": 0,
                                 "stream": True}) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                delta = json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                if delta and first is None:
                    first = time.perf_counter() - t0
                text.append(delta)
        return (first if first is not None else time.perf_counter() - t0), "".join(text)


def workload(srv: Server, a) -> tuple[list[float], list[str]]:
    history = [[{"role": "system", "content": "You are a concise assistant."}] for _ in range(a.conversations)]
    later, answers = [], []
    for turn in range(a.turns):
        for c in range(a.conversations):
            history[c].append({"role": "user", "content": user_message(c, turn, a.turn_tokens // 2)})
            t, text = srv.ttft(history[c], a.output_tokens)
            if turn > 0:
                later.append(t)
            answers.append(text)
            history[c].append({"role": "assistant", "content": text})
    return later, answers


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=str(ROOT / "build" / "inferd"))
    ap.add_argument("--model", default="")
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--turn-tokens", type=int, default=300, help="about this many tokens per user message")
    ap.add_argument("--output-tokens", type=int, default=16)
    ap.add_argument("--pool-fraction-inverse", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()

    # Working set: every conversation's final prompt (its turns and answers).
    final_tokens = a.turns * (a.turn_tokens + a.output_tokens + 30) + 30
    pool_blocks = a.conversations * ((final_tokens + 15) // 16) // a.pool_fraction_inverse
    pool = f"{pool_blocks * BLOCK_BYTES // 1024}K"
    work = Path(tempfile.mkdtemp(prefix="inferd-kv-offload-"))
    configs = {
        "recompute": ["--kv-cache-memory", pool],
        "host": ["--kv-cache-memory", pool, "--kv-offload-size", "2G"],
        "disk": ["--kv-cache-memory", pool, "--kv-store-path", str(work / "store"), "--kv-store-size", "4G"],
    }
    results: dict[str, list[float]] = {k: [] for k in configs}
    answers: dict[str, list[str]] = {}
    hits: dict[str, float] = {}
    for rnd in range(a.rounds):
        for name, args in configs.items():
            shutil.rmtree(work / "store", ignore_errors=True)
            srv = Server(a.binary, a.model, args, work / f"{name}-{rnd}.log")
            try:
                t, text = workload(srv, a)
                results[name] += t
                answers.setdefault(name, text)
                hits[name] = srv.metric("inferd:external_prefix_cache_hits_total")
            finally:
                srv.stop()
    shutil.rmtree(work, ignore_errors=True)

    cpu = platform.processor() or "cpu"
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    print(f"{a.conversations} conversations x {a.turns} turns, ~{a.turn_tokens}-token user turns, "
          f"{a.output_tokens}-token answers; pool {pool_blocks} blocks (working set {a.pool_fraction_inverse}x); "
          f"{a.rounds} rounds interleaved; {cpu}, {os.cpu_count()} cores, 2 threads\n")
    base = statistics.median(results["recompute"])
    print("| configuration | median TTFT of later turns (ms) | p90 (ms) | median vs recompute | tokens from tiers |")
    print("|---|---:|---:|---:|---:|")
    for name, ts in results.items():
        med = statistics.median(ts)
        p90 = statistics.quantiles(ts, n=10)[-1]
        print(f"| {name} | {med * 1e3:.0f} | {p90 * 1e3:.0f} | {base / med:.2f}x | {hits[name]:.0f} |")
    same = all(answers[n] == answers["recompute"] for n in answers)
    print(f"\nanswers equal across configurations: {same} (they may differ in the last bits where an earlier "
          f"answer's tokens are recomputed as prompt: docs/design.md, KV offload tiers)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
