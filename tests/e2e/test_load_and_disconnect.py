"""Clients that vanish mid-stream free everything at once; hundreds of
simultaneous streams all complete, and the server's metrics agree with what
the clients saw. Bounded in time and traffic, loopback only."""
from __future__ import annotations

import asyncio
import json
import select
import socket
import struct
import time

import openai
import pytest
import requests

from conftest import port_of, read_until


def open_stream(srv, prompt: str, max_tokens: int) -> socket.socket:
    body = json.dumps({"model": srv.model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
                       "stream": True}).encode()
    s = socket.create_connection(("127.0.0.1", port_of(srv)), timeout=30)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    return s


def streams_started(sockets: list[socket.socket], count: int, limit: float = 60.0) -> set[int]:
    """Indices of the first `count` sockets to send an SSE data line, waiting at most `limit` seconds."""
    seen: dict[int, bytes] = {i: b"" for i in range(len(sockets))}
    started: set[int] = set()
    deadline = time.time() + limit
    while len(started) < count and time.time() < deadline:
        waiting = [sockets[i] for i in seen if i not in started]
        readable, _, _ = select.select(waiting, [], [], max(0.0, deadline - time.time()))
        for s in readable:
            i = sockets.index(s)
            chunk = s.recv(65536)
            assert chunk, f"stream {i} closed before its first token: {seen[i]!r}"
            seen[i] += chunk
            if b"data: {" in seen[i]:
                started.add(i)
    return started


def baseline(srv):
    return srv.metric("inferd:kv_cache_usage_perc"), srv.metric("inferd:num_requests_running")


def test_killed_streaming_clients_free_their_blocks_within_a_second(start_server):
    # Four run at once, so most of the twenty are still queued when killed.
    srv = start_server("--max-num-seqs", "4")
    kv0, running0 = baseline(srv)
    assert running0 == 0
    sockets = []
    for i in range(20):
        sockets.append(open_stream(srv, f"Client {i} asks for a very long story about the sea.", 2000))
    # Four are decoding: wait until four streams have sent tokens. Which four is
    # not fixed: the requests are parsed on a worker pool, so they may reach the
    # engine in another order than the connections were opened.
    assert len(streams_started(sockets, 4)) == 4
    assert srv.metric("inferd:num_requests_running") == 4
    assert srv.metric("inferd:kv_cache_usage_perc") > kv0
    for i, s in enumerate(sockets):
        if i % 2:  # half reset the connection, half close it politely
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
    killed = time.time()
    while time.time() - killed < 1.0:
        if baseline(srv) == (kv0, running0) and srv.metric("inferd:num_requests_waiting") == 0:
            break
        time.sleep(0.02)
    assert baseline(srv) == (kv0, running0), f"not back to baseline 1 s after the disconnects: {baseline(srv)}"
    assert srv.metric("inferd:num_requests_waiting") == 0
    assert srv.metric("inferd:request_success_total", finished_reason="abort") == 20
    # Nothing else was disturbed.
    r = requests.post(srv.base_url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 3, "ignore_eos": True},
                   timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3


def test_non_streaming_client_disconnect_aborts(start_server):
    srv = start_server()
    kv0, running0 = baseline(srv)
    body = json.dumps({"prompt": "A long essay:", "max_tokens": 1500, "ignore_eos": True}).encode()
    s = socket.create_connection(("127.0.0.1", port_of(srv)), timeout=30)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + str(len(body)).encode() +
              b"\r\n\r\n" + body)
    deadline = time.time() + 10
    while srv.metric("inferd:num_requests_running") < 1 and time.time() < deadline:
        time.sleep(0.02)
    s.close()
    killed = time.time()
    while baseline(srv) != (kv0, running0) and time.time() - killed < 1.0:
        time.sleep(0.02)
    assert baseline(srv) == (kv0, running0)
    assert srv.metric("inferd:request_success_total", finished_reason="abort") == 1


CLIENTS = 512
TOKENS = 8


def test_hundreds_of_concurrent_streams_complete_and_metrics_agree(server):
    before = server.metrics()

    async def one(client: openai.AsyncOpenAI, i: int):
        stream = await client.completions.create(
            model=server.model, prompt=f"Request {i}: write a word.", max_tokens=TOKENS, temperature=0.7, seed=i,
            stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        text, chunks, usage = "", 0, None
        async for chunk in stream:
            if chunk.usage:
                usage = chunk.usage
            for c in chunk.choices:
                text += c.text
                chunks += 1
        return text, chunks, usage

    async def run_all():
        # The client's default pool allows 1,000 connections: every stream gets its own.
        async with openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0,
                                      timeout=120) as client:
            return await asyncio.wait_for(asyncio.gather(*(one(client, i) for i in range(CLIENTS))), timeout=60)

    started = time.time()
    results = asyncio.run(run_all())
    elapsed = time.time() - started
    assert len(results) == CLIENTS
    for text, chunks, usage in results:
        assert usage is not None and usage.completion_tokens == TOKENS
        assert 1 <= chunks <= TOKENS
    after = server.metrics()

    def delta(name, **labels):
        def total(m):
            return sum(v for k, v in m.items() if k.split("{", 1)[0] == name
                       and all(f'{lk}="{lv}"' in k for lk, lv in labels.items()))
        return total(after) - total(before)

    assert delta("inferd:request_success_total", finished_reason="length") == CLIENTS
    assert delta("inferd:generation_tokens_total") == CLIENTS * TOKENS
    assert delta("inferd:prompt_tokens_total") == sum(u.prompt_tokens for _, _, u in results)
    assert delta("inferd:time_to_first_token_seconds_count") == CLIENTS
    assert delta("inferd:e2e_request_latency_seconds_count") == CLIENTS
    assert delta("inferd:inter_token_latency_seconds_count") == CLIENTS * (TOKENS - 1)
    assert after['inferd:num_requests_running{model_name="smollm2"}'] == 0
    print(f"{CLIENTS} streams x {TOKENS} tokens in {elapsed:.1f} s")


def test_sigterm_ends_open_streams_cleanly(start_server, tmp_path):
    """Shutdown without a drain (--shutdown-timeout 0): running streams get their last chunk, "abort", and
    [DONE], the process exits 0."""
    import signal
    srv = start_server("--log-prompts", "--shutdown-timeout", "0")
    sockets = [open_stream(srv, f"Stream {i} tells a long tale.", 1500) for i in range(3)]
    for s in sockets:
        assert b"data: {" in read_until(s, b"data: {")
    srv.process.send_signal(signal.SIGTERM)
    for s in sockets:
        tail = read_until(s, b"data: [DONE]", limit=10)
        assert b"data: [DONE]" in tail
        assert b'"finish_reason":"abort"' in tail
        s.close()
    assert srv.process.wait(timeout=10) == 0
    log = srv.log()
    # One line per finished request, with the prompt only because --log-prompts asked for it.
    assert log.count(" abort: prompt ") == 3
    assert "Stream 1 tells a long tale." in log


def test_chat_template_override(start_server, tmp_path):
    template = tmp_path / "plain.jinja"
    template.write_text("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
                        "{% if add_generation_prompt %}[assistant] {% endif %}")
    srv = start_server("--chat-template", str(template))
    r = requests.post(srv.base_url + "/tokenize", timeout=30,
                      json={"messages": [{"role": "user", "content": "Hi"}]}).json()
    text = requests.post(srv.base_url + "/detokenize", json={"tokens": r["tokens"]}, timeout=30).json()["prompt"]
    assert text == "[user] Hi\n[assistant] "
