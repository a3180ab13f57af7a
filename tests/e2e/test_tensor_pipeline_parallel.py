"""Tensor x pipeline parallelism (issue 40): `mpirun -np T*P inferd serve|generate --tensor-parallel-size T
--pipeline-parallel-size P`.

Stage s is ranks [s*T, s*T + T) (vLLM's order, src/distributed/rank_layout.h); each stage's T ranks hold tensor
shards of its layers and gather among themselves, and the stages' leaders pass the step and the residual stream on
as a pipeline does (docs/design.md, tensor x pipeline). Each part is one process's arithmetic, so the whole is too:
- 32 concurrent mixed requests (greedy and seeded, completions and chat, streamed and not, logprobs) equal one
  process's bit for bit at 2 x 2 (4 ranks) on Qwen2.5-Coder-0.5B (2 KV heads) and at 3 x 2 (6 ranks) on the
  default model, SmolLM2-135M (3 KV heads: T = 2 cannot split it; T = 3 can);
- generate, greedy and seeded, on tiny-qwen3 (2 KV heads, 2 layers) at 2 x 2;
- sizes that cannot run are refused naming the rule; a rank that dies ends the server with its name.

4 or 6 ranks on this 2-core machine are oversubscribed (one compute thread each): a check of correctness, not
of speed.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from conftest import BINARY, DEFAULT_MODEL, MODEL_DIR, REPO, Server, stop, require_model
import mpi_ranks
from mpi_ranks import MPI_ENV, mpirun, stop_ranks
from test_pipeline_parallel import request_specs, run_all

TINY = REPO / "tests" / "data" / "models"
QWEN = MODEL_DIR / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"

pytestmark = pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun is missing: scripts/setup.sh installs OpenMPI")


def sizes(t: int, p: int) -> list[str]:
    return ["--tensor-parallel-size", str(t), "--pipeline-parallel-size", str(p)]


def serve(tmp, model, t: int, p: int) -> Server:
    return mpi_ranks.serve(tmp, model, t * p, None, *sizes(t, p))


@pytest.mark.parametrize("model,t,p", [(QWEN, 2, 2), (DEFAULT_MODEL, 3, 2)], ids=["qwen2.5-coder-0.5b-2x2",
                                                                                  "smollm2-135m-3x2"])
def test_tensor_x_pipeline_serves_what_one_process_serves(tmp_path, model, t, p):
    require_model(model)
    one = mpi_ranks.serve(tmp_path, model, 1, None)
    try:
        expected = run_all(one)
    finally:
        assert stop(one) == 0, one.log()[-3000:]
    split = serve(tmp_path, model, t, p)
    try:
        got = run_all(split)
    finally:
        code = stop_ranks(split)
    log = split.log()
    assert code == 0, log[-3000:]
    # The last rank is the last shard of the last stage, fed by its stage's leader.
    last = t * p - 1
    assert re.search(rf"rank {last} \(pid \d+\): tensor-parallel rank {t - 1} of stage {p - 1} \(layers \[\d+, \d+\)\)",
                     log), log[-3000:]
    assert re.search(rf"rank {t} \(pid \d+\): pipeline stage of layers \[\d+, \d+\), tensor-parallel leader", log), \
        log[-3000:]
    assert all(e["text"] for e in expected)
    differ = [(spec, e, g) for spec, e, g in zip(request_specs(), expected, got) if e != g]
    print(f"{model.name} at {t} x {p}: {len(expected) - len(differ)} of {len(expected)} mixed requests identical "
          "to one process's")
    assert not differ, differ


def generate(ranks: int, *flags: str) -> subprocess.CompletedProcess:
    return mpi_ranks.generate(TINY / "tiny-qwen3.gguf", ranks, *flags)


def test_generate_two_by_two_matches_one_process():
    """generate --json, greedy and seeded: the last stage's leader samples from its stage's gathered logits."""
    for flags in (["--temp", "0"], ["--temp", "1.0", "--seed", "7", "--top-k", "0", "--top-p", "1", "--min-p", "0"]):
        common = ["-p", "Once upon a time", "-n", "24", "--ignore-eos", "--json", *flags]
        one = generate(1, *common)
        assert one.returncode == 0, one.stderr
        split = generate(4, *common, *sizes(2, 2))
        assert split.returncode == 0, split.stdout + split.stderr
        # The other ranks' shutdown lines (collectives' latency) may come after the result.
        result = next(line for line in split.stdout.splitlines() if line.startswith("{"))
        assert json.loads(result)["ids"] == json.loads(one.stdout)["ids"], flags


def test_bad_sizes_are_refused_naming_the_rule():
    # The process count must be T x P.
    r = generate(3, "-p", "hi", "-n", "1", *sizes(2, 2))
    assert r.returncode != 0
    assert "mpirun started 3 processes, but a model split 2 (--tensor-parallel-size) x 2" in r.stderr, r.stderr
    assert "must equal tensor x pipeline parallel size" in r.stderr, r.stderr
    # Without mpirun: the command that would start them.
    r = generate(1, "-p", "hi", "-n", "1", *sizes(2, 2))
    assert r.returncode == 2
    assert "mpirun -np 4 inferd ... --tensor-parallel-size 2 --pipeline-parallel-size 2" in r.stderr, r.stderr
    # More stages than layers (tiny-qwen3 has 2).
    r = generate(6, "-p", "hi", "-n", "1", *sizes(2, 3))
    assert r.returncode != 0
    assert "a pipeline of 3 stages needs at least 3 layers" in r.stdout + r.stderr, r.stdout + r.stderr
    # Expert parallelism stays without a pipeline.
    r = generate(4, "-p", "hi", "-n", "1", *sizes(2, 2), "--enable-expert-parallel")
    assert r.returncode != 0
    assert "--enable-expert-parallel does not run with --pipeline-parallel-size 2" in r.stderr, r.stderr


def test_kv_heads_not_divisible_are_refused():
    """SmolLM2-135M has 3 KV heads: 2 shards a stage cannot hold whole heads each."""
    require_model(DEFAULT_MODEL)
    r = mpi_ranks.generate(DEFAULT_MODEL, 4, "-p", "hi", "-n", "1", *sizes(2, 2))
    assert r.returncode != 0
    assert "must divide the model's 3 KV heads" in r.stdout + r.stderr, r.stdout + r.stderr


def test_a_rank_that_dies_ends_the_server(tmp_path):
    """Rank 3 (the last stage's peer: rank 0 exchanges nothing with it directly) killed mid-stream: rank 0's
    watch of every rank's process fails the stream naming it, answers /health 503, and the job exits non-zero."""
    require_model(QWEN)
    seen = mpi_ranks.kill_a_rank_mid_stream(serve(tmp_path, QWEN, 2, 2), rank=3)
    print(f"exit {seen['exit_code']} after {seen['seconds_to_exit']:.2f} s; /health: {seen['health'][-1]}")
    mpi_ranks.assert_lost_rank_reported(seen, rank=3)
