"""`inferd bench latency|throughput` under mpirun (issue 40): `mpirun -np 2 inferd bench ... --tensor-parallel-size 2`
or `--pipeline-parallel-size 2` runs on both ranks, as generate and serve do, and reports its numbers (checked
for being there and positive, never for their size: timings are not asserted). A tensor-parallel run also
reports rank 0's collectives (four all-gathers a layer a step, and the logits gather).

OpenMPI refuses to run as root without OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM), and a 2-core machine has fewer slots
than ranks without --oversubscribe; each rank runs one compute thread.
"""
from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from conftest import BINARY, REPO
from mpi_ranks import MPI_ENV, mpirun

MODEL = REPO / "tests" / "data" / "models" / "tiny-qwen3.gguf"  # 2 KV heads: splits across 2 ranks either way

pytestmark = pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun is missing: scripts/setup.sh installs OpenMPI")

BENCH_ARGS = {
    "latency": ["--input-len", "8", "--output-len", "12", "--num-iters", "2", "--num-iters-warmup", "1"],
    "throughput": ["--num-prompts", "6", "--input-len", "8", "--output-len", "12", "--kv-cache-memory", "64M"],
}


def bench(tmp_path, kind: str, size_flag: str, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / f"{kind}.json"
    args = mpirun(2) + [str(BINARY), "bench", kind, "-m", str(MODEL), "--threads", "1", *BENCH_ARGS[kind],
                        size_flag, "2", "--output-json", str(out), *extra]
    r = subprocess.run(args, capture_output=True, text=True, env=MPI_ENV, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    return r, json.loads(out.read_text())


@pytest.mark.parametrize("size_flag", ["--tensor-parallel-size", "--pipeline-parallel-size"])
def test_bench_latency_on_two_ranks(tmp_path, size_flag):
    r, j = bench(tmp_path, "latency", size_flag)
    layout = "tensor parallel" if "tensor" in size_flag else "pipeline parallel"
    assert f"1 threads on each of 2 ranks ({layout})" in r.stdout, r.stdout
    assert j["decode_tokens_per_second"]["mean"] > 0 and j["ttft_s"]["mean"] > 0
    assert len(j["latencies"]) == 2
    assert j["config"][size_flag[2:].replace("-", "_")] == 2
    if "tensor" in size_flag:
        assert "Collective latency" in r.stdout, r.stdout
        assert j["collectives"]["calls"] > 0 and j["collectives"]["mean_us"] > 0
    else:
        assert "collectives" not in j


@pytest.mark.parametrize("size_flag", ["--tensor-parallel-size", "--pipeline-parallel-size"])
def test_bench_throughput_on_two_ranks(tmp_path, size_flag):
    r, j = bench(tmp_path, "throughput", size_flag)
    assert j["num_requests"] == 6 and j["total_output_tokens"] == 6 * 12, j
    assert j["output_tokens_per_second"] > 0
    assert (j["engine"]["collective_calls"] > 0) == ("tensor" in size_flag), j["engine"]
    # A pipeline steps 512 tokens at a time unless told otherwise (cli/parallel.h says why); TP keeps 2048.
    assert j["config"]["max_num_batched_tokens"] == (2048 if "tensor" in size_flag else 512), j["config"]


def test_a_pipelines_step_budget_is_the_users_when_given(tmp_path):
    _, j = bench(tmp_path, "throughput", "--pipeline-parallel-size", "--max-num-batched-tokens", "2048")
    assert j["config"]["max_num_batched_tokens"] == 2048, j["config"]
    assert j["num_requests"] == 6 and j["total_output_tokens"] == 6 * 12, j
