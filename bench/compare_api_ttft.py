#!/usr/bin/env python3
"""Streaming time to first token through the three chat APIs of one `inferd
serve`: Chat Completions (/v1/chat/completions), Responses (/v1/responses) and
Anthropic's Messages (/v1/messages), on the same request.

The same conversation (a system prompt and three turns) goes through each API
in its own shape: chat `messages`; responses `instructions` + `input` items;
messages `system` + `messages`. Same model, max tokens (--max-tokens), greedy
(temperature 0), streamed. The client (stdlib http.client, one new connection
per request, the same code for all three) times from sending the request to
the first non-empty content delta of each API: chat
`choices[0].delta.content`, responses `response.output_text.delta`, messages
`content_block_delta` (text_delta). It also records the whole request's time.

Requests go one at a time (a lone request's TTFT), in rounds: each round sends
the three APIs once, the order rotated round by round so that none is always
first. --warmup rounds are sent first and not counted. Per API: median, p90 and
mean TTFT, and the ratio to chat of the medians, of the p90s, and the median of
the per-round ratios.

Prefix caching (--cache): `off` starts the server with --no-enable-prefix-caching,
so every request computes its whole prompt (TTFT = prompt pass + the API's own
work); `on` (the server's default) lets every request after the first find its
prompt cached, so TTFT is mostly the API's own cost: the harder test of "the
same speed". `both` (default) runs one server after the other.

Checks that the three requests are the same work: each API's prompt token count
(chat usage.prompt_tokens, responses usage.input_tokens, messages
usage.input_tokens) and its greedy answer text must be the same in every API.

Writes summary.json, results.md and the server logs into --out; prints the
Markdown table.

Usage: bench/compare_api_ttft.py [--threads 2] [--rounds 100] [--warmup 3] [--max-tokens 32]
                                 [--cache off|on|both] [--model PATH] [--inferd build/inferd] [--out DIR]
"""
from __future__ import annotations

import argparse
import datetime
import http.client
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import compare_serving as cs  # noqa: E402  (Server, free_port, cpu_name)

ROOT, CACHE, MODEL_DIR = cs.ROOT, cs.CACHE, cs.MODEL_DIR
SERVED_NAME = "bench-model"
APIS = ("chat", "responses", "messages")

SYSTEM = "You are a helpful assistant for a small bakery. Answer in two or three short sentences."
TURNS = [
    ("user", "Hello! We open at seven in the morning and close at six. We bake sourdough, rye bread, "
             "croissants and cinnamon rolls every day, and cakes to order with two days' notice."),
    ("assistant", "Thank you! I will remember your hours, your daily breads and pastries, and that cakes "
                  "need two days' notice. How can I help?"),
    ("user", "A customer asks whether she can pick up a birthday cake tomorrow at eight in the evening. "
             "What should we tell her?"),
]




def log(msg: str) -> None:
    print(f"[compare_api_ttft] {msg}", flush=True)


cs.log = log


def request(api: str, max_tokens: int) -> tuple[str, dict]:
    """(path, body) of the same conversation in the API's own shape."""
    if api == "chat":
        return "/v1/chat/completions", {
            "model": SERVED_NAME, "messages": [{"role": "system", "content": SYSTEM}] +
            [{"role": r, "content": c} for r, c in TURNS], "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    if api == "responses":
        return "/v1/responses", {
            "model": SERVED_NAME, "instructions": SYSTEM, "input": [{"role": r, "content": c} for r, c in TURNS],
            "max_output_tokens": max_tokens, "temperature": 0, "stream": True, "store": False}
    return "/v1/messages", {
        "model": SERVED_NAME, "system": SYSTEM, "messages": [{"role": r, "content": c} for r, c in TURNS],
        "max_tokens": max_tokens, "temperature": 0, "stream": True}


def first_text(api: str, ev: dict) -> str:
    """The content text an event carries ('' if none)."""
    if api == "chat":
        ch = ev.get("choices") or []
        return (ch[0].get("delta") or {}).get("content") or "" if ch else ""
    if api == "responses":
        return ev.get("delta") or "" if ev.get("type") == "response.output_text.delta" else ""
    if ev.get("type") == "content_block_delta" and (ev.get("delta") or {}).get("type") == "text_delta":
        return ev["delta"].get("text") or ""
    return ""


def usage(api: str, ev: dict, acc: dict) -> None:
    """Collects prompt and output token counts from the API's events into acc."""
    if api == "chat" and ev.get("usage"):
        acc["prompt"], acc["output"] = ev["usage"]["prompt_tokens"], ev["usage"]["completion_tokens"]
    elif api == "responses" and ev.get("type") in ("response.completed", "response.incomplete"):
        # response.incomplete ends a stream that stopped at max_output_tokens
        u = ev["response"]["usage"]
        acc["prompt"], acc["output"] = u["input_tokens"], u["output_tokens"]
    elif api == "messages" and ev.get("type") == "message_start":
        acc["prompt"] = ev["message"]["usage"]["input_tokens"]
    elif api == "messages" and ev.get("type") == "message_delta":
        acc["output"] = ev["usage"]["output_tokens"]


def streamed(base_url: str, api: str, max_tokens: int) -> dict:
    path, body = request(api, max_tokens)
    host, port = base_url.split("//", 1)[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=600)
    text, acc, ttft = [], {}, None
    try:
        t0 = time.perf_counter()
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"{api}: {resp.status} {resp.read()[:300]!r}")
        while True:
            line = resp.readline()
            if not line:
                break
            if not line.startswith(b"data:"):
                continue  # "event: ..." lines: the JSON's "type" says the same
            payload = line[5:].strip()
            if payload == b"[DONE]":
                break
            ev = json.loads(payload)
            piece = first_text(api, ev)
            if piece:
                if ttft is None:
                    ttft = time.perf_counter() - t0
                text.append(piece)
            usage(api, ev, acc)
        total = time.perf_counter() - t0
    finally:
        conn.close()
    if ttft is None:
        raise RuntimeError(f"{api}: no content delta in the stream")
    return {"ttft_s": ttft, "total_s": total, "text": "".join(text), "prompt_tokens": acc.get("prompt"),
            "output_tokens": acc.get("output")}


def p90(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=10, method="inclusive")[-1]


def run_mode(a, cache: str, out: Path) -> dict:
    port = cs.free_port()
    args = [a.inferd, "serve", "-m", a.model, "--host", "127.0.0.1", "--port", str(port),
            "--served-model-name", SERVED_NAME, "--threads", str(a.threads), "--no-webui",
            "--enable-prefix-caching" if cache == "on" else "--no-enable-prefix-caching"]
    rows: dict[str, list[dict]] = {api: [] for api in APIS}
    with cs.Server(f"inferd serve (prefix caching {cache})", args, port, out / f"server-inferd-cache-{cache}.log") as srv:
        for r in range(a.warmup):
            for api in APIS:
                streamed(srv.base_url, api, a.max_tokens)
        load_before = os.getloadavg()[0]
        for r in range(a.rounds):
            order = APIS[r % 3:] + APIS[:r % 3]
            for api in order:
                rows[api].append(streamed(srv.base_url, api, a.max_tokens))
        load_after = os.getloadavg()[0]

    # Same work in every API: the same prompt tokens and the same greedy answer.
    problems = []
    ref = rows["chat"][0]
    for api in APIS:
        for x in rows[api]:
            if x["prompt_tokens"] != ref["prompt_tokens"] or x["text"] != ref["text"]:
                problems.append(f"{api}: {x['prompt_tokens']} prompt tokens, text {x['text'][:60]!r} "
                                f"(chat: {ref['prompt_tokens']}, {ref['text'][:60]!r})")
                break
    chat = [x["ttft_s"] for x in rows["chat"]]
    res = {"cache": cache, "load_1min": [load_before, load_after], "prompt_tokens": ref["prompt_tokens"],
           "output_tokens": ref["output_tokens"], "answer": ref["text"], "problems": problems, "apis": {}}
    for api in APIS:
        t = [x["ttft_s"] for x in rows[api]]
        res["apis"][api] = {
            "ttft_median_ms": 1e3 * statistics.median(t), "ttft_p90_ms": 1e3 * p90(t),
            "ttft_mean_ms": 1e3 * statistics.mean(t), "total_median_ms": 1e3 * statistics.median(
                x["total_s"] for x in rows[api]),
            "ratio_median": statistics.median(t) / statistics.median(chat), "ratio_p90": p90(t) / p90(chat),
            "median_round_ratio": statistics.median(x / c for x, c in zip(t, chat)),
            "ttft_ms": [1e3 * x for x in t]}
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(MODEL_DIR / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=100, help="timed rounds (each API once per round)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed rounds first")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--cache", choices=["off", "on", "both"], default="both", help="prefix caching")
    ap.add_argument("--inferd", default=str(ROOT / "build" / "inferd"))
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    out = Path(a.out or CACHE / "bench" / f"api-ttft-{stamp}")
    out.mkdir(parents=True, exist_ok=True)
    if not Path(a.inferd).is_file():
        sys.exit(f"{a.inferd} not found: build inferd first (scripts/setup.sh) or pass --inferd")
    commit = cs.binary_commit(a.inferd)
    modes = ["off", "on"] if a.cache == "both" else [a.cache]
    results = [run_mode(a, m, out) for m in modes]
    summary = {"date_utc": stamp, "machine": f"{cs.cpu_name()}, {os.cpu_count()} cores", "inferd_commit": commit,
               "config": vars(a), "modes": results}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")

    lines = [f"Machine: {summary['machine']}; threads {a.threads}; {Path(a.model).name}; inferd {commit}; {stamp} UTC; "
             f"{a.rounds} rounds after {a.warmup} warm-up rounds; max tokens {a.max_tokens}, temperature 0.", "",
             "| prefix caching | prompt tokens | API | TTFT median (ms) | p90 (ms) | mean (ms) | whole request median (ms) "
             "| median / chat's | p90 / chat's | median of round ratios | load (1 min) |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for m in results:
        for api in APIS:
            s = m["apis"][api]
            lines.append(f"| {m['cache']} | {m['prompt_tokens']} | {api} | {s['ttft_median_ms']:.2f} | "
                         f"{s['ttft_p90_ms']:.2f} | {s['ttft_mean_ms']:.2f} | {s['total_median_ms']:.1f} | "
                         f"{s['ratio_median']:.3f} | {s['ratio_p90']:.3f} | {s['median_round_ratio']:.3f} | "
                         f"{m['load_1min'][0]:.2f}-{m['load_1min'][1]:.2f} |")
    for m in results:
        lines.append("")
        lines.append(f"Prefix caching {m['cache']}: " + ("; ".join(m["problems"]) if m["problems"] else
                     f"all three APIs had {m['prompt_tokens']} prompt tokens and the same {m['output_tokens']}-token "
                     f"answer in every round ({m['answer'][:80]!r}...)."))
    table = "\n".join(lines) + "\n"
    (out / "results.md").write_text(table)
    print(table)
    log(f"wrote {out / 'results.md'} and {out / 'summary.json'}")
    return 1 if any(m["problems"] for m in results) else 0


if __name__ == "__main__":
    sys.exit(main())
