#!/usr/bin/env python3
"""Speculative decoding: `inferd serve --speculative-config` beside llama.cpp's
`llama-server --spec-type ngram-simple` (or, with --draft-model, inferd's
draft_model method beside `llama-server --spec-type draft-simple --model-draft`),
same GGUFs, same threads, one request at a time (batch 1), greedy, the same
chat requests. Each program's server without speculation and its server with it
run side by side and take turns request by request (their order alternating
from one repetition to the next): on a host whose memory bandwidth drifts
within minutes, runs of one server after the other compared two moments as
much as two settings.

Workloads
  input-grounded  the answer copies much of the prompt: edit a given function,
                  quote a given paragraph, fix the typos of a given text
  free            the answer is new text (stories, explanations)

Per server and workload: decode tokens/s (after the first token, from the
client's clock on the streamed tokens), with and without speculation, the
speedup over the same server without it, and the acceptance (inferd: its
/metrics spec_decode counters; llama-server: the draft counts of its timings).
Then, with --streams N (default 16), output tokens/s of N concurrent streams of
random prompts through `inferd bench serve`, with and without speculation.

  python3 bench/compare_speculative.py [--model GGUF] [--threads 2] [--reps 3]
      [--max-tokens 256] [--k 8] [--streams 16] [--out DIR]
      [--draft-model GGUF --draft-p-min P]
"""
from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import compare_serving as cs  # noqa: E402  (Server, the servers' command lines, machine helpers)
import compare_structured as cst  # noqa: E402  (streamed requests over plain HTTP, median, metric)

CTX = 4096


def log(msg: str) -> None:
    print(f"[compare_speculative] {msg}", flush=True)


cs.log = log

CODE = '''def moving_average(values, window):
    """Returns the moving averages of values over a window of the given size."""
    if window <= 0:
        raise ValueError("window must be positive")
    result = []
    total = 0.0
    for index, value in enumerate(values):
        total += value
        if index >= window:
            total -= values[index - window]
        if index >= window - 1:
            result.append(total / window)
    return result


def normalize(values):
    """Scales values so that they sum to one."""
    total = sum(values)
    if total == 0:
        return [0.0 for _ in values]
    return [value / total for value in values]
'''

PARAGRAPH = (
    "The lighthouse stood on a narrow spit of rock at the mouth of the harbour. For more than a century its "
    "lamp had turned every night, warning the fishing boats away from the reef that lay just below the "
    "surface. The keepers lived in a small stone cottage at the foot of the tower, and their log books, kept "
    "in a cabinet by the door, recorded every storm, every ship that passed and every repair to the lamp. "
    "When the light was finally automated, the last keeper left the island with the books under his arm.")

TYPOS = ("Teh meeting will take place on tuesday at 10 am in the main confrence room. Please bring you're "
         "laptop and the quaterly report. If you can not attend, let me know befor monday so I can reschedule. "
         "We will discus the budget, the new hiring plan and the ofice move.")

GROUNDED = [
    ("edit code", "Rename the parameter `values` to `samples` everywhere in the following Python code and "
                  "return the whole code, changed, with nothing else.\n\n" + CODE),
    ("quote", "Repeat the following paragraph exactly, word for word.\n\n" + PARAGRAPH),
    ("fix typos", "Fix the spelling mistakes in the following text and return the corrected text only.\n\n"
                  + TYPOS),
]
FREE = [
    ("story", "Write a short story about a cat who learns to play the piano."),
    ("explain", "Explain how a refrigerator keeps food cold, in simple terms."),
    ("list", "Give ten ideas for a rainy weekend at home, each with a sentence of explanation."),
]


class Bench:
    def __init__(self, args):
        self.a = args
        self.out = Path(args.out)
        ns = types.SimpleNamespace(model=args.model, inferd=args.inferd, out=args.out, threads=args.threads, seed=0)
        self.cmp = cs.Comparison(ns)

    def server(self, kind: str, spec: bool) -> cs.Server:
        tag = f"{Path(self.a.model).stem}-{'spec' if spec else 'plain'}"
        if kind == cs.LLAMA:
            srv = self.cmp.llama_server(1, CTX, tag)
            srv.args += ["--jinja"]
            if spec and self.a.draft_model:
                srv.args += ["--spec-type", "draft-simple", "--model-draft", self.a.draft_model,
                             "--spec-draft-n-max", str(self.a.k), "--spec-draft-p-min", str(self.a.draft_p_min),
                             "--threads-draft", str(self.a.threads), "--threads-batch-draft", str(self.a.threads)]
            elif spec:
                srv.args += ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(self.a.llama_ngram_n),
                             "--spec-ngram-simple-size-m", str(self.a.k)]
        else:
            srv = self.cmp.inferd_server(1, CTX, tag)
            if spec:
                srv.args += ["--speculative-config", json.dumps(self.speculative_config())]
        return srv

    def speculative_config(self) -> dict:
        if self.a.draft_model:
            c = {"method": "draft_model", "model": self.a.draft_model, "num_speculative_tokens": self.a.k,
                 "draft_p_min": self.a.draft_p_min}
            if self.a.draft_vocab_size:
                c["draft_vocab_size"] = self.a.draft_vocab_size
            return c
        c = {"method": "ngram", "num_speculative_tokens": self.a.k, "prompt_lookup_min": self.a.ngram_min,
             "prompt_lookup_max": self.a.ngram_max}
        if self.a.first_draft_tokens:
            c["first_draft_tokens"] = self.a.first_draft_tokens
        return c

    def body(self, prompt: str) -> dict:
        return {"model": cs.SERVED_NAME, "messages": [{"role": "user", "content": prompt}], "temperature": 0,
                "max_tokens": self.a.max_tokens}

    def run_workloads(self, servers: dict[bool, cs.Server], kind: str) -> dict[bool, dict]:
        """Per server (False: plain, True: speculating): decode tokens/s per workload (median over reps),
        the texts, and the acceptance; the two servers take turns request by request."""
        out: dict[bool, dict] = {spec: {} for spec in servers}
        drafts0 = cst.metric(servers[True], "inferd:spec_decode_num_draft_tokens_total") or 0
        accepted0 = cst.metric(servers[True], "inferd:spec_decode_num_accepted_tokens_total") or 0
        llama_drafts = llama_accepted = 0
        for group, items in (("input-grounded", GROUNDED), ("free", FREE)):
            for name, prompt in items:
                rates: dict[bool, list] = {spec: [] for spec in servers}
                last: dict[bool, dict] = {}
                for rep in range(self.a.reps):
                    for spec in ((False, True) if rep % 2 == 0 else (True, False)):
                        r = self.streamed(servers[spec], self.body(prompt))
                        rates[spec].append(r["rate"])
                        last[spec] = r
                        if spec:
                            llama_drafts += r.get("draft_n", 0)
                            llama_accepted += r.get("draft_n_accepted", 0)
                for spec in servers:
                    out[spec][name] = {"group": group, "tokens_per_s": cst.median(rates[spec]),
                                       "tokens": last[spec]["tokens"], "text": last[spec]["text"]}
                log(f"{kind} {name}: {out[False][name]['tokens_per_s']:.1f} tokens/s plain, "
                    f"{out[True][name]['tokens_per_s']:.1f} speculating, {last[True]['tokens']} tokens")
        if kind == cs.INFERD:
            drafts = (cst.metric(servers[True], "inferd:spec_decode_num_draft_tokens_total") or 0) - drafts0
            accepted = (cst.metric(servers[True], "inferd:spec_decode_num_accepted_tokens_total") or 0) - accepted0
        else:
            drafts, accepted = llama_drafts, llama_accepted
        out[True]["_acceptance"] = accepted / drafts if drafts else None
        out[False]["_acceptance"] = None
        return out

    @staticmethod
    def streamed(srv: cs.Server, body: dict) -> dict:
        status, events, err = cst.post(srv.base_url, {**body, "stream": True,
                                                      "stream_options": {"include_usage": True}}, True)
        if status != 200:
            raise RuntimeError(f"{srv.label}: HTTP {status}: {err}")
        times, text, usage, timings = [], [], None, None
        for t, ev in events:
            usage = ev.get("usage") or usage
            timings = ev.get("timings") or timings
            for ch in ev.get("choices") or []:
                piece = (ch.get("delta") or {}).get("content")
                if piece:
                    text.append(piece)
                    times.append(t)
        tokens = usage["completion_tokens"] if usage else len(times)
        rate = (tokens - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else None
        r = {"text": "".join(text), "tokens": tokens, "rate": rate}
        if timings:
            r["draft_n"] = timings.get("draft_n", 0)
            r["draft_n_accepted"] = timings.get("draft_n_accepted", 0)
        return r

    def streams(self, spec: bool) -> float:
        """Output tokens/s of --streams concurrent streams of random prompts (inferd bench serve)."""
        n = self.a.streams
        srv = self.cmp.inferd_server(n, 256 + 128, f"{Path(self.a.model).stem}-c{n}-{'spec' if spec else 'plain'}")
        if spec:
            srv.args += ["--speculative-config", json.dumps(self.speculative_config())]
        with srv:
            r = self.cmp.inferd_client(srv, f"streams-{n}-{'spec' if spec else 'plain'}", 4 * n, 256, 128, n)
        return r["output_throughput"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(cs.MODEL_DIR / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--k", type=int, default=8, help="drafts per step at most, both servers")
    ap.add_argument("--ngram-min", type=int, default=1, help="inferd's prompt_lookup_min")
    ap.add_argument("--ngram-max", type=int, default=3, help="inferd's prompt_lookup_max")
    ap.add_argument("--first-draft-tokens", type=int, default=0,
                    help="inferd's first_draft_tokens (0: its default, 3 for n-grams)")
    ap.add_argument("--llama-ngram-n", type=int, default=3, help="llama-server's --spec-ngram-simple-size-n")
    ap.add_argument("--draft-model", default="", help="a draft GGUF: both servers speculate with it, not n-grams")
    ap.add_argument("--draft-p-min", type=float, default=0.75,
                    help="the draft's confidence threshold, both servers (draft_p_min, --spec-draft-p-min)")
    ap.add_argument("--draft-vocab-size", type=int, default=0,
                    help="inferd's draft_vocab_size (llama-server has no such option)")
    ap.add_argument("--streams", type=int, default=16, help="0: skip the concurrent run")
    ap.add_argument("--skip-llama-server", action="store_true",
                    help="inferd only (an A/B of two inferd binaries, each run with --inferd)")
    ap.add_argument("--streams-only", action="store_true", help="only the concurrent run (inferd, plain and speculating)")
    ap.add_argument("--inferd", default=str(cs.ROOT / "build" / "inferd"))
    ap.add_argument("--out", default="/tmp/inferd-compare-speculative")
    a = ap.parse_args()
    Path(a.out).mkdir(parents=True, exist_ok=True)
    b = Bench(a)
    results = {}
    kinds = () if a.streams_only else (cs.INFERD,) if a.skip_llama_server else (cs.INFERD, cs.LLAMA)
    for kind in kinds:
        with b.server(kind, False) as plain, b.server(kind, True) as spec:
            r = b.run_workloads({False: plain, True: spec}, kind)
        results[f"{kind} plain"], results[f"{kind} spec"] = r[False], r[True]
    (Path(a.out) / "results.json").write_text(json.dumps({"results": results}, indent=2))
    streams = {}
    if a.streams > 0:
        for spec in (False, True):
            streams["spec" if spec else "plain"] = b.streams(spec)
            log(f"{a.streams} streams, {'spec' if spec else 'plain'}: {streams['spec' if spec else 'plain']:.1f} tok/s")
    if a.streams_only:
        return 0

    # The greedy texts must not change with speculation (inferd's are token-identical by construction).
    for kind in kinds:
        plain, spec = results[f"{kind} plain"], results[f"{kind} spec"]
        same = all(plain[w]["text"] == spec[w]["text"] for w in plain if not w.startswith("_"))
        log(f"{kind}: greedy texts {'identical' if same else 'DIFFER'} with speculation")

    method = "draft" if a.draft_model else "ngram"
    how = (f"draft model {Path(a.draft_model).name}, p_min {a.draft_p_min}, inferd draft_vocab_size "
           f"{a.draft_vocab_size or 'all'} (llama-server draft-simple)"
           if a.draft_model else
           f"inferd prompt_lookup {a.ngram_min}..{a.ngram_max}, llama-server ngram-simple size-n {a.llama_ngram_n}")
    lines = [f"Model {Path(a.model).name}, {a.threads} threads, batch 1, greedy, max_tokens {a.max_tokens}, "
             f"median of {a.reps}; k = {a.k}; {how}; {cs.cpu_name()}; {datetime.date.today()}", "",
             f"| workload | inferd plain | inferd {method} | speedup | llama-server plain | llama-server {method} "
             f"| speedup | inferd {method} / llama-server {method} |", "|---|---|---|---|---|---|---|---|"]
    for w, v in results[f"{cs.INFERD} plain"].items():
        if w.startswith("_"):
            continue
        ip, isp = v["tokens_per_s"], results[f"{cs.INFERD} spec"][w]["tokens_per_s"]
        if a.skip_llama_server:
            lines.append(f"| {w} ({v['group']}) | {ip:.1f} | {isp:.1f} | {isp / ip:.2f}x | - | - | - | - |")
            continue
        lp, lsp = results[f"{cs.LLAMA} plain"][w]["tokens_per_s"], results[f"{cs.LLAMA} spec"][w]["tokens_per_s"]
        lines.append(f"| {w} ({v['group']}) | {ip:.1f} | {isp:.1f} | {isp / ip:.2f}x | {lp:.1f} | {lsp:.1f} | "
                     f"{lsp / lp:.2f}x | {isp / lsp:.2f}x |")
    acc_i = results[f"{cs.INFERD} spec"]["_acceptance"]
    acc_l = None if a.skip_llama_server else results[f"{cs.LLAMA} spec"]["_acceptance"]
    lines.append("")
    lines.append(f"Draft acceptance: inferd {acc_i if acc_i is None else f'{acc_i:.2f}'}, llama-server "
                 f"{acc_l if acc_l is None else f'{acc_l:.2f}'}.")
    if streams:
        lines.append(f"{a.streams} streams of random prompts (256 in, 128 out), inferd: plain {streams['plain']:.1f} "
                     f"tok/s, {method} {streams['spec']:.1f} tok/s ({streams['spec'] / streams['plain']:.2f}x).")
    report = "\n".join(lines)
    print(report)
    (Path(a.out) / "report.md").write_text(report + "\n")
    (Path(a.out) / "results.json").write_text(json.dumps({"results": results, "streams": streams}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
