"""Launching inferd under mpirun for the parallelism tests (test_pipeline_parallel.py,
test_tensor_parallel.py): one server or generate run on N ranks with a parallelism flag, and ending
a served job the way an operator would.

OpenMPI refuses to run as root without OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM), and a 2-core machine has fewer
slots than ranks without --oversubscribe; each rank runs one compute thread unless a test asks otherwise.
"""
from __future__ import annotations

import os
import pathlib
import re
import signal
import subprocess
import time

import pytest

from conftest import BINARY, MODEL_NAME, Server, free_port, wait_until_ready

MPI_ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")


def mpirun(n: int) -> list[str]:
    return ["mpirun", "-np", str(n), "--oversubscribe", "--bind-to", "none"]


def serve(tmp: pathlib.Path, model: pathlib.Path, ranks: int, size_flag: str, *rank_flags: str) -> Server:
    """`inferd serve` on one process, or on `ranks` under mpirun with `size_flag` (--pipeline-parallel-size,
    --tensor-parallel-size) set to it and `rank_flags` (--enable-expert-parallel) added."""
    port = free_port()
    args = [str(BINARY), "serve", "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
            "--served-model-name", MODEL_NAME, "--threads", "1", "--max-model-len", "1024",
            "--kv-cache-memory", "64M", "--shutdown-timeout", "5"]
    if ranks > 1:
        args = mpirun(ranks) + args + [size_flag, str(ranks), *rank_flags]
    log_path = tmp / f"server-{port}.log"
    proc = subprocess.Popen(args, stdout=open(log_path, "wb"), stderr=subprocess.STDOUT, env=MPI_ENV)
    srv = Server(f"http://127.0.0.1:{port}", MODEL_NAME, BINARY, proc, log_path, None, args)
    wait_until_ready(srv, timeout=180)
    return srv


def generate(model: pathlib.Path, ranks: int, *flags: str, threads: int = 1,
             timeout: float = 120) -> subprocess.CompletedProcess:
    """`inferd generate` on one process, or on `ranks` under mpirun (the caller passes the size flags)."""
    args = [str(BINARY), "generate", "-m", str(model), "--threads", str(threads), *flags]
    if ranks > 1:
        args = mpirun(ranks) + args
    return subprocess.run(args, capture_output=True, text=True, env=MPI_ENV, timeout=timeout)


def wait_for_pid(srv: Server, rank: int) -> int:
    """A rank's pid from the log (a rank other than 0 logs it once its part is ready, maybe after rank 0
    serves)."""
    deadline = time.time() + 30
    while time.time() < deadline:
        if m := re.search(rf"rank {rank} \(pid (\d+)\)", srv.log()):
            return int(m.group(1))
        time.sleep(0.1)
    pytest.fail(f"rank {rank} logged no pid:\n{srv.log()[-3000:]}")


def stop_ranks(srv: Server) -> int:
    """SIGTERM to rank 0 (mpirun would end the job at once on a signal): it drains and ends the other ranks."""
    os.kill(wait_for_pid(srv, 0), signal.SIGTERM)
    try:
        return srv.process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        srv.process.kill()
        srv.process.wait()
        pytest.fail(f"the ranks did not end within 60 s of SIGTERM to rank 0:\n{srv.log()[-3000:]}")
