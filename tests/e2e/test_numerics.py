"""--numerics from the command line: exact by default, fast by name, anything
else refused naming the two tiers; the tier shown by `inferd info` and serve's
start-up log; a fast server answers, and its greedy completion of a plain
prompt starts as exact's does."""
from __future__ import annotations

import json
import subprocess

import pytest
import requests

from conftest import BINARY


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(BINARY), *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("command", [["generate", "-p", "Hi", "-n", "1"], ["info"], ["bench", "latency"]])
def test_unknown_tiers_are_refused(model_path, command):
    args = [*command, "--numerics", "turbo"]
    args = [*args[:1], str(model_path), *args[1:]] if command == ["info"] else [*args, "-m", str(model_path)]
    proc = cli(*args)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "--numerics 'turbo' is not a numerics tier: use exact" in proc.stderr, proc.stderr


def test_info_shows_the_tier(model_path):
    exact = json.loads(cli("info", str(model_path), "--json").stdout)["numerics"]
    fast = json.loads(cli("info", str(model_path), "--json", "--numerics", "fast").stdout)["numerics"]
    assert exact["tier"] == "exact" and "llama.cpp" in exact["description"]
    assert fast["tier"] == "fast" and "integer sums per weight block" in fast["description"]


def test_fast_generates_and_starts_as_exact_does(model_path):
    base = ["generate", "-m", str(model_path), "-p", "The capital of France is", "-n", "4", "--temp", "0",
            "-t", "2", "--json"]
    exact = cli(*base)
    fast = cli(*base, "--numerics", "fast")
    assert exact.returncode == 0 and fast.returncode == 0, exact.stderr + fast.stderr
    exact_ids, fast_ids = json.loads(exact.stdout)["ids"], json.loads(fast.stdout)["ids"]
    assert len(fast_ids) == 4
    assert fast_ids[0] == exact_ids[0]


def test_a_fast_server_logs_its_tier_and_answers(start_server):
    srv = start_server("--numerics", "fast")
    r = requests.post(f"{srv.base_url}/v1/completions", json={"model": srv.model, "prompt": "Hello", "max_tokens": 3,
                                                          "temperature": 0}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 3
    assert "numerics fast: integer accumulation" in srv.log()
