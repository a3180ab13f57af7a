"""--kv-cache-dtype from the command line: llama.cpp's -ctk/-ctv aliases,
the errors for keys and values that differ, unknown names, fp8 and a dtype
the kernels cannot read (naming those they can); the capacity in tokens in
`inferd info`, serve's start-up log and /metrics, which follows the dtype."""
from __future__ import annotations

import json
import re
import subprocess

import pytest

from conftest import BINARY, start, stop


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(BINARY), *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("flags, message", [
    (["-ctk", "q8_0", "-ctv", "f16"],
     "--cache-type-k q8_0 and --cache-type-v f16 differ: keys and values are kept in one dtype"),
    (["--kv-cache-dtype", "q4_0", "--cache-type-v", "q8_0"],
     "--kv-cache-dtype q4_0 and --cache-type-v q8_0 differ"),
    (["--kv-cache-dtype", "fp8_e5m2"], "--kv-cache-dtype: KV cache dtype 'fp8_e5m2' is not supported"),
    (["--kv-cache-dtype", "int4"], "--kv-cache-dtype: unknown KV cache dtype 'int4' (expected one of auto, f16,"),
    (["-ctk", "q5_1", "-ctv", "q5_1"], "KV cache dtype q5_1 is not supported for this model ("),
])
def test_refused_dtypes_say_why(model_path, flags, message):
    proc = cli("generate", "-m", str(model_path), "-p", "Hi", "-n", "1", "-t", "2", *flags)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert message in proc.stderr, proc.stderr
    if "q5_1" in flags:
        assert re.search(r"; supported: f16(, [a-z0-9_]+)*\n", proc.stderr), proc.stderr


def test_the_aliases_run_the_same_cache(model_path):
    base = ["generate", "-m", str(model_path), "-p", "The capital of France is", "-n", "6", "--temp", "0",
            "-t", "2", "--json"]
    plain = cli(*base)
    aliased = cli(*base, "-ctk", "f16", "-ctv", "f16", "--kv-cache-dtype", "auto")
    assert plain.returncode == 0 and aliased.returncode == 0, plain.stderr + aliased.stderr
    assert json.loads(plain.stdout)["ids"] == json.loads(aliased.stdout)["ids"]


@pytest.mark.parametrize("dtype", ["fp8_e4m3", "fp8", "bf16"])
def test_generate_runs_with_a_float_cache(model_path, dtype):
    proc = cli("generate", "-m", str(model_path), "-p", "The capital of France is", "-n", "6", "--temp", "0",
               "-t", "2", "--json", "--kv-cache-dtype", dtype)
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(proc.stdout)["ids"]) == 6


def test_info_shows_each_dtypes_cost(model_path):
    proc = cli("info", str(model_path), "--json")
    assert proc.returncode == 0, proc.stderr
    rows = {r["dtype"]: r for r in json.loads(proc.stdout)["kv_cache"]}
    assert list(rows) == ["f16", "q8_0", "q4_0"]
    assert rows["q8_0"]["bytes_per_token"] * 64 == rows["f16"]["bytes_per_token"] * 34
    assert rows["q4_0"]["bytes_per_token"] * 64 == rows["f16"]["bytes_per_token"] * 18
    assert rows["q8_0"]["tokens_per_gib"] / rows["f16"]["tokens_per_gib"] == pytest.approx(64 / 34, rel=0.01)
    text = cli("info", str(model_path)).stdout
    assert re.search(r"KV cache\s+dtype\s+bytes/token\s+tokens/GiB", text), text


def capacity_line(log: str) -> re.Match:
    m = re.search(r"KV cache capacity (\d+) tokens: (\w+) keys and values, (\d+) bytes a token", log)
    assert m, log
    return m


def test_serve_logs_and_exports_the_capacity(server):
    m = capacity_line(server.log())
    assert m.group(2) == "f16"
    assert server.metric("inferd:kv_cache_capacity_tokens", kv_cache_dtype="f16") == int(m.group(1))


def test_a_q8_0_server_holds_about_1_9_times_the_tokens(server, tmp_path):
    srv = start(tmp_path, ["--kv-cache-dtype", "q8_0"])
    try:
        f16 = int(capacity_line(server.log()).group(1))
        q8 = capacity_line(srv.log())
        assert q8.group(2) == "q8_0"
        assert int(q8.group(1)) / f16 == pytest.approx(64 / 34, rel=0.01)
        assert srv.metric("inferd:kv_cache_capacity_tokens", kv_cache_dtype="q8_0") == int(q8.group(1))
    finally:
        if srv.process.poll() is None:
            assert stop(srv) == 0
