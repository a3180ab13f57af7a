"""Beam search over HTTP with the official openai client (vLLM's extra parameters
use_beam_search, length_penalty, early_stopping; n beams returned as the choices, best
first): the beams of tests/data/beam_search/smollm2-135m.json, which a Python beam search
made over llama.cpp's logits (tools/reference/beam_search_reference.py), from a server that
follows that llama.cpp build's arithmetic (--ggml-flavour); the chat endpoint
answers as the completions endpoint on the same prompt; a client that goes away frees every
beam's blocks; and what beam search cannot do gets a 400 naming the field."""
import json
import pathlib
import socket
import time

import pytest
import requests
from openai import OpenAI

from conftest import MODEL_NAME, port_of, start, stop

DATA = json.loads((pathlib.Path(__file__).resolve().parents[1] / "data" / "beam_search" / "smollm2-135m.json")
                  .read_text())


def client(srv) -> OpenAI:
    return OpenAI(base_url=srv.base_url + "/v1", api_key="none", max_retries=0)


# The reference data follows the arithmetic of the GGML build that made it (its ggml_flavour); a
# server started with --numerics exact and --ggml-flavour of the same build computes the same logits
# on any CPU, so every case must match, near-ties included.
CASES = DATA["cases"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = start(tmp_path_factory.mktemp("beam_server"), ["--numerics", "exact", "--ggml-flavour", DATA["ggml_flavour"]])
    yield srv
    assert stop(srv) == 0, srv.log()[-4000:]


def beam_body(case) -> dict:
    return {"use_beam_search": True, "length_penalty": case["length_penalty"],
            "early_stopping": case["early_stopping"]}


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_completions_return_the_reference_beams_best_first(server, case):
    r = client(server).completions.create(model=MODEL_NAME, prompt=case["prompt_ids"], n=case["beam_width"],
                                          max_tokens=case["max_tokens"], extra_body=beam_body(case))
    want = case["beams"]
    assert [c.index for c in r.choices] == list(range(len(want)))
    assert [c.text for c in r.choices] == [b["text"] for b in want]
    assert [c.finish_reason for c in r.choices] == [b["finish_reason"] for b in want]
    assert r.usage.prompt_tokens == len(case["prompt_ids"])
    assert r.usage.completion_tokens == sum(len(b["token_ids"]) for b in want)


def test_chat_answers_as_completions_on_the_rendered_prompt(server):
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    extra = {"use_beam_search": True, "early_stopping": "never"}
    chat = client(server).chat.completions.create(model=MODEL_NAME, messages=messages, n=3, max_tokens=12,
                                                  extra_body=extra)
    ids = requests.post(server.base_url + "/tokenize", json={"messages": messages}, timeout=30).json()["tokens"]
    plain = client(server).completions.create(model=MODEL_NAME, prompt=ids, n=3, max_tokens=12, extra_body=extra)
    assert len(chat.choices) == 3
    assert [c.message.content for c in chat.choices] == [c.text for c in plain.choices]
    assert [c.finish_reason for c in chat.choices] == [c.finish_reason for c in plain.choices]
    assert len({c.message.content for c in chat.choices}) == 3  # three different beams
    assert chat.usage.completion_tokens == plain.usage.completion_tokens


def test_several_prompts_get_n_beams_each(server):
    prompts = [DATA["cases"][0]["prompt_ids"], DATA["cases"][2]["prompt_ids"]]
    r = client(server).completions.create(model=MODEL_NAME, prompt=prompts, n=2, max_tokens=12,
                                          extra_body={"use_beam_search": True})
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert [c.text for c in r.choices] == [b["text"] for b in DATA["cases"][0]["beams"]] + \
        [b["text"] for b in DATA["cases"][2]["beams"]]


def test_a_client_that_goes_away_frees_every_beam(start_server):
    srv = start_server()
    kv0 = srv.metric("inferd:kv_cache_usage_perc")
    body = json.dumps({"prompt": "A long essay about the sea:", "max_tokens": 1500, "n": 4, "ignore_eos": True,
                       "use_beam_search": True}).encode()
    s = socket.create_connection(("127.0.0.1", port_of(srv)), timeout=30)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
              str(len(body)).encode() + b"\r\n\r\n" + body)
    deadline = time.time() + 20
    while srv.metric("inferd:num_requests_running") < 4 and time.time() < deadline:
        time.sleep(0.02)
    assert srv.metric("inferd:num_requests_running") == 4  # four beams
    s.close()
    gone = time.time()
    while time.time() - gone < 1.0 and (srv.metric("inferd:kv_cache_usage_perc"), srv.metric(
            "inferd:num_requests_running")) != (kv0, 0):
        time.sleep(0.02)
    assert srv.metric("inferd:num_requests_running") == 0
    assert srv.metric("inferd:kv_cache_usage_perc") == kv0
    assert srv.metric("inferd:request_success_total", finished_reason="abort") == 1


BAD = [
    ("/v1/completions", {"prompt": "Hi", "use_beam_search": True, "stream": True}, "stream"),
    ("/v1/completions", {"prompt": "Hi", "use_beam_search": True, "logprobs": 2}, "logprobs"),
    ("/v1/completions", {"prompt": "Hi", "use_beam_search": "yes"}, "use_beam_search"),
    ("/v1/completions", {"prompt": "Hi", "use_beam_search": True, "early_stopping": "sometimes"}, "early_stopping"),
    ("/v1/completions", {"prompt": "Hi", "use_beam_search": True, "length_penalty": "long"}, "length_penalty"),
    ("/v1/completions", {"prompt": "Hi", "length_penalty": 2.0}, "length_penalty"),
    ("/v1/completions", {"prompt": "Hi", "early_stopping": True}, "early_stopping"),
    ("/v1/completions", {"prompt": "Hi", "use_beam_search": True, "n": 0}, "n"),
    ("/v1/completions", {"prompt": "Hi", "use_beam_search": True, "guided_regex": "[a-z]+"}, "guided_regex"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "use_beam_search": True,
                              "response_format": {"type": "json_object"}}, "response_format"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "use_beam_search": True,
                              "logprobs": True}, "logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "use_beam_search": True,
                              "stream": True}, "stream"),
]


@pytest.mark.parametrize("path,body,param", BAD, ids=[f"{p}:{f}" for p, _, f in BAD])
def test_what_beam_search_cannot_do_gets_400_naming_the_field(server, path, body, param):
    r = requests.post(server.base_url + path, json=dict(body, model=MODEL_NAME, max_tokens=4), timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    assert err["message"], err


def test_a_beam_width_beyond_the_running_requests_gets_400(start_server):
    srv = start_server("--max-num-seqs", "2")
    r = requests.post(srv.base_url + "/v1/completions", timeout=30,
                      json={"prompt": "Hi", "n": 3, "max_tokens": 4, "use_beam_search": True})
    assert r.status_code == 400, r.text
    assert "max_num_seqs" in r.json()["error"]["message"]
    ok = requests.post(srv.base_url + "/v1/completions", timeout=60,
                       json={"prompt": "Hi", "n": 2, "max_tokens": 4, "use_beam_search": True})
    assert ok.status_code == 200 and len(ok.json()["choices"]) == 2
