#!/usr/bin/env python3
"""Structured outputs and tool calling: `inferd serve` beside llama.cpp's
`llama-server`, same GGUF, same threads, one server at a time, same requests.

For each model (--model, comma-separated; both servers in turn, inferd first):

  decode        the same chat prompts (a handful of realistic JSON schemas,
                the pydantic models of tests/e2e/test_structured_outputs.py,
                three prompts each), greedy, streamed, at 1 stream and at 16
                concurrent streams: with response_format json_schema, and
                unconstrained. Untimed warm-up first: every schema once, so
                compilation (measured below) is out of the decode figures.
                The unconstrained request of each prompt gets ignore_eos and
                max_tokens = the number of tokens that server's constrained
                answer to it had (from the warm-up), so the two modes decode
                the same number of tokens at the same positions; both servers
                take ignore_eos. Modes alternate pass by pass (--reps each).
                Output tok/s = the pass's tokens / its wall time (at 1 stream,
                requests one after another, so it includes each request's
                short, mostly cached prompt pass). TPOT = time per output
                token after the first, per request, averaged: inferd's from
                the client's clock (it streams one chunk per token);
                llama-server's from the `timings` it sends (predicted_ms /
                predicted_n), because it holds back the first tokens of a
                JSON answer while its streamed parser waits, so the client's
                clock misses its first steps. Schemas are closed
                (additionalProperties false on every object), as the openai
                client's parse() sends a pydantic model in strict mode. The
                constrained answers are checked with jsonschema.
  compile       time to compile a schema, from the latency of one-token
                requests on one prompt (prefix-cached after the first,
                non-streamed timing of the whole request): no schema; a
                schema the server has already seen; and
                a fresh schema (the same schema with one property renamed to
                a random name, so no cache can hold it). fresh - seen is what
                compiling a new schema adds; seen - none is what a schema
                costs on every request even when cached. A server that keeps
                no compiled schemas (llama-server converts the schema to a
                grammar on each request) shows its compile cost in seen - none
                instead. Medians of --compile-reps triples, interleaved.
                inferd's /metrics counters confirm the fresh schemas were
                compiled and the seen ones were cache hits.
  tool calls    (models whose chat template supports tools, e.g.
                Qwen2.5-Coder-Instruct; llama-server runs with --jinja)
                20 prompts over 3 tool sets, greedy, with tool_choice
                "required" and with the prompt's function named
                ({"type": "function", "function": {"name": ...}}),
                parallel_tool_calls false. Valid = HTTP 200, at least one
                tool call, every call names a function of the set (the named
                one when named), and its arguments parse as JSON and validate
                against that function's parameters with jsonschema.

Writes into --out: summary.json (every request's figures), results.md and the
server logs; prints the Markdown tables. --quick runs a few requests of each
kind to check the pipeline (its figures mean nothing).

Usage: bench/compare_structured.py [--model PATH[,PATH]] [--threads 2] [--reps 2]
                                   [--inferd build/inferd] [--quick] [--out DIR]
llama.cpp is built by bench/build_llama_cpp.sh if it is not there yet.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import copy
import datetime
import http.client
import json
import os
import secrets
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "e2e"))
import compare_serving as cs  # noqa: E402  (Server, Comparison's server command lines, machine helpers)

ROOT, CACHE, MODEL_DIR = cs.ROOT, cs.CACHE, cs.MODEL_DIR
INFERD, LLAMA = cs.INFERD, cs.LLAMA
DEFAULT_MODELS = [MODEL_DIR / "SmolLM2-135M-Instruct.Q4_1.gguf", MODEL_DIR / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"]
CTX = 2048  # context per request (slot) on both servers


def log(msg: str) -> None:
    print(f"[compare_structured] {msg}", flush=True)


cs.log = log  # compare_serving's Server reports through this module's prefix


# ---- workloads -----------------------------------------------------------------
def decode_schemas() -> dict[str, tuple[dict, list[str]]]:
    """Schema name -> (JSON schema, three prompts): pydantic models of the e2e tests."""
    so = __import__("test_structured_outputs")
    prompts = {
        "Employee": ["Describe a new hire at a bakery in Lyon.", "Give the record of a nurse working in Oslo.",
                     "Invent an employee of a bicycle shop in Utrecht."],
        "Event": ["Plan a book club meeting for next spring.", "Describe a product launch party in 2025.",
                  "Create a calendar entry for a team offsite."],
        "Team": ["Describe a small team that builds a mobile app.", "Invent a research team of three people.",
                 "Give the members of a school robotics team."],
        "Polygon": ["Describe a triangle on a grid.", "Give a square centred on the origin.",
                    "Invent a four-sided shape with integer corners."],
        "Drawing": ["Describe a simple drawing made of circles.", "Compose a picture of two squares.",
                    "Sketch a logo from basic shapes."],
        "Weather": ["Report today's weather in Madrid.", "What is the weather like in Reykjavik in winter?",
                    "Give a summer weather report for Cairo."],
        "Product": ["Describe a garden hose sold by a hardware store.", "Give the catalogue entry of a desk lamp.",
                    "Invent a product for a kitchen supplies shop."],
        "Tree": ["Describe a small category tree for a music store.", "Give a family tree of two generations.",
                 "Build a tiny taxonomy of fruits."],
    }
    models = {m.__name__: m for m in so.PYDANTIC_MODELS}
    return {name: (closed(models[name].model_json_schema()), p) for name, p in prompts.items()}


def closed(schema):
    """The schema with additionalProperties false on every object that leaves it unset, as the openai
    client's parse() sends a pydantic model (strict mode). Left open, llguidance lets the model add keys
    and llama.cpp's converter does not, so the two servers would decode different documents."""
    if isinstance(schema, dict):
        out = {k: closed(v) for k, v in schema.items()}
        if out.get("type") == "object" and "properties" in out:
            out.setdefault("additionalProperties", False)
        return out
    if isinstance(schema, list):
        return [closed(v) for v in schema]
    return schema


def decode_requests(n: int) -> list[tuple[str, dict, str]]:
    """n (schema name, schema, user message) in a fixed order, every schema before any repeats."""
    schemas = decode_schemas()
    flat = [(name, schema, f"{prompt} Answer in JSON.") for k in range(3)
            for name, (schema, prompts) in schemas.items() for prompt in prompts[k:k + 1]]
    return [flat[i % len(flat)] for i in range(n)]


def compile_schemas() -> dict[str, dict]:
    """Two schemas for compile time: a nested model of the e2e tests and a larger invoice."""
    so = __import__("test_structured_outputs")
    money = {"type": "number", "minimum": 0, "maximum": 100000}
    line = {"type": "object", "properties": {
        "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"}, "description": {"type": "string", "maxLength": 40},
        "quantity": {"type": "integer", "minimum": 1, "maximum": 999}, "unit_price": money,
        "tax_rate": {"enum": [0, 0.055, 0.1, 0.2]}}, "required": ["sku", "description", "quantity", "unit_price"],
        "additionalProperties": False}
    party = {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 40}, "vat_id": {"type": "string", "pattern": "^[A-Z]{2}[0-9A-Z]{8,12}$"},
        "email": {"type": "string", "pattern": "^[a-z0-9.]+@[a-z0-9]+\\.[a-z]{2,4}$"},
        "address": {"type": "object", "properties": {
            "street": {"type": "string", "maxLength": 40}, "city": {"type": "string", "maxLength": 30},
            "postcode": {"type": "string", "pattern": "^[0-9A-Z -]{3,10}$"},
            "country": {"type": "string", "pattern": "^[A-Z]{2}$"}},
            "required": ["street", "city", "postcode", "country"], "additionalProperties": False}},
        "required": ["name", "address"], "additionalProperties": False}
    invoice = {"type": "object", "properties": {
        "number": {"type": "string", "pattern": "^INV-[0-9]{6}$"},
        "issued": {"type": "string", "pattern": "^20[0-9]{2}-[01][0-9]-[0-3][0-9]$"},
        "due_days": {"type": "integer", "minimum": 0, "maximum": 120},
        "currency": {"enum": ["EUR", "USD", "GBP", "CHF", "JPY"]}, "seller": party, "buyer": party,
        "lines": {"type": "array", "items": line, "minItems": 1, "maxItems": 20},
        "discount": {"anyOf": [{"type": "null"}, {"type": "number", "minimum": 0, "maximum": 1}]},
        "paid": {"type": "boolean"}, "notes": {"type": "string", "maxLength": 200}},
        "required": ["number", "issued", "currency", "seller", "buyer", "lines", "paid"], "additionalProperties": False}
    return {"Employee (e2e tests)": closed(so.Employee.model_json_schema()), "Invoice (nested, 28 properties)": invoice}


def with_property(schema: dict, name: str) -> dict:
    """The schema with one more required string property `name` at the top level."""
    s = copy.deepcopy(schema)
    s["properties"] = {name: {"type": "string", "maxLength": 8}, **s["properties"]}
    s["required"] = [name, *s.get("required", [])]
    return s


def fn(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required, "additionalProperties": False}}}


DATE = {"type": "string", "pattern": "^20[0-9]{2}-[01][0-9]-[0-3][0-9]$", "description": "YYYY-MM-DD"}
IATA = {"type": "string", "pattern": "^[A-Z]{3}$", "description": "IATA airport code, e.g. CDG"}
EMAIL = {"type": "string", "pattern": "^[a-z0-9._]+@[a-z0-9.]+\\.[a-z]{2,6}$"}
ORDER = {"type": "string", "pattern": "^ORD-[0-9]{6}$", "description": "e.g. ORD-123456"}
CURRENCY = {"type": "string", "pattern": "^[A-Z]{3}$", "description": "ISO 4217 code, e.g. EUR"}

TOOL_SETS = {
    "travel": [
        fn("get_weather", "Current weather and forecast for a city.",
           {"city": {"type": "string", "maxLength": 40}, "unit": {"enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7}}, ["city"]),
        fn("search_flights", "Search one-way flights.",
           {"origin": IATA, "destination": IATA, "date": DATE,
            "passengers": {"type": "integer", "minimum": 1, "maximum": 9},
            "cabin": {"enum": ["economy", "premium", "business", "first"]}}, ["origin", "destination", "date"]),
        fn("book_hotel", "Book a hotel room.",
           {"city": {"type": "string", "maxLength": 40}, "check_in": DATE,
            "nights": {"type": "integer", "minimum": 1, "maximum": 30},
            "guests": {"type": "integer", "minimum": 1, "maximum": 6},
            "max_price_per_night": {"type": "number", "minimum": 0, "maximum": 5000}}, ["city", "check_in", "nights"]),
    ],
    "office": [
        fn("create_event", "Add an event to the calendar.",
           {"title": {"type": "string", "maxLength": 60},
            "start": {"type": "string", "pattern": "^20[0-9]{2}-[01][0-9]-[0-3][0-9]T[0-2][0-9]:[0-5][0-9]$",
                      "description": "YYYY-MM-DDTHH:MM"},
            "duration_minutes": {"type": "integer", "minimum": 5, "maximum": 480},
            "attendees": {"type": "array", "items": EMAIL, "maxItems": 5}}, ["title", "start", "duration_minutes"]),
        fn("send_email", "Send an email.",
           {"to": {"type": "array", "items": EMAIL, "minItems": 1, "maxItems": 5},
            "subject": {"type": "string", "maxLength": 80}, "body": {"type": "string", "maxLength": 400}},
           ["to", "subject", "body"]),
        fn("set_reminder", "Remind the user of something later.",
           {"text": {"type": "string", "maxLength": 100},
            "minutes_from_now": {"type": "integer", "minimum": 1, "maximum": 10080}}, ["text", "minutes_from_now"]),
    ],
    "shop": [
        fn("lookup_order", "Status of a customer's order.", {"order_id": ORDER}, ["order_id"]),
        fn("refund_order", "Refund all or part of an order.",
           {"order_id": ORDER, "amount": {"type": "number", "exclusiveMinimum": 0, "maximum": 10000},
            "reason": {"enum": ["damaged", "late", "wrong_item", "other"]}}, ["order_id", "amount", "reason"]),
        fn("convert_currency", "Convert an amount between currencies.",
           {"amount": {"type": "number", "minimum": 0}, "from": CURRENCY, "to": CURRENCY}, ["amount", "from", "to"]),
        fn("search_products", "Search the catalogue.",
           {"query": {"type": "string", "maxLength": 60}, "max_price": {"type": "number", "minimum": 0},
            "in_stock_only": {"type": "boolean"}}, ["query"]),
    ],
}

# (tool set, the function the prompt asks for, the user's message)
TOOL_PROMPTS = [
    ("travel", "get_weather", "Will I need an umbrella in Dublin this week?"),
    ("travel", "get_weather", "How hot is it in Phoenix right now, in fahrenheit?"),
    ("travel", "search_flights", "Find me a flight from Paris CDG to Tokyo on 2025-04-12 for two people."),
    ("travel", "search_flights", "I want to fly business class from JFK to LHR next Friday, 2025-06-06."),
    ("travel", "book_hotel", "Book a hotel in Rome for 3 nights from 2025-05-01, under 150 euros a night."),
    ("travel", "book_hotel", "I need a room in Kyoto for my family of four, checking in 2025-10-20 for a week."),
    ("travel", "get_weather", "What's the forecast for Cape Town over the next 5 days?"),
    ("office", "create_event", "Schedule a 30 minute design review on 2025-03-14 at 10:00 with ana@example.com."),
    ("office", "create_event", "Put a two-hour planning session in my calendar for 2025-09-02 at 14:30."),
    ("office", "send_email", "Email bob@corp.io that the report is late and will arrive on Monday."),
    ("office", "send_email", "Send a thank-you note to the whole team at team@startup.dev for the launch."),
    ("office", "set_reminder", "Remind me to call the dentist in 45 minutes."),
    ("office", "set_reminder", "Remind me tomorrow to water the plants."),
    ("office", "create_event", "Book a weekly sync called 'Infra standup' starting 2025-01-06 09:15, 15 minutes."),
    ("shop", "lookup_order", "Where is my order ORD-482913?"),
    ("shop", "lookup_order", "Has order ORD-000117 shipped yet?"),
    ("shop", "refund_order", "Order ORD-550021 arrived broken, please refund the 49.99 I paid."),
    ("shop", "refund_order", "I got the wrong item in ORD-310775; refund 15 dollars of it."),
    ("shop", "convert_currency", "How much is 250 US dollars in Japanese yen?"),
    ("shop", "search_products", "Do you have any waterproof hiking boots under 120?"),
]


# ---- HTTP (stdlib only: the client must cost the 2-core machine as little as possible) ----
def post(base_url: str, body: dict, stream: bool, timeout: float = 600):
    """POSTs to /v1/chat/completions. Streamed: (status, [(time, chunk dict)], error text);
    else (status, response dict or error text)."""
    host, port = base_url.split("//", 1)[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if not stream or resp.status != 200:
            raw = resp.read().decode(errors="replace")
            try:
                data = json.loads(raw)
            except ValueError:
                data = raw
            return (resp.status, data, "") if stream is False else (resp.status, [], raw[:300])
        events = []
        while True:
            line = resp.readline()
            if not line:
                break
            if line.startswith(b"data:"):
                t = time.perf_counter()
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    break
                events.append((t, json.loads(payload)))
        return resp.status, events, ""
    finally:
        conn.close()


def streamed(base_url: str, body: dict) -> dict:
    """One streamed request: the text, token count, and client-side times."""
    start = time.perf_counter()
    status, events, err = post(base_url, {**body, "stream": True, "stream_options": {"include_usage": True}}, True)
    text, times, usage, finish, timings = [], [], None, None, None
    for t, ev in events:
        if ev.get("usage"):
            usage = ev["usage"]
        if ev.get("timings"):  # llama-server's own figures, in its last chunks
            timings = ev["timings"]
        for ch in ev.get("choices") or []:
            piece = (ch.get("delta") or {}).get("content")
            if piece:
                text.append(piece)
                times.append(t)
            finish = ch.get("finish_reason") or finish
    tokens = usage["completion_tokens"] if usage else len(times)
    end = time.perf_counter()
    if timings and timings.get("predicted_n", 0) > 1:
        # llama-server holds back the first tokens of a JSON answer (its streamed parser), so the client's
        # clock cannot see its decode steps; its own timer can.
        tpot, source = timings["predicted_ms"] / 1000 / timings["predicted_n"], "server"
    else:
        tpot, source = ((times[-1] - times[0]) / (tokens - 1) if len(times) > 1 and tokens > 1 else None), "client"
    return {"status": status, "error": err, "text": "".join(text), "tokens": tokens, "chunks": len(times),
            "finish": finish, "start": start, "e2e": end - start, "tpot": tpot, "tpot_source": source}


def run_all(jobs, concurrency: int) -> list:
    with concurrent.futures.ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(pool.map(lambda job: job(), jobs))


def metric(srv: cs.Server, name: str) -> float | None:
    try:
        for line in srv.get("/metrics").splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    except Exception:  # noqa: BLE001 -- llama-server has no such metrics (or /metrics at all)
        pass
    return None


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def schema_format(name: str, schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": name.split(" ")[0], "schema": schema, "strict": True}}


# ---- one server, one model ------------------------------------------------------
class Bench:
    def __init__(self, args, model: str):
        self.a, self.model = args, model
        self.out = Path(args.out)
        ns = types.SimpleNamespace(model=model, inferd=args.inferd, out=args.out, threads=args.threads)
        self.cmp = cs.Comparison(ns)  # inferd info, and the server command lines of compare_serving

    def server(self, kind: str, slots: int) -> cs.Server:
        tag = f"{Path(self.model).stem}-{slots}"
        if kind == LLAMA:
            srv = self.cmp.llama_server(slots, CTX, tag)
            srv.args += ["--jinja"]  # the model's own template (tools need it); its default in recent builds
        else:
            srv = self.cmp.inferd_server(slots, CTX, tag)
        return srv

    def body(self, message: str, **extra) -> dict:
        return {"model": cs.SERVED_NAME, "messages": [{"role": "user", "content": message}], "temperature": 0,
                "seed": self.a.seed, **extra}

    # -- decode ------------------------------------------------------------------
    def decode(self, srv: cs.Server, streams: int, n: int) -> dict:
        reqs = decode_requests(n)
        url = srv.base_url

        def constrained(i):
            name, schema, msg = reqs[i]
            return lambda: streamed(url, self.body(msg, max_tokens=self.a.max_tokens,
                                                   response_format=schema_format(name, schema)))

        # Warm-up: every distinct request once, constrained (compiles every schema; gives the lengths).
        distinct = sorted({reqs.index(r) for r in reqs})
        warm = dict(zip(distinct, run_all([constrained(i) for i in distinct], min(streams, 16) if streams > 1 else 1)))
        lengths = [max(2, warm[reqs.index(r)]["tokens"]) for r in reqs]

        def unconstrained(i):
            _, _, msg = reqs[i]
            return lambda: streamed(url, self.body(msg, max_tokens=lengths[i], ignore_eos=True))

        passes = {"unconstrained": [], "schema": []}
        for rep in range(self.a.reps):
            for mode in (("unconstrained", "schema") if rep % 2 == 0 else ("schema", "unconstrained")):
                make = unconstrained if mode == "unconstrained" else constrained
                t0 = time.perf_counter()
                results = run_all([make(i) for i in range(len(reqs))], streams)
                passes[mode].append({"wall_s": time.perf_counter() - t0, "requests": results})
        out = {"streams": streams, "requests": len(reqs), "warmup_lengths": lengths}
        for mode, ps in passes.items():
            rs = [r for p in ps for r in p["requests"]]
            ok = [r for r in rs if r["status"] == 200 and r["tokens"] >= 2 and r["tpot"]]
            fig = {"failed": len(rs) - len(ok), "errors": sorted({r["error"][:200] for r in rs if r["error"]}),
                   "mean_tokens": statistics.mean(r["tokens"] for r in ok) if ok else None,
                   "mean_tpot_ms": statistics.mean(1000 * r["tpot"] for r in ok) if ok else None,
                   "tpot_source": sorted({r["tpot_source"] for r in ok}),
                   "streamed_per_token": sum(1 for r in ok if r["chunks"] == r["tokens"]),
                   "output_tok_s": statistics.mean(sum(r["tokens"] for r in p["requests"] if r["status"] == 200)
                                                   / p["wall_s"] for p in ps),
                   "finish": {str(f): sum(1 for r in rs if r["finish"] == f) for f in {r["finish"] for r in rs}}}
            if mode == "schema":
                fig["valid_json"] = sum(1 for r, (name, schema, _) in zip(rs, reqs * self.a.reps)
                                        if valid_json(r["text"], schema))
                fig["checked"] = len(rs)
                fig["sample"] = rs[0]["text"][:300] if rs else ""
            out[mode] = fig
            out[mode + "_requests"] = [{k: r[k] for k in ("status", "tokens", "chunks", "e2e", "tpot", "finish")}
                                       for r in rs]
        log(f"{srv.label}, {streams} stream(s): TPOT {fmt(out['unconstrained']['mean_tpot_ms'], 2)} ms unconstrained,"
            f" {fmt(out['schema']['mean_tpot_ms'], 2)} with a schema; output {fmt(out['unconstrained']['output_tok_s'])}"
            f" / {fmt(out['schema']['output_tok_s'])} tok/s; valid JSON {out['schema']['valid_json']}/"
            f"{out['schema']['checked']}")
        return out

    # -- compile -------------------------------------------------------------------
    def compile_time(self, srv: cs.Server, kind: str) -> dict:
        url, results = srv.base_url, {}
        msg = "Fill in the JSON object with plausible example values."
        for name, schema in compile_schemas().items():
            seen = with_property(schema, "ref_seen")
            first = streamed(url, self.body(msg, max_tokens=1, response_format=schema_format(name, seen)))
            if first["status"] != 200:
                results[name] = {"error": f"HTTP {first['status']}: {first['error']}"}
                continue
            streamed(url, self.body(msg, max_tokens=1))  # the prompt in the prefix cache
            compiles0 = metric(srv, "inferd:structured_output_compiles_total")
            hits0 = metric(srv, "inferd:structured_output_compile_cache_hits_total")
            lat = {"none": [], "seen": [], "fresh": []}
            for _ in range(self.a.compile_reps):
                fresh = with_property(schema, "ref_" + secrets.token_hex(6))
                for mode, fmt_ in (("none", None), ("seen", schema_format(name, seen)),
                                   ("fresh", schema_format(name, fresh))):
                    extra = {"response_format": fmt_} if fmt_ else {}
                    r = streamed(url, self.body(msg, max_tokens=1, **extra))
                    lat[mode].append(1000 * r["e2e"] if r["status"] == 200 else None)
            med = {m: median(v) for m, v in lat.items()}
            res = {"latency_ms": lat, "median_ms": med,
                   "compile_ms": med["fresh"] - med["seen"] if med["fresh"] and med["seen"] else None,
                   "per_request_ms": med["seen"] - med["none"] if med["seen"] and med["none"] else None,
                   "new_schema_ms": med["fresh"] - med["none"] if med["fresh"] and med["none"] else None}
            if kind == INFERD and compiles0 is not None:
                res["inferd_compiles"] = metric(srv, "inferd:structured_output_compiles_total") - compiles0
                res["inferd_cache_hits"] = metric(srv, "inferd:structured_output_compile_cache_hits_total") - hits0
            results[name] = res
            log(f"{srv.label}, compile {name}: latency none/seen/fresh {fmt(med['none'])}/{fmt(med['seen'])}/"
                f"{fmt(med['fresh'])} ms" + (f"; compiles {res['inferd_compiles']:.0f}, cache hits "
                                             f"{res['inferd_cache_hits']:.0f}" if "inferd_compiles" in res else ""))
        return results

    # -- tool calls ----------------------------------------------------------------
    def tool_calls(self, srv: cs.Server, n: int) -> dict:
        url, out = srv.base_url, {}
        prompts = TOOL_PROMPTS[:n]
        for mode in ("required", "named"):
            def job(tool_set, want, msg, mode=mode):
                choice = "required" if mode == "required" else {"type": "function", "function": {"name": want}}
                body = self.body(msg, max_tokens=self.a.tool_max_tokens, tools=TOOL_SETS[tool_set],
                                 tool_choice=choice, parallel_tool_calls=False)
                return lambda: post(url, body, False)
            results = run_all([job(*p) for p in prompts], 16)
            verdicts = [judge(r, TOOL_SETS[ts], want if mode == "named" else None)
                        for r, (ts, want, _) in zip(results, prompts)]
            counts = {}
            for v in verdicts:
                counts[v["verdict"]] = counts.get(v["verdict"], 0) + 1
            out[mode] = {"requests": len(prompts), "valid": counts.get("valid", 0), "counts": counts,
                         "intended_function": sum(1 for v, (_, want, _) in zip(verdicts, prompts)
                                                  if v.get("names") and v["names"][0] == want),
                         "examples": [v for v in verdicts if v["verdict"] != "valid"][:5],
                         "calls": [v.get("calls") for v in verdicts]}
            log(f"{srv.label}, tool_choice {mode}: {out[mode]['valid']}/{len(prompts)} valid {counts}")
        return out


def fmt(x, digits=1) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def valid_json(text: str, schema: dict) -> bool:
    import jsonschema
    try:
        jsonschema.validate(json.loads(text), schema)
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


def judge(result, tools: list[dict], named: str | None) -> dict:
    """The verdict on one tool-choice response (see the module docstring for 'valid')."""
    import jsonschema
    status, data, _ = result
    if status != 200:
        msg = data.get("error", {}).get("message", "") if isinstance(data, dict) else str(data)
        return {"verdict": f"HTTP {status}", "detail": str(msg)[:200]}
    message = data["choices"][0]["message"]
    calls = message.get("tool_calls") or []
    if not calls:
        return {"verdict": "no tool call", "detail": (message.get("content") or "")[:200]}
    params = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    names = [c["function"]["name"] for c in calls]
    seen = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in calls]
    for c in calls:
        name, raw = c["function"]["name"], c["function"]["arguments"]
        if name not in params or (named and name != named):
            return {"verdict": "wrong function", "detail": name, "names": names, "calls": seen}
        try:
            args = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError:
            return {"verdict": "arguments not JSON", "detail": str(raw)[:200], "names": names, "calls": seen}
        try:
            jsonschema.validate(args, params[name])
        except jsonschema.ValidationError as e:
            return {"verdict": "arguments fail the schema", "detail": f"{e.message[:120]} in {str(raw)[:150]}",
                    "names": names, "calls": seen}
    return {"verdict": "valid", "names": names, "calls": seen}


# ---- report ------------------------------------------------------------------------
def ratio(x, y) -> str:
    return f"{x / y:.3f}" if x and y else "n/a"


def markdown(summary: dict) -> str:
    cfg = summary["config"]
    lines = [f"Machine: {summary['machine']}; threads {cfg['threads']}; {summary['date']}; inferd "
             f"{summary['inferd_commit']}; llama.cpp {summary['llama_version']}; greedy; {cfg['reps']} passes per "
             "mode, alternating.", ""]
    for model, m in summary["models"].items():
        lines += [f"#### {model} (vocabulary {m['vocab']})", "",
                  "Decode with a JSON schema against unconstrained (same prompts; unconstrained answers get "
                  "ignore_eos and the length of the server's own constrained answer):", "",
                  "| streams | server | requests x passes | tokens / answer, schema (unconstrained) | output tok/s "
                  "unconstrained | output tok/s schema | schema / unconstrained | TPOT ms unconstrained | "
                  "TPOT ms schema | speed, schema / unconstrained (TPOT ratio) | TPOT from | valid JSON (finish) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for streams in cfg["streams"]:
            for kind in (INFERD, LLAMA):
                d = m["servers"].get(kind, {}).get("decode", {}).get(str(streams))
                if not d:
                    continue
                u, s = d["unconstrained"], d["schema"]
                fails = "" if not (u["failed"] or s["failed"]) else f" (failed {u['failed']} / {s['failed']})"
                lines.append(
                    f"| {streams} | {kind} | {d['requests']} x {cfg['reps']}{fails} | {fmt(s['mean_tokens'])} "
                    f"({fmt(u['mean_tokens'])}) | {fmt(u['output_tok_s'])} | {fmt(s['output_tok_s'])} | "
                    f"{ratio(s['output_tok_s'], u['output_tok_s'])} | {fmt(u['mean_tpot_ms'], 2)} | "
                    f"{fmt(s['mean_tpot_ms'], 2)} | {ratio(u['mean_tpot_ms'], s['mean_tpot_ms'])} | "
                    f"{'/'.join(sorted(set(u['tpot_source'] + s['tpot_source'])))} | {s['valid_json']}/{s['checked']} "
                    f"({', '.join(f'{k} {v}' for k, v in sorted(s['finish'].items()))}) |")
        lines += ["", "Time to compile a schema (median latency of one-token requests, same prompt; fresh = a "
                  "property renamed at random each time):", "",
                  "| server | schema | no schema (ms) | seen schema (ms) | fresh schema (ms) | "
                  "compile: fresh - seen (ms) | every request: seen - none (ms) | new schema: fresh - none (ms) |",
                  "|---|---|---|---|---|---|---|---|"]
        for kind in (INFERD, LLAMA):
            for name, c in m["servers"].get(kind, {}).get("compile", {}).items():
                if "error" in c:
                    lines.append(f"| {kind} | {name} | {c['error'][:120]} | | | | | |")
                    continue
                md = c["median_ms"]
                check = (f" ({c['inferd_compiles']:.0f} compiles, {c['inferd_cache_hits']:.0f} hits)"
                         if "inferd_compiles" in c else "")
                lines.append(f"| {kind} | {name}{check} | {fmt(md['none'])} | {fmt(md['seen'])} | {fmt(md['fresh'])} | "
                             f"{fmt(c['compile_ms'])} | {fmt(c['per_request_ms'])} | {fmt(c['new_schema_ms'])} |")
        tools = {k: v["tools"] for k, v in m["servers"].items() if v.get("tools")}
        if tools:
            lines += ["", "Tool calls (greedy; valid = a call, of the named function when named, whose arguments "
                      "validate against its parameters):", "",
                      "| server | tool_choice | requests | valid | share valid | failures | calls to the prompt's "
                      "function |", "|---|---|---|---|---|---|---|"]
            for kind in (INFERD, LLAMA):
                for mode, t in tools.get(kind, {}).items():
                    bad = ", ".join(f"{k}: {v}" for k, v in sorted(t["counts"].items()) if k != "valid") or "none"
                    lines.append(f"| {kind} | {'required' if mode == 'required' else 'named function'} | "
                                 f"{t['requests']} | {t['valid']} | {t['valid'] / t['requests']:.0%} | {bad} | "
                                 f"{t['intended_function']} |")
        elif m.get("tools_skipped"):
            lines += ["", f"Tool calls: not run ({m['tools_skipped']})."]
        lines.append("")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=",".join(str(p) for p in DEFAULT_MODELS if p.exists()),
                    help="GGUF path(s), comma-separated (default: SmolLM2-135M and Qwen2.5-Coder-0.5B)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--streams", default="1,16", help="comma-separated concurrency levels")
    ap.add_argument("--requests", type=int, default=0,
                    help="decode requests per pass, at least the streams (default: 16 at 1 stream, 2 x streams above)")
    ap.add_argument("--reps", type=int, default=2, help="timed passes per mode, alternating")
    ap.add_argument("--max-tokens", type=int, default=400, help="of the constrained decode requests")
    ap.add_argument("--compile-reps", type=int, default=8)
    ap.add_argument("--tool-prompts", type=int, default=len(TOOL_PROMPTS))
    ap.add_argument("--tool-max-tokens", type=int, default=256)
    ap.add_argument("--skip-tools", action="store_true")
    ap.add_argument("--servers", default=f"{INFERD},{LLAMA}")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="a few requests of each kind, to check the pipeline")
    ap.add_argument("--inferd", default=str(ROOT / "build" / "inferd"))
    ap.add_argument("--out", default="", help="output folder (default ~/.cache/inferd/bench/structured-<date>)")
    args = ap.parse_args()
    if args.quick:
        args.requests, args.reps, args.compile_reps, args.tool_prompts = args.requests or 4, 1, 2, 4
    args.streams = [int(s) for s in args.streams.split(",") if s.strip()]
    servers = [s.strip() for s in args.servers.split(",") if s.strip()]
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    args.out = args.out or str(CACHE / "bench" / f"structured-{stamp}")
    Path(args.out).mkdir(parents=True, exist_ok=True)

    subprocess.run([str(ROOT / "bench" / "build_llama_cpp.sh")], check=True)
    if subprocess.run([args.inferd, "serve", "--help"], capture_output=True).returncode != 0:
        sys.exit(f"{args.inferd} has no working `serve` command: build it first (scripts/setup.sh)")
    cs.ensure_packages("jsonschema", "pydantic")
    llama_version = subprocess.run([str(cs.LLAMA_BIN / "llama-server"), "--version"], capture_output=True,
                                   text=True)
    llama_version = next((l.split(":", 1)[1].strip() for l in (llama_version.stdout + llama_version.stderr)
                          .splitlines() if l.startswith("version")), "?")
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    summary = {"date": stamp, "machine": f"{cs.cpu_name()}, {os.cpu_count()} cores", "inferd_commit": commit,
               "llama_version": llama_version, "config": {**vars(args)}, "models": {}}
    started = time.time()
    for model in [m for m in args.model.split(",") if m]:
        bench = Bench(args, model)
        m = summary["models"][Path(model).name] = {"vocab": bench.cmp.vocab, "servers": {}}
        tools_ok = not args.skip_tools
        if args.skip_tools:
            m["tools_skipped"] = "--skip-tools"
        for kind in servers:  # one server at a time, never two at once
            res = m["servers"][kind] = {"decode": {}}
            for streams in args.streams:
                with bench.server(kind, streams) as srv:
                    if streams == min(args.streams):
                        res["compile"] = bench.compile_time(srv, kind)
                    n = max(args.requests, streams) if args.requests else (16 if streams == 1 else 2 * streams)
                    res["decode"][str(streams)] = bench.decode(srv, streams, n)
                    if streams == max(args.streams) and tools_ok:
                        # The template must take tools: inferd says so with a 400 naming the template.
                        first = TOOL_PROMPTS[0]
                        probe = post(srv.base_url, bench.body(first[2], max_tokens=8, tools=TOOL_SETS[first[0]],
                                                              tool_choice="required"), False)
                        if kind == INFERD and probe[0] == 400:
                            tools_ok = False
                            why = probe[1].get("error", {}).get("message") if isinstance(probe[1], dict) else probe[1]
                            m["tools_skipped"] = f"inferd answers 400: {str(why)[:160]}"
                            log(f"tool calls skipped: {m['tools_skipped']}")
                        else:
                            res["tools"] = bench.tool_calls(srv, args.tool_prompts)
    summary["wall_seconds"] = time.time() - started
    out = Path(args.out)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    table = markdown(summary)
    (out / "results.md").write_text(table)
    print(table)
    log(f"wrote {out / 'results.md'} and {out / 'summary.json'} in {summary['wall_seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
