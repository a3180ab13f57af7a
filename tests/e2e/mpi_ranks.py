"""Launching inferd under mpirun for the parallelism tests (test_pipeline_parallel.py,
test_tensor_parallel.py, test_expert_parallel.py, test_two_machines.py): one server or generate run on N ranks
with a parallelism flag, and ending a served job the way an operator would.

Ranks run on this host, or (`across=True`, two ranks) on two machines: the two network namespaces of
scripts/netns_hosts.sh, one rank in each, talking by TCP over the veth between them. Where the namespaces cannot
be made (not root, no `ip netns`), two ranks here with `--mca btl tcp,self` over loopback stand in, and
two_machines() says which ran and why.

OpenMPI refuses to run as root without OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM), and a 2-core machine has fewer
slots than ranks without --oversubscribe; each rank runs one compute thread unless a test asks otherwise.
"""
from __future__ import annotations

import functools
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest

from conftest import BINARY, MODEL_NAME, REPO, Server, free_port, wait_until_ready

MPI_ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")


NETNS_HOSTS = REPO / "scripts" / "netns_hosts.sh"
# scripts/netns_hosts.sh's addresses: machine a's end of the link from this host (where rank 0's server
# listens), and the veth that carries the ranks' traffic, on machine a.
MACHINE_A_CLIENT_ADDRESS = "10.77.1.1"
CLUSTER_LINK = ("inferd-a", "inferd-a0")


@functools.cache
def two_machines() -> str | None:
    """None when the two network namespaces are up (made once a session; left up for the next), else why they
    cannot be, for the note that says loopback stood in."""
    if os.geteuid() != 0:
        return "not root: network namespaces need it"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    made = subprocess.run([str(NETNS_HOSTS), "up"], capture_output=True, text=True, timeout=60)
    if made.returncode != 0:
        return f"scripts/netns_hosts.sh up failed: {(made.stdout + made.stderr).strip()[-500:]}"
    return None


def which_ran() -> str:
    """The note on what an `across=True` run was."""
    reason = two_machines()
    if reason is None:
        return "two network namespaces (scripts/netns_hosts.sh), TCP over the veth between them"
    return f"one host, btl tcp,self over loopback (the namespaces could not be made: {reason})"


def cluster_link_bytes() -> int | None:
    """Bytes sent and received on machine a's cluster veth, or None on loopback: what the ranks' traffic crossed."""
    if two_machines() is not None:
        return None
    ns, dev = CLUSTER_LINK
    out = subprocess.run(["ip", "-n", ns, "-j", "-s", "link", "show", "dev", dev], capture_output=True, text=True,
                         check=True)
    counters = json.loads(out.stdout)[0]["stats64"]
    return counters["rx"]["bytes"] + counters["tx"]["bytes"]


def mpirun(n: int, across: bool = False) -> list[str]:
    """The launcher of n ranks on this host, or (across) of one rank on each of two machines."""
    if not across:
        return ["mpirun", "-np", str(n), "--oversubscribe", "--bind-to", "none"]
    assert n == 2, "the two machines hold one rank each"
    if two_machines() is None:
        return [str(NETNS_HOSTS), "mpirun", "-np", "2", "--bind-to", "none"]
    # Loopback stands in: TCP between the ranks still, never shared memory.
    return ["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none", "--mca", "btl", "tcp,self",
            "--mca", "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo"]


def serve(tmp: pathlib.Path, model: pathlib.Path, ranks: int, size_flag: str | None, *rank_flags: str,
          across: bool = False) -> Server:
    """`inferd serve` on one process, or on `ranks` under mpirun with `size_flag` (--pipeline-parallel-size,
    --tensor-parallel-size) set to it and `rank_flags` (--enable-expert-parallel) added; `across`: on two
    machines (mpirun()). With both sizes, size_flag is None and rank_flags carry them."""
    port = free_port()
    host = MACHINE_A_CLIENT_ADDRESS if across and two_machines() is None else "127.0.0.1"
    args = [str(BINARY), "serve", "-m", str(model), "--host", host, "--port", str(port),
            "--served-model-name", MODEL_NAME, "--threads", "1", "--max-model-len", "1024",
            "--kv-cache-memory", "64M", "--shutdown-timeout", "5"]
    if ranks > 1:
        args = mpirun(ranks, across) + args + ([size_flag, str(ranks)] if size_flag else []) + [*rank_flags]
    log_path = tmp / f"server-{port}.log"
    proc = subprocess.Popen(args, stdout=open(log_path, "wb"), stderr=subprocess.STDOUT, env=MPI_ENV)
    srv = Server(f"http://{host}:{port}", MODEL_NAME, BINARY, proc, log_path, None, args)
    wait_until_ready(srv, timeout=180)
    return srv


def generate(model: pathlib.Path, ranks: int, *flags: str, threads: int = 1, timeout: float = 120,
             across: bool = False) -> subprocess.CompletedProcess:
    """`inferd generate` on one process, or on `ranks` under mpirun (the caller passes the size flags)."""
    args = [str(BINARY), "generate", "-m", str(model), "--threads", str(threads), *flags]
    if ranks > 1:
        args = mpirun(ranks, across) + args
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


def kill_a_rank_mid_stream(srv: Server, rank: int = 1) -> dict:
    """Kills `rank` while a long greedy stream and a long whole (non-streamed) request run, and records what clients
    and a balancer see: the stream's end (it must end with an error, not hang), the whole request's answer, /health
    polled every 20 ms until the server is gone, a request sent once /health said 503, and the exit. Returns
    {"stream_error", "whole", "refused", "health", "exit_code", "seconds_to_exit", "log"}."""
    pid = wait_for_pid(srv, rank)
    body = json.dumps({"model": MODEL_NAME, "prompt": "The sea", "max_tokens": 1000, "temperature": 0,
                       "stream": True, "ignore_eos": True}).encode()
    req = urllib.request.Request(srv.base_url + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    resp = urllib.request.urlopen(req, timeout=60)
    first = resp.readline()  # generating
    assert first.startswith(b"data: "), first
    stream = {"lines": [], "ended": False}

    def read_stream():
        try:
            for line in resp:
                stream["lines"].append(line.decode(errors="replace").strip())
        except Exception as e:  # the connection closed under the reader: recorded, not raised
            stream["lines"].append(f"<{type(e).__name__}: {e}>")
        stream["ended"] = True

    def post(payload: dict) -> tuple[int, str]:
        r = urllib.request.Request(srv.base_url + "/v1/completions", data=json.dumps(payload).encode(),
                                   headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(r, timeout=60) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()
        except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
            return 0, f"<{type(e).__name__}: {e}>"

    whole = {}
    whole_body = {"model": MODEL_NAME, "prompt": "The mountains", "max_tokens": 1000, "temperature": 0,
                  "ignore_eos": True}
    waiter = threading.Thread(target=lambda: whole.update(answer=post(whole_body)), daemon=True)
    waiter.start()
    reader = threading.Thread(target=read_stream, daemon=True)
    reader.start()
    time.sleep(0.3)  # the whole request in the engine
    os.kill(pid, signal.SIGKILL)
    start = time.time()
    health, refused = [], None
    while srv.process.poll() is None and time.time() - start < 60:
        try:
            with urllib.request.urlopen(srv.base_url + "/health", timeout=2) as r:
                health.append((r.status, r.read().decode()))
        except urllib.error.HTTPError as e:
            health.append((e.code, e.read().decode()))
            if e.code == 503 and refused is None:
                refused = post(dict(whole_body, max_tokens=4))
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass  # the listener is gone
        time.sleep(0.02)
    if srv.process.poll() is None:
        srv.process.kill()
        srv.process.wait()
        pytest.fail(f"the server did not exit within 60 s of rank {rank}'s death:\n{srv.log()[-3000:]}")
    seconds = time.time() - start
    reader.join(timeout=10)
    waiter.join(timeout=10)
    assert stream["ended"], "the stream hung after the rank died"
    errors = [line for line in stream["lines"] if '"error"' in line]
    return {"stream_error": errors[0] if errors else None, "stream": stream["lines"][-5:],
            "whole": whole.get("answer"), "refused": refused, "health": health,
            "exit_code": srv.process.returncode, "seconds_to_exit": seconds, "log": srv.log()}


def assert_lost_rank_reported(seen: dict, rank: int = 1) -> None:
    """What kill_a_rank_mid_stream saw: the stream ended with an error naming the rank, the whole request got 500
    with it, a request sent after /health said 503 got 503 engine_dead, /health answered 503 with
    {"status": "dead", "dead_rank": rank} before the server went, the job exited non-zero, and rank 0's log says
    which rank ended."""
    assert seen["stream_error"] and f"rank {rank} (pid" in seen["stream_error"], seen["stream"]
    assert seen["whole"] is not None, "the whole request hung after the rank died"
    code, body = seen["whole"]
    assert code == 500 and f"rank {rank} (pid" in json.loads(body)["error"]["message"], seen["whole"]
    if seen["refused"] is not None and seen["refused"][0] != 0:  # sent while the server still listened
        code, body = seen["refused"]
        assert code == 503 and json.loads(body)["error"]["code"] == "engine_dead", seen["refused"]
    dead = [json.loads(b) for code, b in seen["health"] if code == 503]
    assert dead, seen["health"]
    assert dead[-1]["status"] == "dead" and dead[-1]["dead_rank"] == rank, dead[-1]
    assert f"rank {rank} (pid" in dead[-1]["message"], dead[-1]
    assert seen["exit_code"] != 0
    assert re.search(rf"rank {rank} \(pid \d+ on .*\) ended: the model cannot run without it", seen["log"]), \
        seen["log"][-3000:]
    assert "exiting: rank" in seen["log"], seen["log"][-3000:]
