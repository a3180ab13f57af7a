"""The scripts in examples/ run, and say what they should."""
from __future__ import annotations

import subprocess
import sys

from pkg_support import DEFAULT_MODEL, REPO


def run_example(name: str, *args: str) -> str:
    proc = subprocess.run([sys.executable, str(REPO / "examples" / name), "--model", str(DEFAULT_MODEL), *args],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_batch_example():
    out = run_example("batch.py", "--max-tokens", "8")
    assert out.count("--- ") == 4
    assert "=== 4 prompts" in out


def test_batch_example_chat():
    out = run_example("batch.py", "--max-tokens", "8", "--chat")
    assert "=== 4 prompts" in out


def test_streaming_example():
    out = run_example("streaming.py", "--max-tokens", "12")
    assert out.startswith("Once upon a time") and "[finish_reason: " in out


def test_streaming_example_concurrent():
    out = run_example("streaming.py", "--max-tokens", "12", "--concurrent", "3")
    for i in range(3):
        assert f"--- req-{i}:" in out
    assert "=== 3 requests" in out
