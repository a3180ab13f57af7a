"""Expert parallelism under mpirun (issue 40, item 5):
`mpirun -np T inferd serve|generate --tensor-parallel-size T --enable-expert-parallel`.

Attention is tensor-parallel as without the flag; each rank holds 1/T of every MoE layer's experts (whole
experts) and the router whole, so every rank routes every token as one process does, computes its experts' routed
rows, and the rows are all-gathered before each token's experts are summed in one process's order; a shared
expert and leading dense layers are split by rows like a dense FFN (src/model/tensor_shard.h, docs/design.md,
expert parallelism). Checked here on tiny-qwen3moe (16 experts, 2 KV heads) and tiny-glm4moe (16 experts, a
shared expert, 2 leading dense layers, sigmoid gating with a selection bias):
- greedy 64-token continuations of 20 prompts sent at once (odd ones streamed) are one process's bit for bit:
  tokens and every chosen token's logprob;
- within the topology, requests batched with others equal each one alone;
- a mixture without the flag, and the flag without tensor parallelism, are refused naming the rule.
"""
from __future__ import annotations

import json
import re
import shutil
import urllib.request

import pytest

from conftest import stop
import mpi_ranks
from mpi_ranks import generate, stop_ranks
from test_tensor_parallel import PROMPTS, TINY, alone, assert_same_continuations, at_once

pytestmark = pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun is missing: scripts/setup.sh installs OpenMPI")


@pytest.mark.parametrize("name", ["tiny-qwen3moe", "tiny-glm4moe"])
def test_two_expert_parallel_ranks_are_one_process_bit_for_bit(tmp_path, name):
    model = TINY / f"{name}.gguf"
    one = mpi_ranks.serve(tmp_path, model, 1, "--tensor-parallel-size")
    try:
        expected = alone(one, PROMPTS)
    finally:
        assert stop(one) == 0, one.log()[-3000:]
    two = mpi_ranks.serve(tmp_path, model, 2, "--tensor-parallel-size", "--enable-expert-parallel")
    try:
        got = at_once(two)
        few = alone(two, PROMPTS[:2]) + alone(two, PROMPTS[2:4], stream=True)
        metrics = urllib.request.urlopen(two.base_url + "/metrics", timeout=30).read().decode()
    finally:
        code = stop_ranks(two)
    log = two.log()
    assert code == 0, log[-3000:]
    assert re.search(r"rank 1 of 2 \(expert parallel\): experts \[8, 16\) of 16", log), log[-3000:]
    # The experts' gathers are counted with the other collectives.
    assert re.search(r"^inferd:tensor_parallel_collectives_total\{[^}]*\} [1-9]", metrics, re.M), metrics
    assert_same_continuations(name, expected, got)
    for prompt, a, t in zip(PROMPTS, few, got):
        assert t == a, prompt


def test_generate_with_two_expert_parallel_ranks_matches_one_process():
    """generate --json, two compute threads a rank (one gathers while the other waits at the barrier)."""
    path = TINY / "tiny-qwen3moe.gguf"
    common = ["-p", "Once upon a time", "-n", "24", "--ignore-eos", "--json", "--temp", "0"]
    one = generate(path, 1, *common, threads=2)
    assert one.returncode == 0, one.stderr
    two = generate(path, 2, *common, "--tensor-parallel-size", "2", "--enable-expert-parallel", threads=2)
    assert two.returncode == 0, two.stdout + two.stderr
    result = next(line for line in two.stdout.splitlines() if line.startswith("{"))
    assert json.loads(result)["ids"] == json.loads(one.stdout)["ids"]


def test_mixture_without_the_flag_is_refused_naming_it():
    r = generate(TINY / "tiny-qwen3moe.gguf", 2, "-p", "hi", "--tensor-parallel-size", "2")
    assert r.returncode != 0
    assert "split across ranks by its experts: add --enable-expert-parallel" in r.stderr, r.stdout + r.stderr


def test_the_flag_without_tensor_parallelism_is_refused():
    r = generate(TINY / "tiny-qwen3moe.gguf", 1, "-p", "hi", "--enable-expert-parallel")
    assert r.returncode == 2
    assert "--enable-expert-parallel divides the experts among the tensor-parallel ranks" in r.stderr, r.stderr
    r = generate(TINY / "tiny-qwen3moe.gguf", 2, "-p", "hi", "--pipeline-parallel-size", "2",
                 "--enable-expert-parallel")
    assert r.returncode == 2
    assert "--enable-expert-parallel" in r.stderr and "no pipeline" in r.stderr, r.stderr
