"""Two ranks on two machines (issue 40, item 6): the README's `mpirun -H a,b -np 2 inferd serve ...`, with two
network namespaces on this host standing for the machines (scripts/netns_hosts.sh). mpirun runs on machine a
with rank 0, starts machine b's daemon and rank 1 through `ip netns exec` (its rsh agent), and the ranks talk by
TCP over the veth between the namespaces; nothing crosses by shared memory. The client reaches rank 0's server
over a link of its own, as a user reaches a server on another machine.

Checked for tensor, pipeline and expert parallelism on tiny models: 20 greedy 64-token continuations sent at
once are one process's bit for bit (tokens and every chosen token's logprob), as the same-host tests check;
each rank ran in its machine's namespace; the ranks' traffic crossed the veth. Where the namespaces cannot be
made (not root, no iproute2), the same checks run on two ranks here with `--mca btl tcp,self` over loopback, and
a warning says so.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import warnings

import pytest

from conftest import stop
import mpi_ranks
from mpi_ranks import generate, stop_ranks, two_machines, wait_for_pid, which_ran
from test_tensor_parallel import PROMPTS, TINY, alone, assert_same_continuations, at_once

pytestmark = pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun is missing: scripts/setup.sh installs OpenMPI")

# name -> (model, size flag, further rank flags, what rank 1 logs of its part)
LAYOUTS = {
    "tensor-parallel": ("tiny-qwen3", "--tensor-parallel-size", (), r"rank 1 of 2 \(tensor parallel\): KV heads"),
    "pipeline-parallel": ("tiny-llama3", "--pipeline-parallel-size", (),
                          r"rank 1 \(pid \d+\): pipeline stage of layers \[1, 2\)"),
    "expert-parallel": ("tiny-qwen3moe", "--tensor-parallel-size", ("--enable-expert-parallel",),
                        r"rank 1 of 2 \(expert parallel\): experts \[8, 16\) of 16"),
}
# Far above what scripts/netns_hosts.sh's own checks send: the ranks' collectives or activations.
LEAST_CLUSTER_TRAFFIC = 64 * 1024


def note_which_ran() -> None:
    print(f"ran on {which_ran()}")
    if two_machines() is not None:
        warnings.warn(f"two machines stood in for by {which_ran()}")


def network_namespace(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/net")


def machine_namespace(name: str) -> str:
    """The network namespace a process started in scripts/netns_hosts.sh's namespace `name` has."""
    return subprocess.run(["ip", "netns", "exec", name, "readlink", "/proc/self/ns/net"], capture_output=True,
                          text=True, check=True).stdout.strip()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_two_machines_serve_what_one_process_serves(tmp_path, layout):
    model_name, size_flag, rank_flags, rank_1_part = LAYOUTS[layout]
    model = TINY / f"{model_name}.gguf"
    one = mpi_ranks.serve(tmp_path, model, 1, size_flag)
    try:
        expected = alone(one, PROMPTS)
    finally:
        assert stop(one) == 0, one.log()[-3000:]
    note_which_ran()
    traffic_before = mpi_ranks.cluster_link_bytes()
    two = mpi_ranks.serve(tmp_path, model, 2, size_flag, *rank_flags, across=True)
    try:
        namespaces = [network_namespace(wait_for_pid(two, rank)) for rank in (0, 1)]
        got = at_once(two)
        few = alone(two, PROMPTS[:2], stream=True)
    finally:
        code = stop_ranks(two)
    log = two.log()
    assert code == 0, log[-3000:]
    assert re.search(rank_1_part, log), log[-3000:]
    if two_machines() is None:
        assert namespaces == [machine_namespace("inferd-a"), machine_namespace("inferd-b")], namespaces
        traffic = mpi_ranks.cluster_link_bytes() - traffic_before
        print(f"{traffic} bytes crossed the veth between the machines")
        assert traffic >= LEAST_CLUSTER_TRAFFIC, traffic
    assert_same_continuations(f"{model_name}, {layout}", expected, got)
    for prompt, a, t in zip(PROMPTS, few, got):
        assert t == a, prompt


def test_generate_on_two_machines_matches_one_process():
    """generate --json with seeded sampling, tensor-parallel, two compute threads a rank."""
    path = TINY / "tiny-qwen3.gguf"
    common = ["-p", "Once upon a time", "-n", "24", "--ignore-eos", "--json", "--temp", "1.0", "--seed", "7"]
    one = generate(path, 1, *common, threads=2)
    assert one.returncode == 0, one.stderr
    note_which_ran()
    two = generate(path, 2, *common, "--tensor-parallel-size", "2", threads=2, across=True)
    assert two.returncode == 0, two.stdout + two.stderr
    result = next(line for line in two.stdout.splitlines() if line.startswith("{"))
    assert json.loads(result)["ids"] == json.loads(one.stdout)["ids"]
