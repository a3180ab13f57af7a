"""`inferd generate` on a hybrid model (qwen35: Gated DeltaNet layers beside attention) at a short context:
the KV budget it sizes for one request must hold the recurrent state slots (the running one, the prefix
cache's snapshots, the spare) besides the attention layers' blocks. It once held the blocks only, so a
full-size Qwen3.5 (50 MiB of state a slot) failed to start at any usual -c."""
from __future__ import annotations

import json
import subprocess

from conftest import BINARY, REPO

TINY_QWEN35 = REPO / "tests/data/models/tiny-qwen35.gguf"


def test_generate_holds_the_state_slots_at_a_short_context():
    proc = subprocess.run([str(BINARY), "generate", "-m", str(TINY_QWEN35), "-p", "The capital of France is",
                           "-n", "4", "-c", "32", "--temp", "0", "--ignore-eos", "-t", "2", "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(proc.stdout)["ids"]) == 4
