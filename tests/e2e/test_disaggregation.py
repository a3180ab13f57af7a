"""Prefill/decode disaggregation: `inferd router` in front of a kv_producer
and a kv_consumer instance, all on loopback, against one plain instance.

The decode instance pulls each prompt's KV blocks from the prefill instance
over UCX (inferd:kv_transfer_received_prompts_total) and gives the same
greedy answers as one instance, streamed and whole, on both endpoints. The
faults: a producer killed mid-run, gone before the pull, or whose lease has
expired makes the decode instance compute the prompt
(inferd:kv_transfer_recomputed_prompts_total), with the same answer; the
producer frees what it held; no decode instance is a prompt 503.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from conftest import BINARY, MODEL_NAME, free_port, start, stop

SENTENCES = [
    "The river bends twice before it reaches the old mill.",
    "Quantum computers use qubits that can hold superpositions.",
    "A good bread needs flour, water, salt, yeast and patience.",
    "The committee met on Tuesday to discuss the budget.",
]


def prompt(i: int) -> str:
    # Lengths from one sentence to about 600 tokens, and a shared opening (a prefix the router can see).
    body = " ".join(SENTENCES[(i + k) % len(SENTENCES)] for k in range(1 + (i * 7) % 48))
    return f"Read this and continue it. {body}"


def request_of(i: int) -> tuple[str, dict]:
    chat, stream = i % 2 == 1, (i // 2) % 2 == 1
    body = {"model": MODEL_NAME, "max_tokens": 12, "temperature": 0, "stream": stream}
    if chat:
        body["messages"] = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": prompt(i)}]
        return "/v1/chat/completions", body
    body["prompt"] = prompt(i)
    return "/v1/completions", body


def answer(base_url: str, path: str, body: dict) -> tuple[str, str, int]:
    """(text, finish_reason, completion tokens) of a request, streamed or not."""
    chat = path.endswith("chat/completions")
    if not body["stream"]:
        r = requests.post(base_url + path, json=body, timeout=120)
        assert r.status_code == 200, r.text
        c = r.json()["choices"][0]
        return (c["message"]["content"] if chat else c["text"]), c["finish_reason"], r.json()["usage"]["completion_tokens"]
    body = dict(body, stream_options={"include_usage": True})
    text, finish, tokens = "", None, None
    with requests.post(base_url + path, json=body, stream=True, timeout=120) as r:
        assert r.status_code == 200, r.text
        assert r.headers["content-type"].startswith("text/event-stream")
        done = False
        for line in r.iter_lines():
            if not line.startswith(b"data: "):
                continue
            data = line[6:]
            if data == b"[DONE]":
                done = True
                break
            event = json.loads(data)
            assert "error" not in event, event
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
            for c in event["choices"]:
                text += (c["delta"].get("content") or "") if chat else c["text"]
                finish = c["finish_reason"] or finish
        assert done, f"the stream ended without [DONE] after {text!r}"
    return text, finish, tokens


def producer_config(**extra) -> str:
    """A kv_producer's --kv-transfer-config on a free port of its own."""
    return json.dumps({"kv_role": "kv_producer", "kv_port": free_port(), **extra})


def wait_metric(srv, name: str, want, timeout: float = 10.0) -> float:
    """The metric once want(value) holds (or the last value after `timeout`)."""
    deadline = time.time() + timeout
    while True:
        v = srv.metric(name)
        if want(v) or time.time() > deadline:
            return v
        time.sleep(0.05)


def run_all(base_url: str, indexes) -> dict[int, tuple]:
    with ThreadPoolExecutor(max_workers=32) as pool:
        futures = {i: pool.submit(answer, base_url, *request_of(i)) for i in indexes}
        return {i: f.result() for i, f in futures.items()}


class Router:
    def __init__(self, tmp_path, prefill: list[str], decode: list[str], *extra: str):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp_path / f"router-{self.port}.log"
        args = [str(BINARY), "router", "--port", str(self.port), "--decode", *decode, *extra]
        self.headers = {"Authorization": f"Bearer {extra[extra.index('--api-key') + 1]}"} if "--api-key" in extra else {}
        if prefill:
            args += ["--prefill", *prefill]
        self.process = subprocess.Popen(args, stdout=open(self.log_path, "wb"), stderr=subprocess.STDOUT)
        deadline = time.time() + 10
        while time.time() < deadline:
            assert self.process.poll() is None, self.log_path.read_text()
            try:
                requests.get(self.base_url + "/metrics", timeout=1)
                return
            except requests.ConnectionError:
                time.sleep(0.05)
        pytest.fail("the router did not listen within 10 s")

    def metric(self, name: str, **labels) -> float:
        total = 0.0
        for line in requests.get(self.base_url + "/metrics", headers=self.headers, timeout=10).text.splitlines():
            if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=10)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("disagg")
    single = start(tmp)
    prefill = start(tmp, ["--kv-transfer-config", producer_config()])
    decode = start(tmp, ["--kv-transfer-config", '{"kv_role": "kv_consumer", "kv_connector": "NixlConnector"}'])
    router = Router(tmp, [prefill.base_url], [decode.base_url])
    reference = run_all(single.base_url, range(32))
    yield single, prefill, decode, router, reference
    assert router.stop() == 0, router.log_path.read_text()
    for srv in (single, prefill, decode):
        assert stop(srv) == 0, srv.log()[-4000:]


def test_router_answers_as_one_instance(deployment):
    single, prefill, decode, router, reference = deployment
    recomputed = decode.metric("inferd:kv_transfer_recomputed_prompts_total")
    received = decode.metric("inferd:kv_transfer_received_prompts_total")
    unused = decode.metric("inferd:kv_transfer_unused_prompts_total")
    blocks = decode.metric("inferd:kv_transfer_received_blocks_total")
    produced = prefill.metric("inferd:kv_transfer_produced_prompts_total")
    released = prefill.metric("inferd:kv_transfer_leases_released_total")
    expired = prefill.metric("inferd:kv_transfer_leases_expired_total")
    given_back = decode.metric("inferd:kv_transfer_unused_leases_released_total")
    assert run_all(router.base_url, range(32)) == reference
    # Every request went through prefill (with transfer parameters back) and then decode,
    # which pulled the prompt's blocks (or found them in its own cache: a prompt seen before, or a shared
    # opening another request's pull brought in while this one waited for it).
    assert prefill.metric("inferd:kv_transfer_produced_prompts_total") - produced == 32
    assert decode.metric("inferd:kv_transfer_recomputed_prompts_total") - recomputed == 0
    pulled = decode.metric("inferd:kv_transfer_received_prompts_total") - received
    # A prompt counts as unused when its request ends on the decode instance (ServingCore::on_finished), which
    # can come just after the client has its answer: wait for the count instead of reading it once.
    unused_now = wait_metric(decode, "inferd:kv_transfer_unused_prompts_total",
                             lambda v: pulled + v - unused == 32) - unused
    assert pulled >= 8 and pulled + unused_now == 32
    assert decode.metric("inferd:kv_transfer_received_blocks_total") - blocks >= pulled
    assert decode.metric("inferd:kv_transfer_received_bytes_total") > 0
    # Both on this host, with UCX's default transports: the decode instance maps the prefill instance's KV pool
    # (on shared memory) and copies the blocks out of it.
    if "UCX_TLS" not in os.environ:
        assert decode.metric("inferd:kv_transfer_shared_memory_handshakes_total") >= 1
        assert decode.metric("inferd:kv_transfer_mapped_handshakes_total") >= 1
    # The producer held each prompt's blocks until its consumer released them: after the reads, or (unused: the
    # decode pool held the prefix) when the request ended. None is left to expire.
    assert wait_metric(prefill, "inferd:kv_transfer_leases", lambda v: v == 0) == 0
    assert prefill.metric("inferd:kv_transfer_leases_released_total") - released == 32
    assert prefill.metric("inferd:kv_transfer_leases_expired_total") == expired
    assert decode.metric("inferd:kv_transfer_unused_leases_released_total") - given_back == unused_now
    assert router.metric("inferd_router:prefill_fallbacks_total") == 0
    assert router.metric("inferd_router:requests_total", role="prefill") >= 32
    assert router.metric("inferd_router:requests_in_flight") == 0
    # The plain instance ignores the field (as vLLM without a connector).
    assert single.metric("inferd:kv_transfer_recomputed_prompts_total") == 0


def test_producer_answers_with_transfer_params_and_roles_are_checked(deployment):
    single, prefill, decode, router, _ = deployment
    body = {"prompt": "x " * 40, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}}
    params = requests.post(prefill.base_url + "/v1/completions", json=body, timeout=60).json()["kv_transfer_params"]
    assert params["do_remote_prefill"] is True and params["remote_host"] == "127.0.0.1"
    assert params["remote_engine_id"] and params["remote_request_id"].startswith("cmpl-")
    assert len(params["remote_block_keys"]) == 1 and len(params["remote_block_keys"][0]) == 41 // 16
    # The consumer takes those parameters; it does not prefill for others, nor the producer decode for them.
    r = requests.post(decode.base_url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 400 and "kv_consumer" in r.json()["error"]["message"]
    r = requests.post(prefill.base_url + "/v1/completions",
                      json=dict(body, kv_transfer_params=params), timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "kv_transfer_params"
    r = requests.post(decode.base_url + "/v1/completions",
                      json=dict(body, kv_transfer_params=dict(params, remote_port="x")), timeout=60)
    assert r.status_code == 400 and "remote_port" in r.json()["error"]["message"]
    # The router sets the field itself, and relays a 4xx of prefill as is.
    assert requests.post(router.base_url + "/v1/completions", json=body, timeout=60).status_code == 400
    r = requests.post(router.base_url + "/v1/completions", json={"prompt": "hi", "temperature": 7}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "temperature"
    assert requests.get(router.base_url + "/v1/models", timeout=10).json()["data"][0]["id"] == MODEL_NAME


def test_other_choices_of_a_prompt_use_the_first_choices_pull(deployment):
    """n > 1: the first choice pulls the prompt's blocks; the others wait for that pull (or find its blocks
    cached) instead of computing the prompt, and the answers are those of one instance."""
    single, prefill, decode, router, _ = deployment
    body = {"prompt": "Choices of one prompt. " + prompt(40), "max_tokens": 6, "temperature": 0, "n": 3}
    want = requests.post(single.base_url + "/v1/completions", json=body, timeout=120).json()
    hits = decode.metric("inferd:prefix_cache_hits_total")
    recomputed = decode.metric("inferd:kv_transfer_recomputed_prompts_total")
    received = decode.metric("inferd:kv_transfer_received_prompts_total")
    r = requests.post(router.base_url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    got = r.json()
    assert [c["text"] for c in got["choices"]] == [c["text"] for c in want["choices"]]
    assert decode.metric("inferd:kv_transfer_received_prompts_total") - received == 1
    assert decode.metric("inferd:kv_transfer_recomputed_prompts_total") == recomputed
    # Every choice found the pulled blocks: three times the prompt's full blocks.
    full_block_tokens = got["usage"]["prompt_tokens"] // 16 * 16
    assert decode.metric("inferd:prefix_cache_hits_total") - hits >= 3 * full_block_tokens


def test_a_beam_search_pulls_its_prompt_and_returns_one_instances_beams(deployment):
    """The router prefills a beam search's prompt as a plain request; the decode instance's first beam pulls
    its blocks before the beams fork."""
    single, prefill, decode, router, _ = deployment
    body = {"prompt": "Beams of one prompt. " + prompt(41), "max_tokens": 5, "n": 2, "use_beam_search": True}
    want = requests.post(single.base_url + "/v1/completions", json=body, timeout=120).json()
    recomputed = decode.metric("inferd:kv_transfer_recomputed_prompts_total")
    received = decode.metric("inferd:kv_transfer_received_prompts_total")
    produced = prefill.metric("inferd:kv_transfer_produced_prompts_total")
    released = prefill.metric("inferd:kv_transfer_leases_released_total")
    r = requests.post(router.base_url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert [c["text"] for c in r.json()["choices"]] == [c["text"] for c in want["choices"]]
    assert prefill.metric("inferd:kv_transfer_produced_prompts_total") - produced == 1
    assert decode.metric("inferd:kv_transfer_received_prompts_total") - received == 1
    assert decode.metric("inferd:kv_transfer_recomputed_prompts_total") == recomputed
    # The lease was released by the pull, not left to expire (the producer's engine counts it on its next wake).
    assert wait_metric(prefill, "inferd:kv_transfer_leases_released_total", lambda v: v - released >= 1) - released == 1


def test_client_gone_aborts_the_decode_request(deployment):
    _, _, decode, router, _ = deployment
    aborted = decode.metric("inferd:request_success_total", finished_reason="abort")
    body = {"prompt": prompt(3), "max_tokens": 1500, "ignore_eos": True, "temperature": 0, "stream": True}
    with requests.post(router.base_url + "/v1/completions", json=body, stream=True, timeout=60) as r:
        assert r.status_code == 200
        next(line for line in r.iter_lines() if line.startswith(b"data: "))  # decoding has begun
    # The router closed its upstream connection, and the decode instance aborted the request.
    deadline = time.time() + 10
    while decode.metric("inferd:request_success_total", finished_reason="abort") == aborted:
        assert time.time() < deadline, "the decode request was not aborted"
        time.sleep(0.1)
    assert decode.metric("inferd:num_requests_running") == 0
    deadline = time.time() + 5
    while router.metric("inferd_router:requests_in_flight") != 0:
        assert time.time() < deadline
        time.sleep(0.05)


def test_a_decode_instance_with_tiers_pulls_only_what_they_lack(deployment, tmp_path):
    """A consumer with offload tiers and a pool smaller than the workload: the
    first pass pulls the prompts from the producer (and the pool evicts them to
    the host tier); the second finds every prompt again in its own pool or tier
    and pulls nothing. The answers are one instance's throughout."""
    _, prefill, _, _, reference = deployment
    decode = start(tmp_path, ["--kv-transfer-config", '{"kv_role": "kv_consumer"}',
                              "--kv-cache-memory", "24M", "--kv-offload-size", "128M"])
    router = Router(tmp_path, [prefill.base_url], [decode.base_url])
    indexes = list(range(0, 32, 3))  # 11 prompts, 1 to 44 sentences: more than the 24M pool holds
    released = prefill.metric("inferd:kv_transfer_leases_released_total")
    try:
        # One at a time, so that each prompt's blocks are evicted to the tier by the ones after it.
        assert {i: answer(router.base_url, *request_of(i)) for i in indexes} == {i: reference[i] for i in indexes}
        pulled = decode.metric("inferd:kv_transfer_received_prompts_total")
        assert pulled >= 1
        assert decode.metric("inferd:kv_offload_saves_total", tier="host") > 0
        assert {i: answer(router.base_url, *request_of(i)) for i in indexes} == {i: reference[i] for i in indexes}
        assert decode.metric("inferd:kv_transfer_received_prompts_total") == pulled
        assert decode.metric("inferd:kv_offload_hits_total", tier="host") > 0
        assert decode.metric("inferd:external_prefix_cache_hits_total") > 0
        assert decode.metric("inferd:kv_transfer_recomputed_prompts_total") == 0
        assert decode.metric("inferd:kv_offload_dropped_blocks_total") == 0
        # Every lease of the two passes went back: pulled ones after their reads, the rest unused.
        want = released + 2 * len(indexes)
        assert wait_metric(prefill, "inferd:kv_transfer_leases_released_total", lambda v: v >= want) == want
    finally:
        assert router.stop() == 0, router.log_path.read_text()
        assert stop(decode) == 0, decode.log()[-4000:]


def test_prefill_killed_mid_run_falls_back_to_decode(deployment, tmp_path):
    single, _, decode, _, reference = deployment
    prefill = start(tmp_path, ["--kv-transfer-config", producer_config()])
    router = Router(tmp_path, [prefill.base_url], [decode.base_url])
    failed_before = decode.metric("inferd:kv_transfer_recomputed_prompts_total")
    try:
        with ThreadPoolExecutor(max_workers=32) as pool:
            futures = {i: pool.submit(answer, router.base_url, *request_of(i)) for i in range(32)}
            time.sleep(0.3)
            prefill.process.kill()
            prefill.process.wait()
            first = {i: f.result() for i, f in futures.items()}
        after = run_all(router.base_url, range(8))
        assert first == reference
        assert after == {i: reference[i] for i in range(8)}
        # At least the 8 sent after the kill went to decode without parameters.
        assert router.metric("inferd_router:prefill_fallbacks_total") >= 8
        assert router.metric("inferd_router:upstream_errors_total", role="prefill") >= 8
        assert router.metric("inferd_router:requests_in_flight") == 0
        assert decode.metric("inferd:num_requests_running") == 0
        assert decode.metric("inferd:num_requests_waiting") == 0
        print("recomputed after the kill:", decode.metric("inferd:kv_transfer_recomputed_prompts_total") - failed_before)
    finally:
        assert router.stop() == 0, router.log_path.read_text()


def pull_params(prefill, i: int, salt: str) -> tuple[str, dict]:
    """A request of the test set prefilled at the producer: its path and its body for the consumer.
    The cache salt keeps the decode instance's own prefix cache (which saw these prompts) out of it."""
    path, body = request_of(i)
    body = dict(body, stream=False, cache_salt=salt)
    r = requests.post(prefill.base_url + path, timeout=60,
                      json=dict(body, max_tokens=1, kv_transfer_params={"do_remote_decode": True}))
    assert r.status_code == 200, r.text
    params = r.json()["kv_transfer_params"]
    assert params["remote_lease_ids"][0] != "0" * 16 and params["remote_block_ids"][0][0]
    return path, dict(body, kv_transfer_params=params)


def test_a_producer_gone_before_the_pull_makes_decode_recompute(deployment, tmp_path):
    _, _, decode, _, reference = deployment
    prefill = start(tmp_path, ["--kv-transfer-config", producer_config()])
    path, body = pull_params(prefill, 5, "producer-gone")
    prefill.process.kill()
    prefill.process.wait()
    recomputed = decode.metric("inferd:kv_transfer_recomputed_prompts_total")
    started = time.time()
    assert answer(decode.base_url, path, body) == reference[5]
    assert time.time() - started < 10  # a refused connection fails at once, a silent one within the timeout
    assert decode.metric("inferd:kv_transfer_recomputed_prompts_total") - recomputed == 1


def test_an_expired_lease_frees_the_blocks_and_decode_recomputes(deployment, tmp_path):
    _, _, decode, _, reference = deployment
    prefill = start(tmp_path, ["--kv-transfer-config", producer_config(kv_lease_seconds=0.5)])
    try:
        path, body = pull_params(prefill, 6, "lease-expired")
        assert prefill.metric("inferd:kv_transfer_lease_blocks") > 0
        # The lease ends on its own and its blocks are freed: nothing is left held.
        assert wait_metric(prefill, "inferd:kv_transfer_leases_expired_total", lambda v: v == 1) == 1
        assert prefill.metric("inferd:kv_transfer_lease_blocks") == 0
        assert prefill.metric("inferd:kv_cache_usage_perc") == 0
        recomputed = decode.metric("inferd:kv_transfer_recomputed_prompts_total")
        assert answer(decode.base_url, path, body) == reference[6]
        assert decode.metric("inferd:kv_transfer_recomputed_prompts_total") - recomputed == 1
    finally:
        assert stop(prefill) == 0, prefill.log()[-4000:]


def test_a_silent_prefill_instance_times_out_to_decode(deployment, tmp_path):
    _, _, decode, _, reference = deployment
    silent = socket.socket()  # accepts connections (the backlog does) and never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    router = Router(tmp_path, [f"http://127.0.0.1:{silent.getsockname()[1]}"], [decode.base_url],
                    "--prefill-timeout", "0.5")
    try:
        started = time.time()
        assert answer(router.base_url, *request_of(0)) == reference[0]
        assert time.time() - started < 10
        assert router.metric("inferd_router:prefill_fallbacks_total", reason="timeout") == 1
    finally:
        silent.close()
        assert router.stop() == 0, router.log_path.read_text()


def test_no_decode_instance_is_a_prompt_503(tmp_path):
    closed = f"http://127.0.0.1:{free_port()}"
    router = Router(tmp_path, [closed], [closed], "--api-key", "k")
    auth = {"Authorization": "Bearer k"}
    try:
        r = requests.post(router.base_url + "/v1/completions", json={"prompt": "hi"}, timeout=30)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        started = time.time()
        r = requests.post(router.base_url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, headers=auth,
                          timeout=30)
        assert r.status_code == 503 and "decode" in r.json()["error"]["message"]
        assert time.time() - started < 5
        r = requests.post(router.base_url + "/v1/chat/completions", timeout=30, headers=auth,
                          json={"messages": [{"role": "user", "content": "hi"}], "stream": True})
        assert r.status_code == 503
        assert router.metric("inferd_router:prefill_fallbacks_total", reason="unreachable") == 2
    finally:
        assert router.stop() == 0, router.log_path.read_text()
