#!/usr/bin/env python3
"""Online serving: `inferd serve` beside llama.cpp's `llama-server`, same model,
same machine, same threads, same context per request, same workloads, driven
by two clients that share no code (`inferd bench serve` in C++ and
bench/openai_client_bench.py on the `openai` package).

Workloads
  concurrency   random prompts of --input-len token ids, --output-len output
                tokens (ignore_eos), all arriving at once with at most c in
                flight, for each c in --concurrency. llama-server gets -np c
                slots (continuous batching) and -c c x context; inferd gets
                --max-num-seqs c, --max-model-len context and a KV cache of
                c x context tokens. Both servers restart for each c.
  single stream llama-bench pp512 / tg128 beside `inferd bench latency`
                (a 512-token prompt; 128 decode steps after a 1-token prompt).
  shared prefix --prefix-num-prompts requests that share a --prefix-len token
                prefix (then --prefix-suffix-len tokens of their own): inferd
                with prefix caching on and off, and llama-server (its per-slot
                prompt cache, on by default).

Writes into --out: every run's JSON and output, the server logs, summary.json,
results.md (tables with inferd / llama.cpp ratios) and PNG charts
(--charts-dir copies the charts elsewhere, e.g. docs/img/serving). --quick
shrinks every workload to check the pipeline in a minute or two.

Usage: bench/compare_serving.py [--quick] [--threads N] [--concurrency 1,4,16,64]
                                [--num-prompts N] [--out DIR] [--charts-dir DIR]
llama.cpp is built by bench/build_llama_cpp.sh if it is not there yet;
matplotlib and openai are pip-installed if missing.
"""
from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("INFERD_CACHE", Path.home() / ".cache" / "inferd"))
MODEL_DIR = Path(os.environ.get("INFERD_MODEL_DIR", CACHE / "models"))
LLAMA_BIN = CACHE / "llama.cpp" / "build" / "bin"
SERVED_NAME = "bench-model"
PERCENTILES = "50,90,99"
LLAMA, INFERD = "llama.cpp", "inferd"
CLIENTS = ("inferd bench serve", "openai client")


def log(msg: str) -> None:
    print(f"[compare_serving] {msg}", flush=True)


def ensure_packages(*names: str) -> None:
    """Installs the given pip packages if they cannot be imported."""
    missing = []
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        log(f"pip install {' '.join(missing)}")
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", *missing], check=True)
        importlib.invalidate_caches()


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def binary_commit(binary: str) -> str:
    """HEAD of the checkout the binary was built in (its build/ folder's parent), and the binary's time:
    the scripts may run from another worktree than the binary's."""
    path = Path(binary).resolve()
    head = subprocess.run(["git", "-C", str(path.parent.parent), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip() or "unknown"
    built = datetime.datetime.fromtimestamp(path.stat().st_mtime, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    return f"{head} (binary built {built} UTC)"


def round_up(n: int, multiple: int) -> int:
    return (n + multiple - 1) // multiple * multiple


class Server:
    """A server process with its log in a file; stopped with SIGTERM."""

    def __init__(self, label: str, args: list[str], port: int, log_path: Path):
        self.label, self.args, self.port, self.log_path = label, args, port, log_path
        self.base_url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "Server":
        log(f"start {self.label}: {' '.join(self.args)}")
        with open(self.log_path, "wb") as f:
            self.proc = subprocess.Popen(self.args, stdout=f, stderr=subprocess.STDOUT)
        try:
            self._wait_ready(timeout=300)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.label} exited with {self.proc.returncode}; see {self.log_path}")
            try:
                with urllib.request.urlopen(self.base_url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.label} was not ready within {timeout:.0f} s; see {self.log_path}")

    def get(self, path: str) -> str:
        with urllib.request.urlopen(self.base_url + path, timeout=10) as r:
            return r.read().decode()

    def __exit__(self, *exc) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Comparison:
    def __init__(self, args):
        self.a = args
        self.out = Path(args.out)
        self.inferd = Path(args.inferd)
        info = json.loads(subprocess.run([str(self.inferd), "info", "--json", args.model], check=True,
                                         capture_output=True, text=True).stdout)
        self.info = info
        # f16 keys and values of every attention layer: what one cached token costs (both servers use f16 K/V).
        f16 = [k for k in info.get("kv_cache", []) if k["dtype"] == "f16"]
        self.kv_bytes_per_token = f16[0]["bytes_per_token"] if f16 else (
            info["layers"] * info["kv_heads"] * info["head_dim"] * 2 * 2)
        # A hybrid's recurrent state: a slot per running request (two with checkpoints), the prefix cache's
        # snapshots and a spare, taken from the same KV budget.
        rs = info.get("recurrent_state") or {}
        self.state_bytes_per_sequence = rs.get("bytes_per_sequence", 0)
        self.state_snapshots = rs.get("default_state_snapshots", 0)
        self.vocab = info["vocab_size"]

    # ---- servers -----------------------------------------------------------
    def llama_server(self, slots: int, ctx: int, tag: str) -> Server:
        port = free_port()
        args = [str(LLAMA_BIN / "llama-server"), "-m", self.a.model, "-np", str(slots), "-c", str(slots * ctx),
                "-t", str(self.a.threads), "-tb", str(self.a.threads), "-cb", "--host", "127.0.0.1",
                "--port", str(port), "-a", SERVED_NAME, "--no-webui"]
        return Server(f"llama-server ({tag})", args, port, self.out / f"server-llama-{tag}.log")

    def inferd_server(self, slots: int, ctx: int, tag: str, prefix_caching: bool = True) -> Server:
        port = free_port()
        state = (2 * slots + (self.state_snapshots if prefix_caching else 0) + 1) * self.state_bytes_per_sequence
        kv = round_up(slots * ctx * self.kv_bytes_per_token + state, 1 << 20) + (16 << 20)  # + a margin of blocks
        args = [str(self.inferd), "serve", "-m", self.a.model, "--host", "127.0.0.1", "--port", str(port),
                "--served-model-name", SERVED_NAME, "--threads", str(self.a.threads),
                "--max-num-seqs", str(slots), "--max-model-len", str(ctx),
                "--kv-cache-memory", f"{kv >> 20}M", "--max-queued-requests", "100000",
                "--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching"]
        return Server(f"inferd serve ({tag})", args, port, self.out / f"server-inferd-{tag}.log")

    # ---- clients -----------------------------------------------------------
    def inferd_client(self, srv: Server, name: str, num_prompts: int, input_len: int, output_len: int,
                      concurrency: int, prefix_len: int = 0, warmups: int = 0) -> dict:
        path = self.out / f"{name}.json"
        cmd = [str(self.inferd), "bench", "serve", "--base-url", srv.base_url, "--model", SERVED_NAME,
               "--tokenizer", self.a.model, "--dataset-name", "random", "--num-prompts", str(num_prompts),
               "--random-input-len", str(input_len), "--random-output-len", str(output_len),
               "--random-prefix-len", str(prefix_len), "--max-concurrency", str(concurrency),
               "--num-warmups", str(warmups), "--ready-check-timeout-sec", "0",
               "--metric-percentiles", PERCENTILES, "--seed", str(self.a.seed), "--output-json", str(path),
               # A 16k-token prompt's prefill is silent for over 10 minutes on two cores (compare_long_prompts).
               "--request-timeout-sec", "3600"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        (self.out / f"{name}.txt").write_text(" ".join(cmd) + "\n\n" + proc.stdout + proc.stderr)
        if proc.returncode != 0:
            raise RuntimeError(f"inferd bench serve failed ({proc.returncode}); see {self.out / (name + '.txt')}")
        return json.loads(path.read_text())

    def openai_client(self, srv: Server, name: str, num_prompts: int, input_len: int, output_len: int,
                      concurrency: int, prefix_len: int = 0, warmups: int = 0) -> dict:
        path = self.out / f"{name}.json"
        # Ordinary tokens, clear of the special ids at either end of most vocabularies.
        lo, hi = min(1000, self.vocab // 10), min(self.vocab - 1000, 30000)
        cmd = [sys.executable, str(ROOT / "bench" / "openai_client_bench.py"), "--base-url", srv.base_url,
               "--model", SERVED_NAME, "--num-prompts", str(num_prompts), "--input-len", str(input_len),
               "--output-len", str(output_len), "--prefix-len", str(prefix_len),
               "--concurrency", str(concurrency), "--num-warmups", str(warmups),
               "--token-id-range", f"{lo},{hi}", "--percentiles", PERCENTILES,
               "--seed", str(self.a.seed), "--output-json", str(path)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        (self.out / f"{name}.txt").write_text(" ".join(cmd) + "\n\n" + proc.stdout + proc.stderr)
        if proc.returncode != 0:
            raise RuntimeError(f"openai client failed ({proc.returncode}); see {self.out / (name + '.txt')}")
        return json.loads(path.read_text())

    # ---- workloads ---------------------------------------------------------
    def concurrency_sweep(self) -> dict:
        a = self.a
        ctx = round_up(a.input_len + a.output_len + 1, 256)
        results: dict = {}
        for c in a.concurrency:
            n = a.num_prompts or max(16, 4 * c)
            warmups = min(c, 4)
            results[c] = {}
            # Alternate the servers level by level so slow drift in the machine hits both alike.
            for kind in (LLAMA, INFERD):
                tag = f"c{c}"
                srv = self.llama_server(c, ctx, tag) if kind == LLAMA else self.inferd_server(c, ctx, tag)
                short = "llama" if kind == LLAMA else "inferd"
                with srv:
                    r1 = self.inferd_client(srv, f"serve-{short}-c{c}-inferd-client", n, a.input_len,
                                            a.output_len, c, warmups=warmups)
                    r2 = None
                    if not a.skip_openai_client:
                        r2 = self.openai_client(srv, f"serve-{short}-c{c}-openai-client", n, a.input_len,
                                                a.output_len, c, warmups=warmups)
                results[c][kind] = {CLIENTS[0]: r1, CLIENTS[1]: r2}
                log(f"c={c} {kind}: {r1['output_throughput']:.1f} output tok/s (inferd bench serve)"
                    + (f", {r2['output_throughput']:.1f} (openai client)" if r2 else ""))
        return results

    def single_stream(self) -> dict:
        a = self.a
        reps = a.reps
        lb = subprocess.run([str(LLAMA_BIN / "llama-bench"), "-m", a.model, "-t", str(a.threads), "-p", "512",
                             "-n", "128", "-r", str(reps), "-o", "json"], check=True, capture_output=True,
                            text=True).stdout
        (self.out / "llama-bench.json").write_text(lb)
        llama = {}
        for row in json.loads(lb):
            llama["prompt" if row["n_prompt"] > 0 else "decode"] = row["avg_ts"]

        def latency(name: str, input_len: int, output_len: int) -> dict:
            path = self.out / f"{name}.json"
            cmd = [str(self.inferd), "bench", "latency", "-m", a.model, "--input-len", str(input_len),
                   "--output-len", str(output_len), "--num-iters", str(reps), "--num-iters-warmup", "1",
                   "--threads", str(a.threads), "--output-json", str(path)]
            proc = subprocess.run(cmd, check=True, capture_output=True, text=True)
            (self.out / f"{name}.txt").write_text(" ".join(cmd) + "\n\n" + proc.stdout)
            return json.loads(path.read_text())

        pp = latency("latency-inferd-pp512", 512, 1)
        # The first token comes from the 1-token prompt's pass; 128 decode steps follow, as in tg128.
        tg = latency("latency-inferd-tg128", 1, 129)
        return {LLAMA: llama, INFERD: {"prompt": pp["prompt_tokens_per_second"]["mean"],
                                       "decode": tg["decode_tokens_per_second"]["mean"]}}

    def shared_prefix(self) -> dict:
        a = self.a
        ctx = round_up(a.prefix_len + a.prefix_suffix_len + a.prefix_output_len + 1, 256)
        c, n = a.prefix_concurrency, a.prefix_num_prompts
        runs = [("inferd, prefix caching on", lambda: self.inferd_server(c, ctx, "prefix-on", True)),
                ("inferd, prefix caching off", lambda: self.inferd_server(c, ctx, "prefix-off", False)),
                ("llama.cpp", lambda: self.llama_server(c, ctx, "prefix"))]
        results = {}
        for label, make in runs:
            slug = label.replace(", ", "-").replace(" ", "-").replace(".", "")
            with make() as srv:
                # No warm-up: it would put the prefix in the cache before timing starts.
                r = self.inferd_client(srv, f"prefix-{slug}", n, a.prefix_suffix_len, a.prefix_output_len, c,
                                       prefix_len=a.prefix_len)
                if label.startswith("inferd"):
                    r["server_metrics"] = {line.split(" ")[0]: float(line.split(" ")[-1])
                                           for line in srv.get("/metrics").splitlines()
                                           if line.startswith("inferd:prefix_cache")}
            # The requests after the first find the prefix it left (at concurrency 1, one at a time).
            later = sorted(r["ttfts"][1:])
            r["later_median_ttft_ms"] = 1e3 * later[len(later) // 2] if later else float("nan")
            r["first_ttft_ms"] = 1e3 * r["ttfts"][0]
            results[label] = r
            log(f"shared prefix, {label}: first TTFT {r['first_ttft_ms']:.1f} ms, later requests' median "
                f"{r['later_median_ttft_ms']:.1f} ms, mean TTFT {r['mean_ttft_ms']:.1f} ms, "
                f"{r['output_throughput']:.1f} output tok/s, {r.get('total_cached_input_tokens', 0)} cached tokens")
        return results


# ---- report ------------------------------------------------------------------
def ratio(x: float, y: float) -> str:
    return f"{x / y:.2f}" if y else "n/a"


def markdown(summary: dict) -> str:
    cfg = summary["config"]
    lines = [f"Machine: {summary['machine']}; threads {cfg['threads']}; model {Path(cfg['model']).name}; "
             f"{summary['date']}; inferd {summary['inferd_commit']}.", ""]
    sweep = summary.get("concurrency")
    if sweep:
        lines += [f"### Output throughput against concurrency (prompts {cfg['input_len']} tokens, "
                  f"outputs {cfg['output_len']} tokens)", "",
                  "| concurrency | requests | client | llama.cpp (tok/s) | inferd (tok/s) | inferd / llama.cpp |",
                  "|---|---|---|---|---|---|"]
        for c, by_server in sweep.items():
            for client in CLIENTS:
                l, i = by_server[LLAMA][client], by_server[INFERD][client]
                if not l or not i:
                    continue
                fails = "" if l["failed"] == 0 and i["failed"] == 0 else f" (failed: {l['failed']} / {i['failed']})"
                lines.append(f"| {c} | {l['num_prompts']} | {client} | {l['output_throughput']:.1f} | "
                             f"{i['output_throughput']:.1f} | {ratio(i['output_throughput'], l['output_throughput'])}"
                             f"{fails} |")
        lines += ["", "### Latency against concurrency (inferd bench serve; lower is better, so a ratio "
                  "below 1 favours inferd)", "",
                  "| concurrency | metric | llama.cpp (ms) | inferd (ms) | inferd / llama.cpp |", "|---|---|---|---|---|"]
        for c, by_server in sweep.items():
            l, i = by_server[LLAMA][CLIENTS[0]], by_server[INFERD][CLIENTS[0]]
            for metric in ("ttft", "tpot", "itl"):
                for stat in ("median", "p90", "p99"):
                    key = f"{stat}_{metric}_ms"
                    lines.append(f"| {c} | {metric.upper()} {'p50' if stat == 'median' else stat} | "
                                 f"{l[key]:.1f} | {i[key]:.1f} | {ratio(i[key], l[key])} |")
        if any(by[s][CLIENTS[1]] for by in sweep.values() for s in (LLAMA, INFERD)):
            lines += ["", "### The two clients against each other (output tok/s)", "",
                      "| concurrency | server | inferd bench serve | openai client | openai / inferd bench serve |"
                      " mean TTFT (ms), inferd bench serve / openai |", "|---|---|---|---|---|---|"]
            for c, by_server in sweep.items():
                for s in (LLAMA, INFERD):
                    x, y = by_server[s][CLIENTS[0]], by_server[s][CLIENTS[1]]
                    if y:
                        lines.append(f"| {c} | {s} | {x['output_throughput']:.1f} | {y['output_throughput']:.1f} | "
                                     f"{ratio(y['output_throughput'], x['output_throughput'])} | "
                                     f"{x['mean_ttft_ms']:.1f} / {y['mean_ttft_ms']:.1f} |")
    single = summary.get("single_stream")
    if single:
        lines += ["", "### Single stream (llama-bench beside inferd bench latency)", "",
                  "| test | llama.cpp (tok/s) | inferd (tok/s) | inferd / llama.cpp |", "|---|---|---|---|",
                  f"| prompt 512 tokens (pp512) | {single[LLAMA]['prompt']:.1f} | {single[INFERD]['prompt']:.1f} | "
                  f"{ratio(single[INFERD]['prompt'], single[LLAMA]['prompt'])} |",
                  f"| decode 128 tokens (tg128) | {single[LLAMA]['decode']:.1f} | {single[INFERD]['decode']:.1f} | "
                  f"{ratio(single[INFERD]['decode'], single[LLAMA]['decode'])} |"]
    prefix = summary.get("shared_prefix")
    if prefix:
        base = prefix[LLAMA]
        lines += ["", f"### Shared prefix ({cfg['prefix_num_prompts']} requests, a {cfg['prefix_len']}-token "
                  f"shared prefix + {cfg['prefix_suffix_len']} own tokens, {cfg['prefix_output_len']} output "
                  f"tokens, concurrency {cfg['prefix_concurrency']})", "",
                  "| server | median TTFT (ms) | mean TTFT (ms) | p99 TTFT (ms) | output tok/s | cached prompt tokens | "
                  "median TTFT / llama.cpp's | output tok/s / llama.cpp's |", "|---|---|---|---|---|---|---|---|"]
        for label, r in prefix.items():
            lines.append(f"| {label} | {r['median_ttft_ms']:.1f} | {r['mean_ttft_ms']:.1f} | {r['p99_ttft_ms']:.1f} | "
                         f"{r['output_throughput']:.1f} | {r.get('total_cached_input_tokens', 0)} of "
                         f"{r['total_input_tokens']} | {ratio(r['median_ttft_ms'], base['median_ttft_ms'])} | "
                         f"{ratio(r['output_throughput'], base['output_throughput'])} |")
        on, off = prefix.get("inferd, prefix caching on"), prefix.get("inferd, prefix caching off")
        if on and off:
            lines += ["", f"Prefix caching: median TTFT {off['median_ttft_ms']:.1f} ms off, {on['median_ttft_ms']:.1f} ms "
                      f"on ({ratio(off['median_ttft_ms'], on['median_ttft_ms'])}x better with it on)."]
        if cfg["prefix_concurrency"] == 1 and all("later_median_ttft_ms" in r for r in prefix.values()):
            lines += ["", "One request at a time: the first request's TTFT, then the median TTFT of the requests "
                      "after it (each shares the prefix with the first): "
                      + "; ".join(f"{label} {r['first_ttft_ms']:.0f} ms, then {r['later_median_ttft_ms']:.0f} ms"
                                  for label, r in prefix.items()) + "."]
            if on and off:
                lines.append(f"Prefix caching on makes a later request's TTFT "
                             f"{ratio(off['later_median_ttft_ms'], on['later_median_ttft_ms'])}x better than off.")
    return "\n".join(lines) + "\n"


def charts(summary: dict, out: Path) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    colors = {LLAMA: "tab:blue", INFERD: "tab:orange"}
    sweep = summary.get("concurrency")
    if sweep:
        cs = sorted(int(c) for c in sweep)  # keys are strings after the JSON round trip
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for s in (LLAMA, INFERD):
            for client, style in zip(CLIENTS, ("-o", "--s")):
                runs = [sweep[str(c)][s][client] for c in cs]
                ys = [r["output_throughput"] if r else None for r in runs]
                if any(y is not None for y in ys):
                    ax.plot(cs, ys, style, color=colors[s], label=f"{s} ({client})")
        ax.set_xscale("log", base=2)
        ax.set_xticks(cs, [str(c) for c in cs])
        ax.set_xlabel("concurrent requests")
        ax.set_ylabel("output tokens/s")
        ax.set_title("Output throughput against concurrency")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        made.append(out / "throughput_vs_concurrency.png")
        fig.savefig(made[-1], dpi=120)
        plt.close(fig)

        for metric, title in (("ttft", "Time to first token"), ("itl", "Inter-token latency")):
            fig, ax = plt.subplots(figsize=(6.4, 4.2))
            for s in (LLAMA, INFERD):
                for stat, style in (("median", "-o"), ("p90", ":^"), ("p99", "--s")):
                    ys = [sweep[str(c)][s][CLIENTS[0]][f"{stat}_{metric}_ms"] for c in cs]
                    ax.plot(cs, ys, style, color=colors[s], label=f"{s} {'p50' if stat == 'median' else stat}")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(cs, [str(c) for c in cs])
            ax.set_xlabel("concurrent requests")
            ax.set_ylabel("ms")
            ax.set_title(f"{title} against concurrency (percentiles)")
            ax.grid(alpha=0.3, which="both")
            ax.legend(fontsize=8, ncol=2)
            fig.tight_layout()
            made.append(out / f"{metric}_vs_concurrency.png")
            fig.savefig(made[-1], dpi=120)
            plt.close(fig)

    single = summary.get("single_stream")
    if single:
        fig, ax = plt.subplots(figsize=(5.6, 3.8))
        tests = [("prompt", "prompt 512 tokens"), ("decode", "decode 128 tokens")]
        width = 0.38
        for k, s in enumerate((LLAMA, INFERD)):
            xs = [t + (k - 0.5) * width for t in range(len(tests))]
            ys = [single[s][key] for key, _ in tests]
            bars = ax.bar(xs, ys, width, color=colors[s], label=s)
            ax.bar_label(bars, fmt="%.0f", fontsize=8)
        ax.set_xticks(range(len(tests)), [name for _, name in tests])
        ax.set_ylabel("tokens/s")
        ax.set_title("Single stream")
        ax.legend()
        fig.tight_layout()
        made.append(out / "single_stream.png")
        fig.savefig(made[-1], dpi=120)
        plt.close(fig)

    prefix = summary.get("shared_prefix")
    if prefix:
        labels = list(prefix)
        fig, axes = plt.subplots(1, 2, figsize=(8.6, 3.8))
        palette = ["tab:orange", "navajowhite", "tab:blue"]
        for ax, (key, name) in zip(axes, (("mean_ttft_ms", "mean TTFT (ms)"),
                                          ("output_throughput", "output tokens/s"))):
            bars = ax.bar(range(len(labels)), [prefix[l][key] for l in labels], color=palette[:len(labels)])
            ax.bar_label(bars, fmt="%.0f", fontsize=8)
            ax.set_xticks(range(len(labels)), [l.replace(", ", "\n") for l in labels], fontsize=8)
            ax.set_title(name)
        fig.suptitle(f"Shared {summary['config']['prefix_len']}-token prefix")
        fig.tight_layout()
        made.append(out / "shared_prefix.png")
        fig.savefig(made[-1], dpi=120)
        plt.close(fig)
    return made


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(MODEL_DIR / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--concurrency", default="1,4,16,64", help="comma-separated levels")
    ap.add_argument("--num-prompts", type=int, default=0, help="requests per level (default max(16, 4 x level))")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--prefix-len", type=int, default=1000)
    ap.add_argument("--prefix-suffix-len", type=int, default=32)
    ap.add_argument("--prefix-output-len", type=int, default=32)
    ap.add_argument("--prefix-num-prompts", type=int, default=64)
    ap.add_argument("--prefix-concurrency", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3, help="single-stream repetitions")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true",
                    help="tiny workloads (concurrency 1,4; 8 requests; short prompts) to check the pipeline")
    ap.add_argument("--skip-openai-client", action="store_true")
    ap.add_argument("--skip-single-stream", action="store_true")
    ap.add_argument("--skip-prefix", action="store_true")
    ap.add_argument("--inferd", default=str(ROOT / "build" / "inferd"))
    ap.add_argument("--out", default="", help="output folder (default ~/.cache/inferd/bench/serving-<date>)")
    ap.add_argument("--charts-dir", default="", help="also copy the PNG charts here (e.g. docs/img/serving)")
    args = ap.parse_args()
    if args.quick:
        args.concurrency = "1,4" if args.concurrency == ap.get_default("concurrency") else args.concurrency
        args.num_prompts = args.num_prompts or 8
        args.input_len, args.output_len = 32, 16
        args.prefix_len, args.prefix_suffix_len, args.prefix_output_len = 256, 16, 8
        args.prefix_num_prompts, args.prefix_concurrency = 8, 4
        args.reps = 1
    args.concurrency = [int(c) for c in args.concurrency.split(",") if c.strip()]
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    args.out = args.out or str(CACHE / "bench" / f"serving-{stamp}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    subprocess.run([str(ROOT / "bench" / "build_llama_cpp.sh")], check=True)
    if subprocess.run([args.inferd, "serve", "--help"], capture_output=True).returncode != 0:
        sys.exit(f"{args.inferd} has no working `serve` command: build it first (scripts/setup.sh)")
    ensure_packages("openai", "matplotlib")

    cmp = Comparison(args)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    summary = {"date": stamp, "machine": f"{cpu_name()}, {os.cpu_count()} cores", "inferd_commit": commit,
               "config": {k: v for k, v in vars(args).items()}}
    started = time.time()
    if args.concurrency:
        summary["concurrency"] = cmp.concurrency_sweep()
    if not args.skip_single_stream:
        summary["single_stream"] = cmp.single_stream()
    if not args.skip_prefix:
        summary["shared_prefix"] = cmp.shared_prefix()
    summary["wall_seconds"] = time.time() - started

    # Per-request arrays stay in the run files; the summary keeps the figures.
    def figures(r):
        return {k: v for k, v in r.items() if not isinstance(v, (list, dict))} if r else None
    compact = json.loads(json.dumps(summary, default=str))
    for by_server in compact.get("concurrency", {}).values():
        for s in by_server.values():
            for client in list(s):
                s[client] = figures(s[client])
    for label, r in compact.get("shared_prefix", {}).items():
        compact["shared_prefix"][label] = {**figures(r), "server_metrics": r.get("server_metrics")}
    (out / "summary.json").write_text(json.dumps(compact, indent=2) + "\n")
    table = markdown(compact)
    (out / "results.md").write_text(table)
    made = charts(compact, out)
    if args.charts_dir:
        Path(args.charts_dir).mkdir(parents=True, exist_ok=True)
        for png in made:
            shutil.copy(png, Path(args.charts_dir) / png.name)
    print(table)
    log(f"wrote {out / 'results.md'}, {out / 'summary.json'} and {', '.join(p.name for p in made)} "
        f"in {summary['wall_seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
