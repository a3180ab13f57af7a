#!/usr/bin/env python3
"""A model split across two processes beside one process, on one machine (issue 40's benchmarks).

Three layouts, run interleaved (one run of each per repetition, in turn, so that a noisy neighbour
touches all three alike):
  one process   `inferd bench ...` with --threads 2 (both cores)
  TP=2          `mpirun -np 2 inferd bench ... --tensor-parallel-size 2`, one thread a rank
  PP=2          `mpirun -np 2 inferd bench ... --pipeline-parallel-size 2`, one thread a rank
and with --netns two more, the same across two machines: the two network namespaces of
scripts/netns_hosts.sh (made if missing; needs root), one rank in each, talking by TCP over the veth
between them instead of by shared memory:
  TP=2 2 machines   `scripts/netns_hosts.sh mpirun -np 2 inferd bench ... --tensor-parallel-size 2`
  PP=2 2 machines   `scripts/netns_hosts.sh mpirun -np 2 inferd bench ... --pipeline-parallel-size 2`

Measured, per layout:
  decode      batch-1 decode tokens/s: `inferd bench latency` (--input-len 32, --output-len 128), the
              median over its timed iterations; the table gives the median over repetitions.
  16 streams  output tokens/s of `inferd bench throughput` with 16 requests at once (random 128-token
              prompts, 128 output tokens each, ignore_eos).
  collective  TP: the mean time of one collective (an all-gather) (the wait for the slowest rank included), rank 0's from
              the JSON and rank 1's from its log line at shutdown, in the decode runs.
  memory      each rank's peak resident set (VmHWM of /proc/<pid>/status, read every 50 ms while it
              runs), beside the one process's. Every layout caches the same tokens: each process
              and rank keeps --kv-blocks blocks (--num-gpu-blocks-override), a rank of its KV heads
              or of its layers, so a stage of more layers holds more bytes of cache.

Targets (issue 40): TP=2 decode at least 85% of one process's; PP=2 16-stream throughput at least 85%;
each rank's peak resident set at most 55% of the one process's.

Usage: bench/compare_parallel.py [--model PATH] [--reps 3] [--binary build/inferd] [--out DIR] [--netns]
                                 [--max-num-batched-tokens N]
Prints Markdown for docs/benchmarks.md (with the load average before and after); writes every run's
JSON and log into --out. Run it on a quiet machine: with 2 cores, 2 ranks of one thread each leave
nothing spare, and a rank that waits to be scheduled stalls its partner in every collective.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("INFERD_CACHE", Path.home() / ".cache" / "inferd"))
DEFAULT_MODEL = CACHE / "models" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
# OpenMPI refuses root without these, and 2 ranks on 2 cores need no binding and may oversubscribe.
MPI_ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
# 64 MiB of f16 cache in one process of Qwen2.5-Coder-0.5B (24 layers x 2 KV heads x 64 x (K + V) x 2 bytes
# = 192 KiB a block of 16 tokens): room for 16 streams of 256 tokens without preemption.
KV_BLOCKS = 341
MPIRUN = ["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none"]
NETNS_HOSTS = ROOT / "scripts" / "netns_hosts.sh"
ACROSS_MACHINES = [str(NETNS_HOSTS), "mpirun", "-np", "2", "--bind-to", "none"]
LAYOUTS = {  # name -> (launcher prefix, threads, size flags)
    "one process": ([], 2, []),
    "TP=2": (MPIRUN, 1, ["--tensor-parallel-size", "2"]),
    "PP=2": (MPIRUN, 1, ["--pipeline-parallel-size", "2"]),
}
NETNS_LAYOUTS = {  # --netns: the same two across the two network namespaces
    "TP=2 2 machines": (ACROSS_MACHINES, 1, ["--tensor-parallel-size", "2"]),
    "PP=2 2 machines": (ACROSS_MACHINES, 1, ["--pipeline-parallel-size", "2"]),
}
TARGET = 0.85        # TP decode and PP 16-stream throughput, as a fraction of one process's
MEMORY_TARGET = 0.55  # each rank's peak resident set, as a fraction of one process's


def log(msg: str) -> None:
    print(f"[compare_parallel] {msg}", file=sys.stderr, flush=True)


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def inferd_pids(root: int) -> list[int]:
    """The inferd processes under `root` (itself, or the ranks mpirun started), by /proc's parent links."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(d.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        try:
            if Path(f"/proc/{pid}/exe").resolve().name == "inferd":
                found.append(pid)
        except OSError:
            pass
        todo += children.get(pid, [])
    return found


def vm_hwm_kib(pid: int) -> int | None:
    try:
        m = re.search(r"^VmHWM:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.M)
    except OSError:
        return None
    return int(m.group(1)) if m else None


def run(cmd: list[str], log_path: Path) -> tuple[str, dict[int, int]]:
    """Runs cmd to its end (its output into log_path) and returns (the output, {pid: peak resident KiB} of each
    inferd process it ran). VmHWM only grows, so the last reading before a process ends is its peak."""
    with open(log_path, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=MPI_ENV)
        peaks: dict[int, int] = {}
        while proc.poll() is None:
            for pid in inferd_pids(proc.pid):
                if (kib := vm_hwm_kib(pid)) is not None:
                    peaks[pid] = max(peaks.get(pid, 0), kib)
            time.sleep(0.05)
    text = log_path.read_text(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{text[-3000:]}")
    return text, peaks


def per_rank(text: str, peaks: dict[int, int]) -> list[int]:
    """Peak resident KiB per rank, in rank order (the ranks log their pids); one process is rank 0."""
    pids = {int(r): int(p) for r, p in re.findall(r"rank (\d+) \(pid (\d+)\)", text)}
    if not pids:
        return list(peaks.values())[:1]
    return [peaks.get(pids[r], 0) for r in sorted(pids)]


def bench(binary: Path, model: Path, layout: str, kind: str, args: argparse.Namespace, out: Path, rep: int) -> dict:
    launcher, threads, sizes = (LAYOUTS | NETNS_LAYOUTS)[layout]
    kv = ["--num-gpu-blocks-override", str(args.kv_blocks)]
    tag = f"{kind}-{layout.replace(' ', '_').replace('=', '')}-{rep}"
    json_path = out / f"{tag}.json"
    common = [str(binary), "bench", kind, "-m", str(model), "--threads", str(threads), "--seed", str(rep),
              "--output-json", str(json_path), *sizes]
    if kind == "latency":
        extra = ["--input-len", "32", "--output-len", str(args.output_len), "--num-iters", str(args.num_iters),
                 "--num-iters-warmup", "1", *kv]
    else:
        extra = ["--num-prompts", str(args.streams), "--max-num-seqs", str(args.streams), "--input-len", "128",
                 "--output-len", str(args.output_len), *kv]
        if args.max_num_batched_tokens:
            extra += ["--max-num-batched-tokens", str(args.max_num_batched_tokens)]
    text, peaks = run(launcher + common + extra, out / f"{tag}.log")
    j = json.loads(json_path.read_text())
    result = {"rss_kib": per_rank(text, peaks)}
    if kind == "latency":
        result["decode"] = j["decode_tokens_per_second"]["median"]
        if "collectives" in j:
            result["collective_us"] = [j["collectives"]["mean_us"]]
            # The other rank's, from its log line at shutdown.
            result["collective_us"] += [float(x) for x in re.findall(
                r"rank [1-9]\d*: \d+ collectives, ([\d.]+) us mean per call", text)]
    else:
        result["streams"] = j["output_tokens_per_second"]
    return result


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def markdown(model: Path, results: dict, args: argparse.Namespace, load: tuple[str, str], commit: str) -> str:
    one = results["one process"]
    base_decode, base_streams = median(one["decode"]), median(one["streams"])
    base_rss = max(max(r) for r in one["rss_kib"])
    layouts = list(results)
    split = ", ".join(layouts[1:])
    lines = [
        f"### One process beside {split} ({model.name}, {args.reps} interleaved repetitions, "
        f"{datetime.date.today()}, {commit})",
        "",
        f"`bench/compare_parallel.py {' '.join(sys.argv[1:])}`; load average {load[0]} before, "
        f"{load[1]} after. One process runs 2 threads; each rank 1 thread. Medians over repetitions "
        "(each run's own figure: decode the median over its iterations)."
        + (" \"2 machines\": one rank in each of two network namespaces (scripts/netns_hosts.sh), TCP over the "
           "veth between them." if args.netns else ""),
        "",
        "| | one process (2 threads) | " + " | ".join(layouts[1:]) + " | target |",
        "|---|" + "---|" * len(layouts) + "---|",
    ]

    def row(title: str, key: str, base: float, target: str) -> str:
        cells = []
        for layout in layouts:
            v = median(results[layout][key])
            cells.append(f"{v:.1f}" + ("" if layout == "one process" else f" ({v / base:.2f}x)"))
        return f"| {title} | " + " | ".join(cells) + f" | {target} |"

    lines.append(row("batch-1 decode, tokens/s", "decode", base_decode, f"TP=2 >= {TARGET:.2f}x"))
    lines.append(row(f"{args.streams} streams, output tokens/s", "streams", base_streams, f"PP=2 >= {TARGET:.2f}x"))

    def collectives(layout: str) -> str:
        ranks = list(zip(*results[layout]["collective_us"]))
        return ", ".join(f"{median(list(r)):.0f}" for r in ranks) if ranks else "-"

    lines.append("| collective (all-gather), us per call (rank 0, rank 1) | "
                 + " | ".join(collectives(layout) for layout in layouts) + " | |")

    def rss(layout: str) -> str:
        per_rank = [max(r[i] for r in results[layout]["rss_kib"] if i < len(r))
                    for i in range(max(len(r) for r in results[layout]["rss_kib"]))]
        return ", ".join(f"{kib / 1024:.0f}" + ("" if layout == "one process" else f" ({kib / base_rss:.2f}x)")
                         for kib in per_rank)

    lines.append("| peak resident MiB per rank | " + " | ".join(rss(layout) for layout in layouts)
                 + f" | each <= {MEMORY_TARGET:.2f}x |")
    lines += ["", f"Model file {model.stat().st_size / 2**20:.0f} MiB; KV cache {args.kv_blocks} blocks of 16 "
              "tokens in one process and on each rank (`--num-gpu-blocks-override`: the same tokens cached, a rank "
              "of its own heads or layers); peaks are the largest of the repetitions.", "", "Per repetition:", "",
              "| layout | decode tokens/s | streams output tokens/s | collective us | peak MiB per rank |",
              "|---|---|---|---|---|"]
    for layout, r in results.items():
        for i in range(len(r["decode"])):
            ar_text = ", ".join(f"{x:.0f}" for x in r["collective_us"][i]) if r["collective_us"] else "-"
            lines.append(f"| {layout} | {r['decode'][i]:.1f} | {r['streams'][i]:.1f} | {ar_text} | "
                         + ", ".join(f"{k / 1024:.0f}" for k in r["rss_kib"][i]) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--binary", type=Path, default=ROOT / "build" / "inferd")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--num-iters", type=int, default=5, help="timed iterations of each decode run")
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--max-num-batched-tokens", type=int, default=0,
                    help="the 16-stream runs' token budget a step (a pipeline's micro-batch), the same in every "
                         "layout (default: the engine's, 2048)")
    ap.add_argument("--kv-blocks", type=int, default=KV_BLOCKS,
                    help="KV blocks of 16 tokens in every process and rank (default: what 64 MiB buys one process of "
                         "Qwen2.5-Coder-0.5B in f16)")
    ap.add_argument("--out", type=Path, default=None, help="where the runs' JSON and logs go (default: a temp dir)")
    ap.add_argument("--netns", action="store_true",
                    help="also TP=2 and PP=2 across two network namespaces (scripts/netns_hosts.sh; root)")
    args = ap.parse_args()
    if not args.model.exists():
        sys.exit(f"{args.model} is missing: scripts/fetch_models.sh fetches the default model")
    out = args.out or Path(tempfile.mkdtemp(prefix="compare_parallel-"))
    out.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    layouts = LAYOUTS | (NETNS_LAYOUTS if args.netns else {})
    if args.netns and subprocess.run([str(NETNS_HOSTS), "up"]).returncode != 0:
        sys.exit("--netns: scripts/netns_hosts.sh up could not make the two network namespaces")
    results = {layout: {"decode": [], "streams": [], "collective_us": [], "rss_kib": []} for layout in layouts}
    load_before = loadavg()
    for rep in range(args.reps):
        for layout in layouts:
            log(f"rep {rep + 1}/{args.reps}: {layout} (load {loadavg()})")
            lat = bench(args.binary, args.model, layout, "latency", args, out, rep)
            thr = bench(args.binary, args.model, layout, "throughput", args, out, rep)
            r = results[layout]
            r["decode"].append(lat["decode"])
            r["streams"].append(thr["streams"])
            r["rss_kib"].append(lat["rss_kib"])
            if "collective_us" in lat:
                r["collective_us"].append(lat["collective_us"])
    (out / "summary.json").write_text(json.dumps(results, indent=1))
    print(markdown(args.model, results, args, (load_before, loadavg()), commit))
    log(f"runs in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
