"""Smoke test of the benchmark commands: a few-second `inferd bench serve`
against the real server and `inferd bench latency` through the engine. Only
the JSON's shape and its internal consistency are checked (counts agree with
the per-request arrays); timings are never asserted."""
from __future__ import annotations

import json
import math
import subprocess

NUM_PROMPTS = 8
INPUT_LEN = 16
OUTPUT_LEN = 8


def run(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc


def test_bench_serve_counts_agree(server, model_path, tmp_path):
    out = tmp_path / "serve.json"
    proc = run([str(server.binary), "bench", "serve", "--base-url", server.base_url, "--model", server.model,
                "--tokenizer", str(model_path), "--dataset-name", "random", "--num-prompts", str(NUM_PROMPTS),
                "--random-input-len", str(INPUT_LEN), "--random-output-len", str(OUTPUT_LEN),
                "--max-concurrency", "4", "--num-warmups", "1", "--output-json", str(out)])
    assert "Serving Benchmark Result" in proc.stdout
    for label in ("Successful requests:", "Benchmark duration (s):", "Output token throughput (tok/s):",
                  "Mean TTFT (ms):", "P99 ITL (ms):", "Median E2EL (ms):"):
        assert label in proc.stdout

    r = json.loads(out.read_text())
    for key in ("duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
                "request_throughput", "output_throughput", "total_token_throughput",
                "mean_ttft_ms", "median_ttft_ms", "p90_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "mean_itl_ms",
                "p99_itl_ms", "mean_e2el_ms", "input_lens", "output_lens", "ttfts", "itls", "latencies", "errors"):
        assert key in r, key
    assert r["completed"] == NUM_PROMPTS and r["failed"] == 0
    assert r["max_concurrency"] == 4
    # One entry per request in every per-request array.
    for key in ("input_lens", "output_lens", "ttfts", "itls", "latencies", "errors"):
        assert len(r[key]) == r["completed"] + r["failed"], key
    assert all(e == "" for e in r["errors"])
    # Random prompts are token ids, so the server counts exactly the lengths asked for;
    # ignore_eos makes every output exactly OUTPUT_LEN tokens.
    assert r["input_lens"] == [INPUT_LEN] * NUM_PROMPTS
    assert r["output_lens"] == [OUTPUT_LEN] * NUM_PROMPTS
    assert sum(r["input_lens"]) == r["total_input_tokens"]
    assert sum(r["output_lens"]) == r["total_output_tokens"]
    # Each chunk after the first leaves one gap; no chunk holds more tokens than the output has.
    for itl, n in zip(r["itls"], r["output_lens"]):
        assert 0 <= len(itl) <= n - 1
    # Ratios and figures are consistent with the totals they come from.
    assert math.isclose(r["output_throughput"], r["total_output_tokens"] / r["duration"], rel_tol=1e-6)
    assert math.isclose(r["request_throughput"], r["completed"] / r["duration"], rel_tol=1e-6)
    assert all(t > 0 for t in r["ttfts"])
    assert all(lat >= t for lat, t in zip(r["latencies"], r["ttfts"]))
    assert math.isclose(r["mean_ttft_ms"], 1e3 * sum(r["ttfts"]) / len(r["ttfts"]), rel_tol=1e-6)
    assert r["median_ttft_ms"] <= r["p90_ttft_ms"] <= r["p99_ttft_ms"]


def test_bench_latency_reports_every_iteration(server, model_path, tmp_path):
    out = tmp_path / "latency.json"
    proc = run([str(server.binary), "bench", "latency", "-m", str(model_path), "--input-len", str(INPUT_LEN),
                "--output-len", str(OUTPUT_LEN), "--num-iters", "3", "--num-iters-warmup", "1",
                "--threads", "2", "--output-json", str(out)])
    assert "TTFT" in proc.stdout and "Decode throughput" in proc.stdout
    r = json.loads(out.read_text())
    for key in ("ttft_s", "prompt_tokens_per_second", "decode_tokens_per_second", "latency_s"):
        for stat in ("mean", "median", "p90", "p99", "stddev"):
            assert stat in r[key], (key, stat)
    assert len(r["ttfts"]) == 3 and len(r["latencies"]) == 3 and len(r["decode_tps"]) == 3
    assert all(t > 0 for t in r["ttfts"])
    assert all(lat >= t for lat, t in zip(r["latencies"], r["ttfts"]))
    assert r["config"]["input_len"] == INPUT_LEN and r["config"]["output_len"] == OUTPUT_LEN
    assert math.isclose(r["ttft_s"]["mean"], sum(r["ttfts"]) / 3, rel_tol=1e-9)
