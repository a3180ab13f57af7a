"""The graceful drain on SIGTERM (--shutdown-timeout): running streams finish normally while new requests
get 503 with Retry-After and /health reports "draining"; past the timeout, or at a second signal, the rest
end with "abort"; the process always exits (status 0). The same for `inferd router`.
"""
from __future__ import annotations

import json
import signal
import subprocess
import threading
import time

import requests

from conftest import BINARY, MODEL_NAME, free_port, start

STREAMS = 16


def run_stream(base_url: str, max_tokens: int, out: dict, i: int, path: str = "/v1/chat/completions") -> None:
    """One chat stream; records its first-chunk event, finish_reason, content chunks and whether [DONE] came."""
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": f"Story {i}: tell a long tale."}],
            "max_tokens": max_tokens, "ignore_eos": True, "stream": True, "temperature": 0}
    record = out[i]
    try:
        with requests.post(base_url + path, json=body, stream=True, timeout=120) as r:
            record["status"] = r.status_code
            for line in r.iter_lines():
                if not line.startswith(b"data: "):
                    continue
                if line == b"data: [DONE]":
                    record["done"] = True
                    continue
                chunk = json.loads(line[len(b"data: "):])
                record["started"].set()
                for choice in chunk.get("choices", []):
                    if choice.get("delta", {}).get("content"):
                        record["chunks"] += 1
                    if choice.get("finish_reason"):
                        record["finish_reason"] = choice["finish_reason"]
    except requests.RequestException as e:  # recorded, so the test says what went wrong
        record["error"] = repr(e)
    finally:
        record["started"].set()


def start_streams(base_url: str, max_tokens: int, path: str = "/v1/chat/completions"):
    out = {i: {"started": threading.Event(), "chunks": 0, "done": False, "finish_reason": None} for i in range(STREAMS)}
    threads = [threading.Thread(target=run_stream, args=(base_url, max_tokens, out, i, path)) for i in range(STREAMS)]
    for t in threads:
        t.start()
    for i in range(STREAMS):
        assert out[i]["started"].wait(60), f"stream {i} sent nothing"
        assert "error" not in out[i], out[i]
    return out, threads


def check_refused_while_draining(base_url: str) -> None:
    health = requests.get(base_url + "/health", timeout=10)
    assert health.status_code == 503, health.text
    assert health.json() == {"status": "draining"}
    r = requests.post(base_url + "/v1/chat/completions", timeout=10,
                      json={"model": MODEL_NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
    assert r.status_code == 503, r.text
    assert r.headers.get("retry-after") == "1"
    assert r.json()["error"]["code"] == "server_shutting_down"


def test_sigterm_lets_running_streams_finish(tmp_path):
    srv = start(tmp_path, ["--shutdown-timeout", "120", "--max-num-seqs", "32"])
    out, threads = start_streams(srv.base_url, 120)
    srv.process.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    check_refused_while_draining(srv.base_url)
    # The Messages API is refused in its own shape.
    r = requests.post(srv.base_url + "/v1/messages", timeout=10,
                      json={"model": MODEL_NAME, "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]})
    assert r.status_code == 503 and r.json()["error"]["type"] == "overloaded_error", r.text
    assert r.headers.get("retry-after") == "1"
    # What does not enter the engine still answers: the streams show in the metrics.
    metrics = requests.get(srv.base_url + "/metrics", timeout=10)
    assert metrics.status_code == 200
    assert 'inferd:num_requests_running{model_name="smollm2"} 16' in metrics.text
    for t in threads:
        t.join(120)
    for i in range(STREAMS):
        assert out[i].get("status") == 200 and "error" not in out[i], out[i]
        assert out[i]["finish_reason"] == "length", out[i]
        assert out[i]["done"], out[i]
    assert srv.process.wait(timeout=30) == 0
    log = srv.log()
    assert "draining: " in log and "drained: every request finished" in log, log[-3000:]
    assert log.count(" length: prompt ") == STREAMS


def assert_streams_aborted_and_exit(srv, out, threads, signalled_at):
    """Every stream ends with "abort" and the server exits cleanly, soon after the signal."""
    for t in threads:
        t.join(60)
    for i in range(STREAMS):
        assert out[i]["finish_reason"] == "abort" and out[i]["done"], out[i]
    assert srv.process.wait(timeout=30) == 0
    assert time.time() - signalled_at < 20


def test_timeout_aborts_what_is_left(tmp_path):
    srv = start(tmp_path, ["--shutdown-timeout", "1", "--max-num-seqs", "32"])
    out, threads = start_streams(srv.base_url, 1800)
    sent = time.time()
    srv.process.send_signal(signal.SIGTERM)
    assert_streams_aborted_and_exit(srv, out, threads, sent)
    assert "drain timed out after 1 s" in srv.log()


def test_second_signal_ends_at_once(tmp_path):
    srv = start(tmp_path, ["--shutdown-timeout", "600", "--max-num-seqs", "32"])
    out, threads = start_streams(srv.base_url, 1800)
    srv.process.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    check_refused_while_draining(srv.base_url)
    sent = time.time()
    srv.process.send_signal(signal.SIGINT)
    assert_streams_aborted_and_exit(srv, out, threads, sent)
    assert "SIGINT during the drain" in srv.log()


def test_router_drains(tmp_path):
    decode = start(tmp_path, ["--max-num-seqs", "32"])
    port = free_port()
    router = subprocess.Popen([str(BINARY), "router", "--port", str(port), "--decode", decode.base_url,
                               "--shutdown-timeout", "120"],
                              stdout=open(tmp_path / "router.log", "wb"), stderr=subprocess.STDOUT)
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 10
        while True:
            try:
                if requests.get(base_url + "/health", timeout=1).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            assert time.time() < deadline, (tmp_path / "router.log").read_text()
            time.sleep(0.05)
        out, threads = start_streams(base_url, 120)
        router.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        check_refused_while_draining(base_url)
        # The instance behind it is not draining.
        assert requests.get(decode.base_url + "/health", timeout=10).status_code == 200
        for t in threads:
            t.join(120)
        for i in range(STREAMS):
            assert out[i]["finish_reason"] == "length" and out[i]["done"], out[i]
        assert router.wait(timeout=30) == 0
        assert "drained: every request finished" in (tmp_path / "router.log").read_text()
    finally:
        if router.poll() is None:
            router.kill()
        decode.process.send_signal(signal.SIGTERM)
        assert decode.process.wait(timeout=30) == 0
