"""OpenAI's Codex CLI (npm package @openai/codex, `codex exec`, non-interactive)
completes a small coding task against `inferd serve` on Qwen2.5-Coder-1.5B,
driving the Responses API with tool calls: it runs a shell command through its
exec_command tool, gets the command's output back as a function_call_output,
and finishes. The test checks the task's effect on disk, and, through a
recording proxy between Codex and the server, that the server answered with
function calls and that Codex sent their outputs back under the same call ids.

Codex is installed here (npm, into ~/.cache/inferd/npm); the test skips, with
the reason, only when npm cannot install it. Codex sends its tools as it does
to OpenAI: function tools, a `namespace` of sub-agent tools (flattened for the
model) and a hosted web_search tool (left out); its long default instructions
are replaced by a short file (model_instructions_file) to keep the 1.5B
model's prompt, and the test's time, small.
"""
from __future__ import annotations

import http.server
import json
import os
import pathlib
import shutil
import subprocess
import threading

import pytest
import requests

from conftest import MODEL_DIR, MODEL_NAME, start, stop, require_model

QWEN_15B = MODEL_DIR / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
CODEX_VERSION = "0.169.0"
NPM_PREFIX = pathlib.Path(os.environ.get("INFERD_NPM_DIR", pathlib.Path.home() / ".cache" / "inferd" / "npm"))
CODEX = NPM_PREFIX / "node_modules" / ".bin" / "codex"
INSTRUCTIONS = ("You are a coding agent working in the current directory. To act, call the exec_command tool "
                'with a shell command (for example, to list the files: {"cmd": "ls"}). '
                "After the command has run, answer with one short sentence.")
# Spelled out: a 1.5B model left to choose invents a create_file tool; told the
# command, it calls Codex's exec_command with it, which is what is under test.
TASK = "Create hello.txt containing hi by running this shell command with the exec_command tool: echo hi > hello.txt"


def install_codex() -> pathlib.Path:
    """Codex at the pinned version, installed by npm unless it already is."""
    installed = NPM_PREFIX / "node_modules" / "@openai" / "codex" / "package.json"
    if CODEX.exists() and installed.exists() and json.loads(installed.read_text())["version"] == CODEX_VERSION:
        return CODEX
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed, so Codex CLI cannot be installed (scripts/setup.sh installs npm)")
    NPM_PREFIX.mkdir(parents=True, exist_ok=True)
    r = subprocess.run([npm, "install", "--prefix", str(NPM_PREFIX), "--no-audit", "--no-fund",
                        f"@openai/codex@{CODEX_VERSION}"], capture_output=True, text=True, timeout=600)
    if r.returncode != 0 or not CODEX.exists():
        pytest.skip(f"npm could not install @openai/codex@{CODEX_VERSION}: {(r.stderr or r.stdout)[-2000:]}")
    return CODEX


class RecordingProxy:
    """Forwards Codex's requests to the server, streams the answers back, and
    keeps each /v1/responses request body and answer. Codex sends no
    temperature; the proxy adds temperature 0 (greedy) so that the run is the
    same each time, and changes nothing else."""

    def __init__(self, upstream: str):
        self.exchanges: list[tuple[dict, str]] = []
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path.endswith("/responses"):
                    sent = json.loads(body)
                    sent.setdefault("temperature", 0)
                    body = json.dumps(sent).encode()
                headers = {"Content-Type": self.headers.get("Content-Type", "application/json"),
                           "Accept": self.headers.get("Accept", "*/*")}
                with requests.post(upstream + self.path, data=body, headers=headers, stream=True, timeout=600) as r:
                    self.send_response(r.status_code)
                    self.send_header("Content-Type", r.headers.get("Content-Type", "application/json"))
                    self.send_header("Connection", "close")
                    self.end_headers()
                    answer = b""
                    for chunk in r.iter_content(chunk_size=None):
                        answer += chunk
                        self.wfile.write(chunk)
                        self.wfile.flush()
                if self.path.endswith("/responses"):
                    proxy.exchanges.append((json.loads(body), answer.decode("utf-8", "replace")))
                self.close_connection = True

            def do_GET(self):
                with requests.get(upstream + self.path, timeout=30) as r:
                    self.send_response(r.status_code)
                    self.send_header("Content-Type", r.headers.get("Content-Type", "application/json"))
                    self.send_header("Content-Length", str(len(r.content)))
                    self.end_headers()
                    self.wfile.write(r.content)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def sse_items(answer: str) -> list[dict]:
    """The output items an SSE answer finished (response.output_item.done)."""
    items = []
    for line in answer.splitlines():
        if line.startswith("data: "):
            event = json.loads(line[len("data: "):])
            if event.get("type") == "response.output_item.done":
                items.append(event["item"])
    return items


@pytest.fixture(scope="module")
def qwen15(tmp_path_factory):
    require_model(QWEN_15B)
    # Codex's prompt (short instructions, its tool schemas, the skills and
    # environment messages) is about 4,000 tokens; each turn adds a little.
    srv = start(tmp_path_factory.mktemp("codex"), model=QWEN_15B,
                extra_args=["--max-model-len", "16384", "--kv-cache-memory", "1G"])
    yield srv
    assert stop(srv) == 0, srv.log()[-4000:]


def test_codex_exec_completes_a_task_with_tool_calls(qwen15, tmp_path):
    codex = install_codex()
    proxy = RecordingProxy(qwen15.base_url)
    work = tmp_path / "project"
    work.mkdir()
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    home = tmp_path / "codex-home"  # Codex's config and sessions, apart from the user's
    home.mkdir()
    (tmp_path / "instructions.md").write_text(INSTRUCTIONS)
    provider = (f'{{name="inferd", base_url="{proxy.url}/v1", wire_api="responses", '
                'env_key="INFERD_TEST_API_KEY", request_max_retries=0, stream_max_retries=0}')
    args = [str(codex), "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
            "--cd", str(work), "-m", MODEL_NAME,
            "-c", "model_provider=inferd", "-c", f"model_providers.inferd={provider}",
            "-c", f'model_instructions_file="{tmp_path / "instructions.md"}"',
            TASK]
    env = {**os.environ, "CODEX_HOME": str(home), "INFERD_TEST_API_KEY": "unused", "NO_COLOR": "1"}
    try:
        run = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    finally:
        proxy.close()
    transcript = f"codex exit {run.returncode}\nstdout:\n{run.stdout[-4000:]}\nstderr:\n{run.stderr[-4000:]}"
    assert run.returncode == 0, transcript

    # The task's effect.
    hello = work / "hello.txt"
    assert hello.exists(), transcript
    assert hello.read_text().strip() == "hi", transcript

    # The round trip: the server called a function, and Codex answered that call.
    assert proxy.exchanges, transcript
    first_body = proxy.exchanges[0][0]
    tool_types = {t["type"] for t in first_body["tools"]}
    assert {"function", "namespace", "web_search"} <= tool_types, tool_types  # Codex's shapes reached the server
    calls = {item["call_id"]: item for _, answer in proxy.exchanges for item in sse_items(answer)
             if item["type"] == "function_call"}
    assert calls, transcript
    assert all(c["name"] == "exec_command" for c in calls.values()), calls
    outputs = [item for body, _ in proxy.exchanges[1:] for item in body["input"]
               if item.get("type") == "function_call_output"]
    assert outputs, transcript
    assert {o["call_id"] for o in outputs} <= set(calls), (outputs, calls)
    # Codex finished on an answer without another call: a message, or no item at all when the
    # model ends at once (its prompt holds this run's paths and date, so greedy answers vary
    # between runs; one CI run ended so).
    last = sse_items(proxy.exchanges[-1][1])
    assert all(item["type"] == "message" for item in last), proxy.exchanges[-1][1][-2000:]
