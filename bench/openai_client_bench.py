#!/usr/bin/env python3
"""A second, independent serving benchmark client: asyncio on the official
`openai` package, so a figure from `inferd bench serve` (C++, Boost.Beast) can
be checked against a client that shares none of its code.

Sends --num-prompts streamed completions of random token ids (an exact
--input-len on any server; ids drawn from --token-id-range, which must avoid
the model's special tokens) with ignore_eos and max_tokens = --output-len, at
most --concurrency in flight, arriving all at once or as a Poisson process
(--request-rate). Measures on the client, with time.perf_counter at each
streamed chunk: TTFT (first chunk with text), ITL (gaps between chunks with
text), end-to-end latency, and the output tokens the final usage chunk
reports. Writes the same field names as `inferd bench serve --output-json`
(duration, completed, failed, total_input_tokens, total_output_tokens,
request_throughput, output_throughput, total_token_throughput,
{mean,median,std,pNN}_{ttft,tpot,itl,e2el}_ms, and per-request arrays).

Usage: bench/openai_client_bench.py --base-url http://127.0.0.1:8000 \
         --num-prompts 64 --input-len 128 --output-len 128 --concurrency 16 --output-json out.json
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import time


def percentile(sorted_values: list[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy.percentile's default)."""
    if not sorted_values:
        return 0.0
    rank = p / 100.0 * (len(sorted_values) - 1)
    lo = math.floor(rank)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (rank - lo)


def summarize(values: list[float], percentiles: list[float]) -> dict[str, float]:
    v = sorted(values)
    n = len(v)
    mean = sum(v) / n if n else 0.0
    std = math.sqrt(sum((x - mean) ** 2 for x in v) / n) if n else 0.0
    out = {"mean": mean, "median": percentile(v, 50), "std": std}
    for p in percentiles:
        out[f"p{p:g}"] = percentile(v, p)
    return out


async def one_request(client, model: str, prompt: list[int], args, sem: asyncio.Semaphore,
                      t0: float) -> dict:
    async with sem:
        result = {"success": False, "error": "", "prompt_len": len(prompt), "output_len": 0, "ttft": 0.0,
                  "itl": [], "latency": 0.0, "start_time": 0.0}
        start = time.perf_counter()
        result["start_time"] = start - t0
        last = start
        chunks = 0
        usage = None
        try:
            stream = await client.completions.create(
                model=model, prompt=prompt, max_tokens=args.output_len, temperature=args.temperature,
                stream=True, stream_options={"include_usage": True},
                extra_body={"ignore_eos": True} if args.ignore_eos else None)
            async for chunk in stream:
                now = time.perf_counter()
                if chunk.usage is not None:
                    usage = chunk.usage
                if chunk.choices and chunk.choices[0].text:
                    if chunks == 0:
                        result["ttft"] = now - start
                    else:
                        result["itl"].append(now - last)
                    last = now
                    chunks += 1
            result["latency"] = time.perf_counter() - start
        except Exception as e:  # a failed request is data, not a crash
            result["error"] = f"{type(e).__name__}: {e}"
            return result
        if chunks == 0:
            result["error"] = "the stream carried no output text"
            return result
        result["output_len"] = usage.completion_tokens if usage and usage.completion_tokens else chunks
        if usage and usage.prompt_tokens:
            result["prompt_len"] = usage.prompt_tokens
        result["success"] = True
        return result


async def run(args) -> dict:
    import openai

    try:
        import httpx
    except ImportError:  # some openai releases ship their HTTP client as httpx2
        import httpx2 as httpx

    # A fresh connection per request: llama-server closes kept-alive connections
    # after a few requests, and a request that lands on one just closed fails
    # (retrying it would hide the failure and skew its latency).
    http_client = openai.DefaultAsyncHttpxClient(limits=httpx.Limits(max_connections=None,
                                                                     max_keepalive_connections=0))
    client = openai.AsyncOpenAI(base_url=args.base_url.rstrip("/") + "/v1", api_key="unused",
                                max_retries=0, timeout=args.timeout, http_client=http_client)
    model = args.model or (await client.models.list()).data[0].id
    rng = random.Random(args.seed)
    lo, hi = (int(x) for x in args.token_id_range.split(","))
    prefix = [rng.randrange(lo, hi) for _ in range(args.prefix_len)]
    prompts = [prefix + [rng.randrange(lo, hi) for _ in range(args.input_len)] for _ in range(args.num_prompts)]
    sem = asyncio.Semaphore(args.concurrency if args.concurrency > 0 else len(prompts))

    if args.num_warmups:
        await asyncio.gather(*(one_request(client, model, prompts[0], args, sem, time.perf_counter())
                               for _ in range(args.num_warmups)))

    t0 = time.perf_counter()
    tasks = []
    for i, prompt in enumerate(prompts):
        if args.request_rate != math.inf and i > 0:
            await asyncio.sleep(rng.expovariate(args.request_rate))
        tasks.append(asyncio.create_task(one_request(client, model, prompt, args, sem, t0)))
    results = await asyncio.gather(*tasks)
    duration = time.perf_counter() - t0
    await client.close()

    ok = [r for r in results if r["success"]]
    total_in = sum(r["prompt_len"] for r in ok)
    total_out = sum(r["output_len"] for r in ok)
    percentiles = [float(p) for p in args.percentiles.split(",")]
    samples = {
        "ttft": [r["ttft"] for r in ok],
        "tpot": [(r["latency"] - r["ttft"]) / (r["output_len"] - 1) for r in ok if r["output_len"] > 1],
        "itl": [g for r in ok for g in r["itl"]],
        "e2el": [r["latency"] for r in ok],
    }
    out = {
        "client": f"openai-python {openai.__version__}",
        "base_url": args.base_url, "model_id": model, "num_prompts": len(prompts),
        "max_concurrency": args.concurrency or None,
        "request_rate": "inf" if args.request_rate == math.inf else args.request_rate,
        "duration": duration, "completed": len(ok), "failed": len(results) - len(ok),
        "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration, "output_throughput": total_out / duration,
        "total_token_throughput": (total_in + total_out) / duration,
    }
    for name, values in samples.items():
        s = summarize(values, percentiles)
        for stat, value in s.items():
            out[f"{stat}_{name}_ms"] = 1e3 * value
    out.update({
        "input_lens": [r["prompt_len"] for r in results],
        "output_lens": [r["output_len"] for r in results],
        "ttfts": [r["ttft"] for r in results],
        "itls": [r["itl"] for r in results],
        "latencies": [r["latency"] for r in results],
        "start_times": [r["start_time"] for r in results],
        "errors": [r["error"] for r in results],
    })
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-url", required=True, help="server URL without /v1, e.g. http://127.0.0.1:8000")
    ap.add_argument("--model", default="", help="model name (default: the server's first)")
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=128, help="random prompt tokens after the prefix")
    ap.add_argument("--prefix-len", type=int, default=0, help="random tokens shared by every prompt")
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--token-id-range", default="1000,30000",
                    help="LO,HI: prompt token ids are drawn from [LO, HI); keep clear of special tokens")
    ap.add_argument("--concurrency", type=int, default=0, help="requests in flight at most (0: no limit)")
    ap.add_argument("--request-rate", type=float, default=math.inf, help="Poisson arrivals per second (inf: all at once)")
    ap.add_argument("--num-warmups", type=int, default=0)
    ap.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--percentiles", default="90,99")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--output-json", default="")
    args = ap.parse_args()

    out = asyncio.run(run(args))
    print(f"openai client: {out['completed']} completed, {out['failed']} failed in {out['duration']:.2f} s; "
          f"output {out['output_throughput']:.2f} tok/s, total {out['total_token_throughput']:.2f} tok/s; "
          f"TTFT mean {out['mean_ttft_ms']:.2f} ms p99 {out.get('p99_ttft_ms', 0):.2f} ms; "
          f"ITL mean {out['mean_itl_ms']:.2f} ms p99 {out.get('p99_itl_ms', 0):.2f} ms")
    for err in [e for e in out["errors"] if e][:5]:
        print(f"error: {err}", file=sys.stderr)
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(out, f, indent=2)
    return 0 if out["completed"] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
