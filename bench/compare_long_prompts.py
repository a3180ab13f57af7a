#!/usr/bin/env python3
"""Long prompts on `inferd serve` beside llama.cpp's `llama-server` (issue 42): the
time to the first token of a 16k-token prompt, and what such prompts do to the
inter-token latency of streams that are decoding when they arrive.

Engines (--engines): llama.cpp (llama-server with flash attention on, `-fa on`,
its defaults otherwise), inferd exact and inferd fast (`inferd serve --numerics
exact|fast`, prefix caching off), and inferd fast with prompt chunks sized by
tokens alone (fast-by-tokens: `--chunk-attention-cost 0`, the rule before chunks
shortened with depth). Same model, threads and context per request.
Clients are `inferd bench serve` (random token ids, streamed, ignore_eos).

  ttft     one --prompt-len-token prompt at a time (default 16,384, on
           Qwen2.5-Coder-1.5B): each repetition starts every engine's server
           afresh (an empty cache), sends a short warm-up request, then one
           long prompt whose token ids depend on the repetition (so nothing is
           reused between repetitions) and times its first streamed token.
           Engines alternate within each repetition. Reported: each engine's
           median TTFT, prompt tokens/s and llama.cpp's TTFT over inferd's, and
           the server's CPU seconds over the request (/proc: on a shared host
           they move less with others' load than wall time does).
  itl      --streams requests (--stream-input tokens in, --stream-output out,
           --stream-requests each, back to back) decode while --long-prompts
           prompts of --long-input tokens arrive one after the other, the first
           2 s after the streams start (default Qwen2.5-Coder-0.5B: SmolLM2's
           trained context is 8,192 tokens, too short for 16k prompts). Every
           step that holds a prompt chunk holds the streams' next tokens too, so
           their p99 ITL is about one chunk's step (inferd's chunks shorten with
           depth to keep that step level; fast-by-tokens does not): --chunk sets both servers'
           prompt tokens per step (inferd --max-num-batched-tokens; llama-server
           -b, and -ub up to 512); 0 keeps their defaults (2048 both; -ub 512).
           Reported: the streams' ITL p50/p99/p99.9/max beside the long
           prompts' TTFT.
  profile  one --prompt-len prompt on inferd (--profile-tier) under `perf
           record`, untimed: the symbols that take a 16k prefill's time.

Each part appends its records to <part>.json in --out, so parts (or engines of
a part) can run in separate invocations, e.g. one per hold of a benchmark lock,
into the same --out; results.md is rendered from everything in --out after
each run (or alone with --report). --quick shrinks the workloads to check the
pipeline in a few minutes.

Usage: bench/compare_long_prompts.py [--part ttft|itl|profile] [--engines llama,exact,fast]
           [--reps 2] [--prompt-len 16384] [--long-input 16384] [--long-prompts 2] [--streams 8]
           [--chunk 0] [--threads 2] [--out DIR] [--report] [--quick]
llama.cpp is built by bench/build_llama_cpp.sh if it is not there yet.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare_disaggregation as cd  # noqa: E402  (client: two bench serve clients at once)
import compare_serving as cs  # noqa: E402  (Server, Comparison's server commands and client, cpu_name)

ROOT, CACHE, MODEL_DIR = cs.ROOT, cs.CACHE, cs.MODEL_DIR
# fast-by-tokens: the fast tier with prompt chunks sized by tokens alone (--chunk-attention-cost 0), the
# scheduler's rule before chunks shortened with depth.
ENGINES = {"llama": cs.LLAMA, "exact": "inferd exact", "fast": "inferd fast",
           "fast-by-tokens": "inferd fast, chunks by tokens"}
# Each inferd engine's flags beside Comparison's server command line.
INFERD_FLAGS = {ENGINES["exact"]: ["--numerics", "exact"], ENGINES["fast"]: ["--numerics", "fast"],
                ENGINES["fast-by-tokens"]: ["--numerics", "fast", "--chunk-attention-cost", "0"]}
PARTS = ("ttft", "itl", "profile")


def log(msg: str) -> None:
    print(f"[compare_long_prompts] {msg}", flush=True)


cs.log = log


def load() -> float:
    return os.getloadavg()[0]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far: on a shared host it moves less with others' load than wall
    time does, so it is reported beside TTFT."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Bench:
    def __init__(self, a, model: str):
        self.a, self.model, self.out = a, model, Path(a.out)
        # Comparison supplies both servers' command lines (threads, slots, context, KV size) and the client.
        self.cmp = cs.Comparison(SimpleNamespace(model=model, inferd=a.inferd, out=a.out, threads=a.threads,
                                                 seed=0))

    def server(self, engine: str, slots: int, ctx: int, tag: str) -> cs.Server:
        chunk = self.a.chunk
        if engine == cs.LLAMA:
            srv = self.cmp.llama_server(slots, ctx, tag)
            # --cache-ram 0: no host copies of finished prompts (reuse is not measured; memory is shared).
            srv.args += ["-fa", "on", "--cache-ram", "0"]
            if chunk:
                srv.args += ["-b", str(chunk), "-ub", str(min(chunk, 512))]
        else:
            srv = self.cmp.inferd_server(slots, ctx, f"{slug(engine).removeprefix('inferd-')}-{tag}",
                                         prefix_caching=False)
            srv.args += INFERD_FLAGS[engine]
            if chunk:
                srv.args += ["--max-num-batched-tokens", str(chunk)]
        return srv

    def warm_up(self, srv: cs.Server, tag: str) -> None:
        self.cmp.a.seed = 999_999
        self.cmp.inferd_client(srv, f"warm-{tag}", 2, 64, 4, 1)

    def append(self, part: str, records: list[dict]) -> None:
        path = self.out / f"{part}.json"
        old = json.loads(path.read_text()) if path.exists() else {"runs": []}
        old["runs"].append({"model": self.model, "inferd_commit": cs.binary_commit(self.a.inferd),
                            "machine": f"{cs.cpu_name()}, {os.cpu_count()} cores", "threads": self.a.threads,
                            "chunk": self.a.chunk, "date_utc": stamp(), "records": records})
        path.write_text(json.dumps(old, indent=2) + "\n")

    # ---- ttft ------------------------------------------------------------------
    def ttft(self) -> None:
        a = self.a
        ctx = cs.round_up(a.prompt_len + a.output_len + 1, 256)
        records = []
        for rep in range(a.reps):
            for engine in a.engines:
                tag = f"ttft-r{rep}"
                with self.server(engine, 1, ctx, tag) as srv:
                    self.warm_up(srv, f"{slug(engine)}-{tag}")
                    self.cmp.a.seed = a.seed + rep  # the same prompt for every engine, another each repetition
                    before, cpu = load(), cpu_seconds(srv.proc.pid)
                    r = self.cmp.inferd_client(srv, f"ttft-{slug(engine)}-r{rep}", 1, a.prompt_len, a.output_len, 1)
                    rec = {"engine": engine, "rep": rep, "ttft_ms": 1e3 * r["ttfts"][0],
                           "cpu_s": cpu_seconds(srv.proc.pid) - cpu, "prompt_tokens": r["input_lens"][0],
                           "failed": r["failed"], "load": [before, load()]}
                records.append(rec)
                log(f"ttft rep {rep} {engine}: {rec['ttft_ms'] / 1e3:.2f} s for {rec['prompt_tokens']} tokens, "
                    f"server CPU {rec['cpu_s']:.1f} s "
                    f"(load {rec['load'][0]:.2f}-{rec['load'][1]:.2f})")
                self.append_partial("ttft", records)
        self.append("ttft", records)

    def append_partial(self, part: str, records: list[dict]) -> None:
        # A stopped run keeps what it measured: the records so far, beside the part's file.
        (self.out / f"{part}.partial.json").write_text(json.dumps(records, indent=2) + "\n")

    # ---- itl -------------------------------------------------------------------
    def itl(self) -> None:
        a = self.a
        slots = a.streams + 1  # the long prompts come one at a time
        ctx = cs.round_up(max(a.long_input + a.long_output, a.stream_input + a.stream_output) + 1, 256)
        client_args = SimpleNamespace(binary=a.inferd, model=self.model)
        records = []
        for rep in range(a.reps):
            for engine in a.engines:
                tag = f"itl-r{rep}"
                with self.server(engine, slots, ctx, tag) as srv:
                    self.warm_up(srv, f"{slug(engine)}-{tag}")
                    s_json, l_json = (self.out / f"itl-{slug(engine)}-r{rep}-{w}.json" for w in ("streams", "long"))
                    before = load()
                    # No test request first (the server is up and warm): llama-server would answer the
                    # timed long prompt from the test's tokens in its slot.
                    streams = cd.client(client_args, srv.base_url, s_json, a.streams * a.stream_requests,
                                        a.stream_input, a.stream_output, seed=2 * rep, concurrency=a.streams,
                                        test_run=False)
                    time.sleep(2.0)  # the streams are decoding when the first long prompt arrives
                    longs = cd.client(client_args, srv.base_url, l_json, a.long_prompts, a.long_input,
                                      a.long_output, seed=2 * rep + 1, concurrency=1, test_run=False)
                    for c in (longs, streams):
                        _, err = c.communicate()
                        if c.returncode != 0:
                            raise SystemExit(f"bench serve failed: {err[-2000:]}")
                    after = load()
                s, l = json.loads(s_json.read_text()), json.loads(l_json.read_text())
                itls = [x for req in s["itls"] for x in req]
                rec = {"engine": engine, "rep": rep, "failed": s["failed"] + l["failed"],
                       "itl_p50_ms": s["median_itl_ms"], "itl_p99_ms": s["p99_itl_ms"],
                       "itl_p999_ms": s["p99.9_itl_ms"], "itl_max_ms": 1e3 * max(itls) if itls else float("nan"),
                       "stream_tokens": sum(s["output_lens"]), "stream_ttft_p50_ms": s["median_ttft_ms"],
                       "stream_tok_s": s["output_throughput"], "long_ttfts_ms": [1e3 * t for t in l["ttfts"]],
                       "long_tokens": l["input_lens"], "load": [before, after]}
                records.append(rec)
                log(f"itl rep {rep} {engine}: ITL p50 {rec['itl_p50_ms']:.0f} ms, p99 {rec['itl_p99_ms']:.0f} ms, "
                    f"max {rec['itl_max_ms']:.0f} ms; long TTFTs "
                    + ", ".join(f"{t / 1e3:.1f} s" for t in rec["long_ttfts_ms"])
                    + f" (load {before:.2f}-{after:.2f})")
                self.append_partial("itl", records)
        self.append("itl", records)

    # ---- profile ---------------------------------------------------------------
    def profile(self) -> None:
        a = self.a
        engine = ENGINES[a.profile_tier]
        ctx = cs.round_up(a.prompt_len + a.output_len + 1, 256)
        data = self.out / f"perf-{a.profile_tier}.data"
        with self.server(engine, 1, ctx, "profile") as srv:
            self.warm_up(srv, f"{slug(engine)}-profile")
            perf = subprocess.Popen(["perf", "record", "-F", "199", "-o", str(data), "-p", str(srv.proc.pid)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self.cmp.a.seed = a.seed + 100
            r = self.cmp.inferd_client(srv, f"profile-{a.profile_tier}", 1, a.prompt_len, a.output_len, 1)
            perf.send_signal(signal.SIGINT)
            perf.wait(timeout=120)
        report = subprocess.run(["perf", "report", "-i", str(data), "--stdio", "--no-children", "--sort", "symbol",
                                 "--percent-limit", "0.5"], capture_output=True, text=True).stdout
        rows = [line.strip() for line in report.splitlines() if line.strip() and not line.startswith("#")]
        rec = {"engine": engine, "ttft_ms": 1e3 * r["ttfts"][0], "prompt_tokens": r["input_lens"][0],
               "symbols": rows[:25]}
        log(f"profile {engine}: {rec['ttft_ms'] / 1e3:.1f} s under perf; top: " + "; ".join(rows[:5]))
        self.append("profile", [rec])


def slug(engine: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", engine.replace(".", ""))


def stamp() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")


# ---- report ----------------------------------------------------------------------
def median(xs):
    return statistics.median(xs) if xs else float("nan")


def by_engine(runs: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for run in runs:
        for rec in run["records"]:
            if not rec.get("failed"):
                out.setdefault(rec["engine"], []).append(rec)
    return {e: out[e] for e in ENGINES.values() if e in out}


def describe(runs: list[dict]) -> str:
    first = runs[0]
    dates = sorted({r["date_utc"] for r in runs})
    chunks = sorted({r["chunk"] for r in runs})
    return (f"{first['machine']}; threads {first['threads']}; {Path(first['model']).name}; inferd "
            f"{first['inferd_commit']}; runs {dates[0]} to {dates[-1]} UTC; prompt tokens a step "
            f"{', '.join(str(c) if c else 'default (2048)' for c in chunks)}.")


def markdown(out: Path) -> str:
    lines: list[str] = []
    ttft = out / "ttft.json"
    if ttft.exists():
        runs = json.loads(ttft.read_text())["runs"]
        eng = by_engine(runs)
        base = median([r["ttft_ms"] for r in eng.get(cs.LLAMA, [])])
        lines += ["### Time to the first token of one long prompt, from an empty cache", "", describe(runs), "",
                  "| engine | prompt tokens | repetitions | TTFT median (s) | each (s) | prompt tok/s | "
                  "llama.cpp TTFT / this | server CPU (s) | llama.cpp CPU / this | load (1 min) |",
                  "|---|---:|---:|---:|---|---:|---:|---:|---:|---|"]
        base_cpu = median([r["cpu_s"] for r in eng.get(cs.LLAMA, []) if "cpu_s" in r])
        for e, recs in eng.items():
            t = median([r["ttft_ms"] for r in recs])
            c = median([r["cpu_s"] for r in recs if "cpu_s" in r])
            n = recs[0]["prompt_tokens"]
            loads = [x for r in recs for x in r["load"]]
            lines.append(f"| {e} | {n} | {len(recs)} | {t / 1e3:.2f} | "
                         f"{', '.join(format(r['ttft_ms'] / 1e3, '.2f') for r in recs)} | {1e3 * n / t:.1f} | "
                         f"{base / t:.2f} | {c:.1f} | {base_cpu / c:.2f} | {min(loads):.2f}-{max(loads):.2f} |")
        lines.append("")
    itl = out / "itl.json"
    if itl.exists():
        runs = json.loads(itl.read_text())["runs"]
        eng = by_engine(runs)
        lines += ["### Streams' inter-token latency while long prompts arrive", "", describe(runs), "",
                  "| engine | rounds | streams' ITL p50 (ms) | p99 (ms) | p99.9 (ms) | max (ms) | p99 / llama.cpp's | "
                  "long prompts' TTFT median (s) | TTFT / llama.cpp's | streams' TTFT p50 (ms) | streams' tok/s | "
                  "load (1 min) |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        long_ttft = lambda recs: median([t for r in recs for t in r["long_ttfts_ms"]])  # noqa: E731
        base = eng.get(cs.LLAMA, [])
        base_p99, base_ttft = median([r["itl_p99_ms"] for r in base]), long_ttft(base)
        for e, recs in eng.items():
            m = lambda k: median([r[k] for r in recs])  # noqa: E731
            loads = [x for r in recs for x in r["load"]]
            lines.append(f"| {e} | {len(recs)} | {m('itl_p50_ms'):.1f} | {m('itl_p99_ms'):.1f} | "
                         f"{m('itl_p999_ms'):.1f} | {m('itl_max_ms'):.1f} | {m('itl_p99_ms') / base_p99:.2f} | "
                         f"{long_ttft(recs) / 1e3:.2f} | {long_ttft(recs) / base_ttft:.2f} | "
                         f"{m('stream_ttft_p50_ms'):.1f} | {m('stream_tok_s'):.1f} | "
                         f"{min(loads):.2f}-{max(loads):.2f} |")
        lines.append("")
    prof = out / "profile.json"
    if prof.exists():
        for run in json.loads(prof.read_text())["runs"]:
            for rec in run["records"]:
                lines += [f"### Where {rec['engine']}'s {rec['prompt_tokens']}-token prefill spends its time "
                          f"(perf record, {run['date_utc']} UTC; TTFT {rec['ttft_ms'] / 1e3:.1f} s under perf)", "",
                          "```", *rec["symbols"], "```", ""]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=PARTS, default="ttft")
    ap.add_argument("--engines", default="llama,exact,fast", help="comma-separated: llama, exact, fast, fast-by-tokens")
    ap.add_argument("--model", default="", help="default: Qwen2.5-Coder-1.5B for ttft and profile, 0.5B for itl")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2, help="repetitions (ttft) or rounds (itl)")
    ap.add_argument("--prompt-len", type=int, default=16384)
    ap.add_argument("--output-len", type=int, default=4)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--stream-requests", type=int, default=2)
    ap.add_argument("--stream-input", type=int, default=64)
    ap.add_argument("--stream-output", type=int, default=128)
    ap.add_argument("--long-prompts", type=int, default=2)
    ap.add_argument("--long-input", type=int, default=16384)
    ap.add_argument("--long-output", type=int, default=4)
    ap.add_argument("--chunk", type=int, default=0, help="prompt tokens a step in both servers (0: defaults)")
    ap.add_argument("--profile-tier", choices=["exact", "fast"], default="fast")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--inferd", default=str(ROOT / "build" / "inferd"))
    ap.add_argument("--out", default="", help="default ~/.cache/inferd/bench/long-prompts-<date>")
    ap.add_argument("--report", action="store_true", help="only render results.md from --out")
    ap.add_argument("--quick", action="store_true", help="short prompts and few streams: checks the pipeline")
    a = ap.parse_args()
    if a.quick:
        a.reps, a.prompt_len, a.long_input, a.long_prompts = 1, 1024, 1024, 1
        a.streams, a.stream_requests, a.stream_output = 4, 1, 32
    a.engines = [ENGINES[e.strip()] for e in a.engines.split(",") if e.strip()]
    a.out = a.out or str(CACHE / "bench" / f"long-prompts-{datetime.datetime.now():%Y%m%d-%H%M%S}")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if not a.report:
        if cs.LLAMA in a.engines:
            subprocess.run([str(ROOT / "bench" / "build_llama_cpp.sh")], check=True)
        if not Path(a.inferd).is_file():
            sys.exit(f"{a.inferd} not found: build inferd first (scripts/setup.sh) or pass --inferd")
        model = a.model or str(MODEL_DIR / ("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" if a.part == "itl" else
                                            "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"))
        getattr(Bench(a, model), a.part)()
    table = markdown(out)
    (out / "results.md").write_text(table)
    print(table)
    log(f"wrote {out / 'results.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
