#!/usr/bin/env python3
"""Decode speed at a given depth of context: inferd beside llama.cpp, same model, same machine, same
threads, in one run. A hybrid model (qwen35: three Gated DeltaNet layers of fixed-size state beside each
attention layer) should decode nearly as fast at 16k tokens of context as at 256; a dense model's keys and
values grow with the context on every layer.

  llama.cpp  llama-bench -d DEPTH -p 0 -n N: fills DEPTH tokens of context (untimed), then times N
             decode steps.
  inferd     inferd bench latency --input-len DEPTH --output-len N+1: a random DEPTH-token prompt, then
             N decode steps after the first token, timed apart from the prompt (its decode tokens/s).
             Prefix caching off; the KV cache is sized from `inferd info` (keys and values of DEPTH + N
             tokens, and the state slots of a hybrid).

--kv-types f16,q8_0,q4_0 runs each engine with each KV cache type (inferd --kv-cache-dtype T, sized in
that type's bytes; llama-bench -ctk T -ctv T, with -fa 1 for a quantized type, which llama.cpp needs for
a quantized V cache) and also reports each type's speed over f16's at the deepest context (issue 39's
target: q8_0 >= 1.15x f16 at 16k).

The engines alternate at each depth. Reported as decode tokens/s per depth, and the ratio of each engine's
speed at the deepest context to its speed at the shallowest (issue 38's target: >= 0.8 at 16k / 256).

Usage: bench/compare_context_depth.py --model PATH [--depths 256,4096,16384] [--n-gen 32] [--reps 1] [--rounds 1]
                                      [--threads 2] [--kv-types f16] [--skip-llama] [--skip-inferd]
                                      [--out DIR]
Prints Markdown for docs/benchmarks.md with the load average before and after each run.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare_llama_bench as clb  # noqa: E402

ROOT, CACHE = clb.ROOT, clb.CACHE
LLAMA_BIN = CACHE / "llama.cpp" / "build" / "bin"


def loadavg():
    return float(Path("/proc/loadavg").read_text().split()[0])


def llama_decode(args, depth, kv_type, log_path):
    cmd = [str(LLAMA_BIN / "llama-bench"), "-m", args.model, "-t", str(args.threads), "-p", "0",
           "-n", str(args.n_gen), "-d", str(depth), "-r", str(args.reps), "-o", "json"]
    if kv_type != "f16":
        cmd += ["-ctk", kv_type, "-ctv", kv_type, "-fa", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    log_path.write_text(" ".join(cmd) + "\n\n" + proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"llama-bench failed ({proc.returncode}); see {log_path}")
    return json.loads(proc.stdout)[0]["avg_ts"]


def inferd_kv_bytes(info, n_tokens, kv_type):
    """A KV budget for one request of n_tokens (in kv_type), its state slots (running and checkpoint) and the
    spare."""
    entry = [k for k in info.get("kv_cache", []) if k["dtype"] == kv_type]
    if not entry:
        raise RuntimeError(f"inferd info lists no KV cache type {kv_type}")
    per_token = entry[0]["bytes_per_token"]
    state = 3 * (info.get("recurrent_state") or {}).get("bytes_per_sequence", 0)
    return per_token * (n_tokens + 256) + state + (16 << 20)


def inferd_decode(args, info, depth, kv_type, out_dir):
    path = out_dir / f"inferd-latency-d{depth}-{kv_type}.json"
    kv = inferd_kv_bytes(info, depth + args.n_gen + 1, kv_type)
    cmd = [args.inferd, "bench", "latency", "-m", args.model, "--input-len", str(depth),
           "--output-len", str(args.n_gen + 1), "--num-iters", str(args.reps), "--num-iters-warmup", "0",
           "--max-model-len", str(depth + args.n_gen + 16), "--kv-cache-memory", f"{(kv >> 20) + 1}M",
           "--threads", str(args.threads), "--kv-cache-dtype", kv_type, "--output-json", str(path)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    (out_dir / f"inferd-latency-d{depth}-{kv_type}.txt").write_text(" ".join(cmd) + "\n\n" + proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"inferd bench latency failed ({proc.returncode}); see {out_dir}")
    return json.loads(path.read_text())["decode_tokens_per_second"]["mean"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--depths", default="256,4096,16384")
    ap.add_argument("--n-gen", type=int, default=32, help="decode steps timed at each depth")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=1,
                    help="repeat the whole sweep, engines and KV types alternating, and report each figure's "
                         "median and each round's ratios (a shared host's slow spells then fall on all of them)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kv-types", default="f16", help="KV cache types, e.g. f16,q8_0,q4_0")
    ap.add_argument("--inferd", default=str(ROOT / "build" / "inferd"))
    ap.add_argument("--skip-llama", action="store_true")
    ap.add_argument("--skip-inferd", action="store_true")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    depths = [int(d) for d in args.depths.split(",") if d.strip()]
    kv_types = [t.strip() for t in args.kv_types.split(",") if t.strip()]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(args.out or CACHE / "bench" / f"depth-{Path(args.model).stem}-{stamp}")
    out.mkdir(parents=True, exist_ok=True)
    info = json.loads(subprocess.run([args.inferd, "info", "--json", args.model], check=True, capture_output=True,
                                     text=True).stdout)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    # One column per engine and KV type ("inferd" alone when the type is f16 only, as before).
    columns = [(e, t) for t in kv_types
               for e in ([] if args.skip_llama else ["llama.cpp"]) + ([] if args.skip_inferd else ["inferd"])]
    name = {c: c[0] if kv_types == ["f16"] else f"{c[0]} {c[1]}" for c in columns}
    runs = {name[c]: {d: [] for d in depths} for c in columns}  # each round's rate
    loads = {}
    for round_ in range(args.rounds):
        round_dir = out if args.rounds == 1 else out / f"round{round_ + 1}"
        round_dir.mkdir(parents=True, exist_ok=True)
        for depth in depths:
            for c in columns:
                e, kv_type = c
                before = loadavg()
                t0 = time.time()
                rate = llama_decode(args, depth, kv_type, round_dir / f"llama-bench-d{depth}-{kv_type}.txt") \
                    if e == "llama.cpp" else inferd_decode(args, info, depth, kv_type, round_dir)
                runs[name[c]][depth].append(rate)
                loads[f"{name[c]} {depth} round {round_ + 1}"] = (before, loadavg())
                print(f"round {round_ + 1}, depth {depth}, {name[c]}: {rate:.2f} tok/s ({time.time() - t0:.0f} s; "
                      f"load {before:.2f} -> {loadavg():.2f})", file=sys.stderr, flush=True)
    rates = {e: {d: statistics.median(r) for d, r in by_depth.items()} for e, by_depth in runs.items()}
    engines = [name[c] for c in columns]
    all_loads = [x for pair in loads.values() for x in pair]
    lines = [f"Machine: {clb.cpu_name()}, {os.cpu_count()} cores; threads {args.threads}; inferd {commit}; model "
             f"{Path(args.model).name}; {args.n_gen} decode steps after each depth, {args.reps} run(s) each"
             + (f" in each of {args.rounds} rounds (figures: medians)" if args.rounds > 1 else "") + "; "
             f"started {stamp}; load average (1 min) {min(all_loads):.2f} to {max(all_loads):.2f}.", "",
             "| context depth (tokens) | " + " | ".join(f"{e} decode (tok/s)" for e in engines)
             + (" | inferd / llama.cpp |" if engines == ["llama.cpp", "inferd"] else " |"),
             "|---:|" + "---:|" * len(engines) + ("---:|" if engines == ["llama.cpp", "inferd"] else "")]
    for depth in depths:
        row = f"| {depth} | " + " | ".join(f"{rates[e][depth]:.2f}" for e in engines)
        if engines == ["llama.cpp", "inferd"]:
            row += f" | {rates['inferd'][depth] / rates['llama.cpp'][depth]:.2f}"
        lines.append(row + " |")
    if len(depths) > 1:
        lo, hi = depths[0], depths[-1]
        lines += ["", f"Decode at {hi} tokens of context over decode at {lo}: "
                  + ", ".join(f"{e} {rates[e][hi] / rates[e][lo]:.2f}" for e in engines) + "."]
    if "f16" in kv_types and len(kv_types) > 1:
        hi = depths[-1]
        pairs = [(name[c], name[(c[0], "f16")]) for c in columns if c[1] != "f16"]
        lines += ["", f"Each KV type over f16 at {hi} tokens of context: "
                  + ", ".join(f"{a} {rates[a][hi] / rates[b][hi]:.2f}" for a, b in pairs) + "."]
        if args.rounds > 1:
            lines += ["", "Round by round (runs next to each other): " + "; ".join(
                f"{a} over {b} " + ", ".join(f"{x / y:.2f}" for x, y in zip(runs[a][hi], runs[b][hi]))
                + f" (median {statistics.median(x / y for x, y in zip(runs[a][hi], runs[b][hi])):.2f})"
                for a, b in pairs) + "."]
    text = "\n".join(lines)
    (out / "results.md").write_text(text + "\n")
    (out / "record.json").write_text(json.dumps({"model": args.model, "commit": commit, "kv_types": kv_types,
                                                 "rates": rates, "runs": runs, "rounds": args.rounds,
                                                 "loads": loads, "n_gen": args.n_gen, "reps": args.reps},
                                                indent=1) + "\n")
    print(text)
    print(f"(wrote {out})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
