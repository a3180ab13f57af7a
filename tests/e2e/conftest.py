"""End-to-end fixtures: the real `inferd serve` binary on the default model.

`server` is one server shared by the whole session (the default flags, a
2,048-token context); `start_server(...)` starts another with other flags
(API key, tiny limits) for the tests that need them. Every server is stopped
with SIGTERM at teardown, and a clean exit (status 0) is part of the check.
"""
from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

import pytest
import requests

REPO = pathlib.Path(__file__).resolve().parents[2]
BINARY = pathlib.Path(os.environ.get("INFERD_BINARY", REPO / "build" / "inferd"))
MODEL_DIR = pathlib.Path(os.environ.get("INFERD_MODEL_DIR", pathlib.Path.home() / ".cache" / "inferd" / "models"))
DEFAULT_MODEL = MODEL_DIR / "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "smollm2"
MAX_MODEL_LEN = 2048
# The full-size models beside the default one (Gemma 3 270M, Qwen2.5-Coder-0.5B and -1.5B: files over
# 200 MiB) serve for minutes a test on a 2-core machine: CI (scripts/test.sh sets
# INFERD_TEST_LARGE_MODELS=0 unless given --large-models) leaves their tests out.
LARGE_MODEL_BYTES = 200 * 2**20


def require_model(path: pathlib.Path) -> None:
    """Skips the calling test when the model file is missing, or large and left out (above)."""
    if not path.exists():
        pytest.skip(f"{path} is missing (scripts/fetch_models.sh --all)")
    if os.environ.get("INFERD_TEST_LARGE_MODELS") == "0" and path.stat().st_size > LARGE_MODEL_BYTES:
        pytest.skip(f"{path.name} is a large model: INFERD_TEST_LARGE_MODELS=0 leaves it out "
                    "(scripts/test.sh --large-models runs it)")


def port_of(srv) -> int:
    return int(srv.base_url.rsplit(":", 1)[1])


def read_until(s: socket.socket, needle: bytes, limit: float = 30.0) -> bytes:
    """What the socket gives until `needle` arrives, the peer closes or `limit` seconds pass."""
    data, deadline = b"", time.time() + limit
    while needle not in data and time.time() < deadline:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    base_url: str
    model: str
    binary: pathlib.Path
    process: subprocess.Popen
    log_path: pathlib.Path
    api_key: str | None = None
    args: list[str] = field(default_factory=list)

    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def metrics(self) -> dict[str, float]:
        """The /metrics samples as {'name{labels}': value}."""
        text = requests.get(self.base_url + "/metrics", headers=self.headers(), timeout=10).text
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, value = line.rsplit(" ", 1)
                out[key] = float(value)
        return out

    def metric(self, name: str, **labels) -> float:
        """Sum of the samples of `name` whose labels include `labels`."""
        total = 0.0
        for key, value in self.metrics().items():
            base = key.split("{", 1)[0]
            if base != name:
                continue
            if all(f'{k}="{v}"' in key for k, v in labels.items()):
                total += value
        return total

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def start(tmp_dir: pathlib.Path, extra_args: list[str] | None = None, api_key: str | None = None,
          wait_ready: bool = True, model: pathlib.Path = DEFAULT_MODEL) -> Server:
    if not BINARY.exists():
        pytest.fail(f"{BINARY} is missing: build first (scripts/setup.sh)")
    if not model.exists():
        pytest.fail(f"{model} is missing: run scripts/fetch_models.sh --all")
    port = free_port()
    args = [str(BINARY), "serve", "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
            "--served-model-name", MODEL_NAME, "--threads", "2"]
    if "--max-model-len" not in (extra_args or []):
        args += ["--max-model-len", str(MAX_MODEL_LEN)]
    if "--kv-cache-memory" not in (extra_args or []):
        args += ["--kv-cache-memory", "256M"]
    if "--shutdown-timeout" not in (extra_args or []):
        # A request left running at teardown is drained for at most 10 s, within stop()'s 30 s.
        args += ["--shutdown-timeout", "10"]
    if api_key:
        args += ["--api-key", api_key]
    args += extra_args or []
    log_path = tmp_dir / f"server-{port}.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    srv = Server(f"http://127.0.0.1:{port}", MODEL_NAME, BINARY, proc, log_path, api_key, args)
    if wait_ready:
        wait_until_ready(srv)
    return srv


def wait_until_ready(srv: Server, timeout: float = 120.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if srv.process.poll() is not None:
            pytest.fail(f"inferd serve exited with {srv.process.returncode}:\n{srv.log()}")
        try:
            if requests.get(srv.base_url + "/health", timeout=2).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        time.sleep(0.1)
    pytest.fail(f"inferd serve was not ready within {timeout} s:\n{srv.log()}")


def stop(srv: Server) -> int:
    if srv.process.poll() is None:
        srv.process.send_signal(signal.SIGTERM)
        try:
            srv.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            srv.process.kill()
            srv.process.wait()
            pytest.fail(f"inferd serve did not exit within 30 s of SIGTERM:\n{srv.log()[-4000:]}")
    return srv.process.returncode


LM_EVAL_TASKS = REPO / "tests" / "e2e" / "lm_eval"


def run_lm_eval(srv: Server, out: pathlib.Path) -> tuple[dict, dict]:
    """lm-evaluation-harness's local-completions against `srv` on the tasks of tests/e2e/lm_eval/ (offline,
    the server's tokenizer): the results per task, and the logged samples per task."""
    env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    model_args = (f"base_url={srv.base_url}/v1/completions,model={srv.model},tokenizer_backend=remote,"
                  "tokenized_requests=True,num_concurrent=1,max_retries=1,max_length=2048")
    cmd = [sys.executable, "-m", "lm_eval", "--model", "local-completions", "--model_args", model_args,
           "--tasks", "inferd_mc,inferd_ppl", "--include_path", str(LM_EVAL_TASKS), "--output_path", str(out),
           "--log_samples", "--batch_size", "1"]
    # The tasks name their data files relative to their folder.
    proc = subprocess.run(cmd, cwd=LM_EVAL_TASKS, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    results = next(out.rglob("results_*.json"))
    samples = {p.name.split("samples_")[1].rsplit("_", 1)[0]: [json.loads(line) for line in p.open()]
               for p in out.rglob("samples_*.jsonl")}
    return json.loads(results.read_text())["results"], samples


@pytest.fixture(scope="session")
def model_path() -> pathlib.Path:
    return DEFAULT_MODEL


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    srv = start(tmp_path_factory.mktemp("server"))
    yield srv
    code = stop(srv)
    assert code == 0, f"inferd serve exited with {code} after SIGTERM:\n{srv.log()[-4000:]}"


@pytest.fixture
def start_server(tmp_path):
    """Starts extra servers with other flags; stops them after the test."""
    started = []

    def _start(*extra_args: str, api_key: str | None = None, wait_ready: bool = True) -> Server:
        srv = start(tmp_path, list(extra_args), api_key, wait_ready)
        started.append(srv)
        return srv

    yield _start
    for srv in started:
        code = stop(srv)
        assert code == 0, f"inferd serve exited with {code} after SIGTERM:\n{srv.log()[-4000:]}"


# ---- tool definitions shared by the tool-calling tests ----------------------------

WEATHER_DESCRIPTION = "Get the current weather in a city."
CITY_ENUM = {"type": "string", "enum": ["Paris", "Oslo", "Tokyo"]}
UNIT_ENUM = {"type": "string", "enum": ["celsius", "fahrenheit"]}
ZONE_ENUM = {"type": "string", "enum": ["UTC", "CET"]}


def function_tool(name: str, properties: dict, required: list[str], description: str | None = None,
                  closed: bool = False) -> dict:
    """An OpenAI tool: a function of an object (no description where None; no other properties where closed)."""
    function: dict = {"name": name}
    if description is not None:
        function["description"] = description
    parameters = {"type": "object", "properties": properties, "required": required}
    if closed:
        parameters["additionalProperties"] = False
    function["parameters"] = parameters
    return {"type": "function", "function": function}


def weather_tool(properties: dict | None = None, required: list[str] | None = None) -> dict:
    """get_weather: by default a city of three and an optional unit, both enums (a random model left free in a
    string would write until max_tokens)."""
    return function_tool("get_weather", properties or {"city": CITY_ENUM, "unit": UNIT_ENUM}, required or ["city"],
                         WEATHER_DESCRIPTION)


def tool_schemas(*tools: dict) -> dict[str, dict]:
    """The tools' parameter schemas by name."""
    return {t["function"]["name"]: t["function"]["parameters"] for t in tools}
