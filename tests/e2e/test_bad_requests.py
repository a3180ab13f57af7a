"""Every kind of bad request gets its exact status and an OpenAI-shaped error
body, and right after each the server still answers /health and a normal
request: bad input never costs anyone else anything."""
from __future__ import annotations

import json
import socket
import threading
import time

import pytest
import requests

from conftest import MAX_MODEL_LEN


def check_error(resp: requests.Response, status: int, *, param: str | None = None, contains: str | None = None):
    assert resp.status_code == status, f"expected {status}, got {resp.status_code}: {resp.text}"
    body = resp.json()
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"]
    if param is not None:
        assert err["param"] == param, err
    if contains is not None:
        assert contains in err["message"], err
    return err


def still_serving(srv, headers=None):
    assert requests.get(srv.base_url + "/health", timeout=10).status_code == 200
    r = requests.post(srv.base_url + "/v1/completions", headers=headers or srv.headers(), timeout=60,
                      json={"model": srv.model, "prompt": "Hello", "max_tokens": 2, "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] >= 1


def post(srv, path, payload, **kw):
    data = payload if isinstance(payload, (bytes, str)) else json.dumps(payload)
    return requests.post(srv.base_url + path, data=data, headers={"Content-Type": "application/json"},
                         timeout=60, **kw)


COMPLETION = {"prompt": "Hello", "max_tokens": 4}
CHAT = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}

# (name, path, body, param): each must get a 400 naming `param` (None: not checked).
BAD_400 = [
    ("malformed json", "/v1/completions", b'{"prompt": "Hello", "max_tokens": 4', None),
    ("trailing garbage", "/v1/completions", b'{"prompt": "Hello"} x', None),
    ("not an object", "/v1/completions", b'[1, 2, 3]', None),
    ("empty body", "/v1/chat/completions", b'', None),
    ("invalid utf-8", "/v1/completions", b'{"prompt": "caf\xc3\x28 \xff", "max_tokens": 2}', None),
    ("max_tokens string", "/v1/completions", {**COMPLETION, "max_tokens": "ten"}, "max_tokens"),
    ("max_tokens fraction", "/v1/completions", {**COMPLETION, "max_tokens": 2.5}, "max_tokens"),
    ("max_tokens negative", "/v1/completions", {**COMPLETION, "max_tokens": -1}, "max_tokens"),
    ("max_tokens zero", "/v1/completions", {**COMPLETION, "max_tokens": 0}, "max_tokens"),
    ("max_completion_tokens negative", "/v1/chat/completions", {**CHAT, "max_completion_tokens": -5},
     "max_completion_tokens"),
    ("temperature string", "/v1/completions", {**COMPLETION, "temperature": "hot"}, "temperature"),
    ("temperature negative", "/v1/completions", {**COMPLETION, "temperature": -0.1}, "temperature"),
    ("temperature too high", "/v1/completions", {**COMPLETION, "temperature": 2.5}, "temperature"),
    ("top_p zero", "/v1/completions", {**COMPLETION, "top_p": 0}, "top_p"),
    ("top_p above one", "/v1/completions", {**COMPLETION, "top_p": 1.01}, "top_p"),
    ("top_k below -1", "/v1/completions", {**COMPLETION, "top_k": -2}, "top_k"),
    ("min_p above one", "/v1/completions", {**COMPLETION, "min_p": 1.5}, "min_p"),
    ("presence_penalty", "/v1/completions", {**COMPLETION, "presence_penalty": 2.5}, "presence_penalty"),
    ("frequency_penalty", "/v1/completions", {**COMPLETION, "frequency_penalty": -3}, "frequency_penalty"),
    ("repetition_penalty zero", "/v1/completions", {**COMPLETION, "repetition_penalty": 0}, "repetition_penalty"),
    ("n zero", "/v1/completions", {**COMPLETION, "n": 0}, "n"),
    ("n above cap", "/v1/completions", {**COMPLETION, "n": 1000}, "n"),
    ("n bool", "/v1/completions", {**COMPLETION, "n": True}, "n"),
    ("stream string", "/v1/completions", {**COMPLETION, "stream": "yes"}, "stream"),
    ("stream_options without stream", "/v1/completions", {**COMPLETION, "stream_options": {"include_usage": True}},
     "stream_options"),
    ("seed string", "/v1/completions", {**COMPLETION, "seed": "abc"}, "seed"),
    ("stop number", "/v1/completions", {**COMPLETION, "stop": 5}, "stop"),
    ("stop empty string", "/v1/completions", {**COMPLETION, "stop": [""]}, "stop"),
    ("logprobs above cap", "/v1/completions", {**COMPLETION, "logprobs": 1000}, "logprobs"),
    ("top_logprobs without logprobs", "/v1/chat/completions", {**CHAT, "top_logprobs": 3}, "top_logprobs"),
    ("prompt missing", "/v1/completions", {"max_tokens": 4}, "prompt"),
    ("prompt number", "/v1/completions", {"prompt": 5}, "prompt"),
    ("prompt empty", "/v1/completions", {"prompt": ""}, "prompt"),
    ("prompt token out of vocab", "/v1/completions", {"prompt": [1, 2, 999999999]}, "prompt"),
    ("prompt negative token", "/v1/completions", {"prompt": [1, -2]}, "prompt"),
    ("messages missing", "/v1/chat/completions", {"max_tokens": 4}, "messages"),
    ("messages string", "/v1/chat/completions", {"messages": "hi"}, "messages"),
    ("messages empty", "/v1/chat/completions", {"messages": []}, "messages"),
    ("message not object", "/v1/chat/completions", {"messages": ["hi"]}, "messages"),
    ("unknown role", "/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, "messages"),
    ("role missing", "/v1/chat/completions", {"messages": [{"content": "hi"}]}, "messages"),
    ("content missing", "/v1/chat/completions", {"messages": [{"role": "user"}]}, "messages"),
    ("content number", "/v1/chat/completions", {"messages": [{"role": "user", "content": 42}]}, "messages"),
    ("image content part", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages"),
    # Numbers past a double's range, in any field and on every JSON route.
    ("number overflow completions", "/v1/completions", b'{"prompt": "hi", "max_tokens": 2, "temperature": 1e999}',
     None),
    ("number overflow chat", "/v1/chat/completions",
     b'{"messages": [{"role": "user", "content": "hi"}], "top_p": -1e400}', None),
    ("number overflow nested", "/v1/chat/completions",
     b'{"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"5": 1e999}}', None),
    ("number overflow tokenize", "/tokenize", b'{"prompt": "hi", "x": 1e999}', None),
    ("number overflow detokenize", "/detokenize", b'{"tokens": [1e999]}', None),
    ("tokenize without prompt", "/tokenize", {"text": "hi"}, "prompt"),
    ("detokenize bad ids", "/detokenize", {"tokens": [1, "two"]}, "tokens"),
    # The Responses API (/v1/responses): its items, tools and options.
    ("responses input missing", "/v1/responses", {"max_output_tokens": 4}, "input"),
    ("responses input empty list", "/v1/responses", {"input": []}, "input"),
    ("responses unknown item type", "/v1/responses", {"input": [{"type": "mcp_call", "id": "x"}]}, "input"),
    ("responses item not object", "/v1/responses", {"input": ["hi"]}, "input"),
    ("responses image part", "/v1/responses",
     {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input"),
    ("responses output without its call", "/v1/responses",
     {"input": [{"type": "function_call_output", "call_id": "call_1", "output": "18 C"}]}, "input"),
    ("responses unknown tool_choice", "/v1/responses", {"input": "hi", "tool_choice": "maybe"}, "tool_choice"),
    ("responses unknown tool type", "/v1/responses", {"input": "hi", "tools": [{"type": "teleport"}]}, "tools"),
    ("responses background", "/v1/responses", {"input": "hi", "background": True}, "background"),
    ("responses bad text.format", "/v1/responses", {"input": "hi", "text": {"format": {"type": "csv"}}},
     "text.format"),
    ("responses max_output_tokens string", "/v1/responses", {"input": "hi", "max_output_tokens": "ten"},
     "max_output_tokens"),
    ("responses number overflow", "/v1/responses", b'{"input": "hi", "temperature": 1e999}', None),
]


@pytest.mark.parametrize("name,path,body,param", BAD_400, ids=[c[0] for c in BAD_400])
def test_bad_request_gets_400(server, name, path, body, param):
    check_error(post(server, path, body), 400, param=param)
    still_serving(server)


def test_prompt_plus_max_tokens_beyond_context(server):
    prompt = [100] * 2000
    err = check_error(post(server, "/v1/completions", {"prompt": prompt, "max_tokens": 100}), 400)
    assert err["message"].startswith(f"This model's maximum context length is {MAX_MODEL_LEN} tokens. "
                                      "However, you requested 2100 tokens (2000 in the messages, 100 in the completion).")
    still_serving(server)


def test_prompt_alone_beyond_context(server):
    err = check_error(post(server, "/v1/completions", {"prompt": [100] * 3000}), 400)
    assert f"maximum context length is {MAX_MODEL_LEN} tokens" in err["message"]
    assert "3000" in err["message"]
    long_chat = {"messages": [{"role": "user", "content": "word " * 3000}], "max_tokens": 10}
    check_error(post(server, "/v1/chat/completions", long_chat), 400, contains="maximum context length")
    still_serving(server)


def test_unknown_route_and_model_get_404(server):
    check_error(requests.get(server.base_url + "/v1/nothing", timeout=10), 404)
    check_error(requests.post(server.base_url + "/v2/completions", json=COMPLETION, timeout=10), 404)
    err = check_error(post(server, "/v1/completions", {**COMPLETION, "model": "gpt-9"}), 404)
    assert "gpt-9" in err["message"] and err["code"] == "model_not_found"
    check_error(post(server, "/v1/chat/completions", {**CHAT, "model": "gpt-9"}), 404)
    # A stored response that does not exist: to continue, to read, to delete.
    err = check_error(post(server, "/v1/responses", {"input": "hi", "previous_response_id": "resp_gone"}), 404,
                      param="previous_response_id", contains="resp_gone")
    assert err["code"] == "previous_response_not_found"
    check_error(requests.get(server.base_url + "/v1/responses/resp_gone", timeout=10), 404, contains="resp_gone")
    check_error(requests.delete(server.base_url + "/v1/responses/resp_gone", timeout=10), 404)
    still_serving(server)


def test_wrong_method_gets_405(server):
    check_error(requests.get(server.base_url + "/v1/completions", timeout=10), 405)
    check_error(requests.post(server.base_url + "/v1/models", timeout=10), 405)
    still_serving(server)


def test_body_above_limit_gets_413(server):
    big = {"prompt": "x" * (17 << 20), "max_tokens": 1}  # over the default 16 MiB
    check_error(post(server, "/v1/completions", big), 413)
    # Announced by Content-Length alone: refused before the body is read.
    with socket.create_connection(("127.0.0.1", int(server.base_url.rsplit(":", 1)[1])), timeout=10) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100000000\r\n\r\n{\"prompt\":")
        head = s.recv(65536).decode(errors="replace")
    assert head.startswith("HTTP/1.1 413"), head
    still_serving(server)


def test_malformed_http_gets_400(server):
    with socket.create_connection(("127.0.0.1", int(server.base_url.rsplit(":", 1)[1])), timeout=10) as s:
        s.sendall(b"THIS IS NOT HTTP\r\n\r\n")
        head = s.recv(65536).decode(errors="replace")
    assert head.startswith("HTTP/1.1 400"), head
    still_serving(server)


def test_api_key(start_server):
    srv = start_server(api_key="sekret")
    assert requests.get(srv.base_url + "/health", timeout=10).status_code == 200  # no key needed
    for method, path in [("GET", "/v1/models"), ("GET", "/metrics"), ("POST", "/v1/completions"),
                         ("POST", "/v1/chat/completions"), ("POST", "/tokenize"), ("POST", "/detokenize"),
                         ("GET", "/v1/nothing")]:
        body = CHAT if "chat" in path else COMPLETION
        err = check_error(requests.request(method, srv.base_url + path, json=body, timeout=10), 401)
        assert err["code"] == "invalid_api_key"
        check_error(requests.request(method, srv.base_url + path, json=body, timeout=10,
                                     headers={"Authorization": "Bearer wrong"}), 401)
    assert requests.get(srv.base_url + "/v1/models", headers=srv.headers(), timeout=10).status_code == 200
    still_serving(srv)


def test_queue_bound_gets_503(start_server):
    srv = start_server("--max-num-seqs", "1", "--max-queued-requests", "2")
    long_request = {"prompt": "Tell me a story.", "max_tokens": 400, "ignore_eos": True, "stream": True}
    streams = []
    stop = threading.Event()

    def hold(r):  # keep reading until told to hang up
        try:
            for _ in r.iter_lines():
                if stop.is_set():
                    break
        except Exception:  # the test closed the response under us
            pass

    def wait_for(running, waiting):
        deadline = time.time() + 10
        while time.time() < deadline:
            if (srv.metric("inferd:num_requests_running"), srv.metric("inferd:num_requests_waiting")) == (running, waiting):
                return
            time.sleep(0.02)
        pytest.fail(f"never reached {running} running and {waiting} waiting")

    for i in range(3):  # one running, two waiting
        r = requests.post(srv.base_url + "/v1/completions", json=long_request, stream=True, timeout=60)
        assert r.status_code == 200, r.text
        t = threading.Thread(target=hold, args=(r,), daemon=True)
        t.start()
        streams.append((r, t))
        wait_for(1, i)
    resp = post(srv, "/v1/completions", COMPLETION)
    assert resp.status_code in (429, 503), resp.text
    check_error(resp, resp.status_code)
    assert resp.headers.get("Retry-After")
    stop.set()
    for r, _ in streams:
        r.close()
    # Once the queue drains, requests are admitted again.
    deadline = time.time() + 20
    while time.time() < deadline and srv.metric("inferd:num_requests_waiting") > 0:
        time.sleep(0.05)
    still_serving(srv)
