"""Tensor parallelism under mpirun (issue 40): `mpirun -np T inferd serve|generate --tensor-parallel-size T`.

Each rank holds whole KV heads and their query heads, a share of the FFN's rows, of attn_output's and ffn_down's
output rows and of the vocabulary (src/model/tensor_shard.h); the heads' outputs, the activated FFN hidden and the
projections' output rows are all-gathered, so every dot product is one process's (docs/design.md, tensor
parallelism). Checked here, on Qwen2.5-Coder-0.5B (2 KV heads, Q4_K/Q6_K rows repacked in groups of 8) and
tiny-qwen3 (2 KV heads):
- greedy 64-token continuations are one process's bit for bit: all 20 identical, and every chosen token's
  logprob equal;
- within the TP topology, requests sent at once (streamed and not) are each identical to the request alone;
- sizes and models it cannot split are refused with the rule.

OpenMPI refuses to run as root without OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM), and a 2-core machine has fewer slots
than ranks without --oversubscribe; each rank runs one compute thread.
"""
from __future__ import annotations

import concurrent.futures
import json
import re
import shutil
import urllib.request

import openai
import pytest

from conftest import DEFAULT_MODEL, MODEL_DIR, MODEL_NAME, REPO, Server, stop, require_model
import mpi_ranks
from mpi_ranks import generate, stop_ranks

TINY = REPO / "tests" / "data" / "models"
QWEN = MODEL_DIR / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"

pytestmark = pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun is missing: scripts/setup.sh installs OpenMPI")

PROMPTS = [
    "The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
    "The three laws of thermodynamics are", "import numpy as np\n", "My favourite recipe for pancakes:",
    "The history of the Roman Empire", "SELECT name, age FROM users WHERE", "Photosynthesis is the process",
    "A haiku about the sea:", "class Stack:\n    def __init__(self):", "The quick brown fox",
    "In mathematics, a prime number is", "Dear hiring manager,", "The best way to learn a language is",
    "#include <stdio.h>\nint main() {", "Water boils at", "Ten tips for better sleep:",
    "The theory of relativity says", "fn main() {\n    let",
]


def serve(tmp, model, ranks: int) -> Server:
    return mpi_ranks.serve(tmp, model, ranks, "--tensor-parallel-size")


def complete(client: openai.OpenAI, prompt: str, stream: bool) -> dict:
    kw = dict(model=MODEL_NAME, prompt=prompt, max_tokens=64, temperature=0, logprobs=1,
              extra_body={"ignore_eos": True})
    if stream:
        tokens, lps = [], []
        for chunk in client.completions.create(stream=True, **kw):
            if chunk.choices and chunk.choices[0].logprobs:
                tokens += chunk.choices[0].logprobs.tokens
                lps += chunk.choices[0].logprobs.token_logprobs
        return {"tokens": tokens, "logprobs": lps}
    r = client.completions.create(**kw)
    return {"tokens": r.choices[0].logprobs.tokens, "logprobs": r.choices[0].logprobs.token_logprobs}


def alone(srv: Server, prompts: list[str], stream: bool = False) -> list[dict]:
    client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="none", max_retries=0, timeout=300)
    return [complete(client, p, stream) for p in prompts]


def at_once(srv: Server) -> list[dict]:
    client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="none", max_retries=0, timeout=300)
    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        return list(pool.map(lambda ip: complete(client, ip[1], stream=ip[0] % 2 == 1), enumerate(PROMPTS)))


def assert_same_continuations(label: str, expected: list[dict], got: list[dict]) -> None:
    """Every prompt's greedy continuation and its logprobs equal one process's (`expected`)."""
    differ = [(p, e, g) for p, e, g in zip(PROMPTS, expected, got) if e != g]
    print(f"{label}: {len(PROMPTS) - len(differ)} of {len(PROMPTS)} greedy 64-token continuations and their "
          "logprobs identical to one process's")
    assert not differ, differ


@pytest.mark.parametrize("model", [QWEN, TINY / "tiny-qwen3.gguf"], ids=["qwen2.5-coder-0.5b", "tiny-qwen3"])
def test_two_ranks_are_one_process_bit_for_bit(tmp_path, model):
    require_model(model)
    one = serve(tmp_path, model, 1)
    try:
        expected = alone(one, PROMPTS)
    finally:
        assert stop(one) == 0, one.log()[-3000:]
    two = serve(tmp_path, model, 2)
    try:
        # The 20 at once (odd ones streamed), then a few of them alone: a request's output does not depend on
        # what it is batched with, so the batched outputs stand for each request alone (checked on those few).
        got = at_once(two)
        few = alone(two, PROMPTS[:2]) + alone(two, PROMPTS[2:4], stream=True)
        metrics = urllib.request.urlopen(two.base_url + "/metrics", timeout=30).read().decode()
    finally:
        code = stop_ranks(two)
    log = two.log()
    assert code == 0, log[-3000:]
    assert re.search(r"rank 1 of 2 \(tensor parallel\): KV heads \[1, 2\)", log), log[-3000:]
    assert re.search(r"rank 0: \d+ collectives, [\d.]+ us mean per call", log), log[-3000:]
    # Four all-gathers a layer and the logits' gather a step, reported on rank 0's metrics.
    assert re.search(r"^inferd:tensor_parallel_collectives_total\{[^}]*\} [1-9]", metrics, re.M), metrics
    assert_same_continuations(model.name, expected, got)
    # Batched with the others, streamed or not, each request is what it was alone (same topology).
    for prompt, a, t in zip(PROMPTS, few, got):
        assert t["tokens"] == a["tokens"], prompt
        assert t["logprobs"] == a["logprobs"], prompt


def test_generate_with_two_ranks_matches_one_process():
    """generate --json with two compute threads a rank (the pass's other thread waits at the barrier while one
    calls MPI)."""
    path = TINY / "tiny-qwen3.gguf"
    common = ["-p", "Once upon a time", "-n", "24", "--ignore-eos", "--json", "--temp", "0"]
    one = generate(path, 1, *common, threads=2)
    assert one.returncode == 0, one.stderr
    two = generate(path, 2, *common, "--tensor-parallel-size", "2", threads=2)
    assert two.returncode == 0, two.stdout + two.stderr
    result = next(line for line in two.stdout.splitlines() if line.startswith("{"))
    assert json.loads(result)["ids"] == json.loads(one.stdout)["ids"]


def test_kv_heads_not_divisible_are_refused():
    """SmolLM2-135M has 3 KV heads: 2 ranks cannot hold whole heads each."""
    require_model(DEFAULT_MODEL)
    r = generate(DEFAULT_MODEL, 2, "-p", "hi", "--tensor-parallel-size", "2")
    assert r.returncode != 0
    assert "must divide the model's 3 KV heads" in r.stderr, r.stdout + r.stderr




def test_bad_sizes_are_refused():
    r = generate(TINY / "tiny-qwen3.gguf", 1, "-p", "hi", "--tensor-parallel-size", "2")
    assert r.returncode == 2
    assert "mpirun -np 2 inferd ... --tensor-parallel-size 2" in r.stderr, r.stderr
    # With a pipeline too: test_tensor_pipeline_parallel.py.


def test_a_rank_that_dies_ends_the_server(tmp_path):
    """Rank 1 killed mid-stream: its collectives' partner is gone, so rank 0's pass would wait for good; rank 0 fails
    the stream with an error, answers /health 503 naming rank 1, then the job exits non-zero with the message."""
    require_model(QWEN)
    seen = mpi_ranks.kill_a_rank_mid_stream(serve(tmp_path, QWEN, 2))
    print(f"exit {seen['exit_code']} after {seen['seconds_to_exit']:.2f} s; /health: {seen['health'][-1]}")
    mpi_ranks.assert_lost_rank_reported(seen)
