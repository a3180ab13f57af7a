"""The server through the official `openai` Python package: completions and
chat, streaming and not, n > 1, logprobs, stop strings, seeds, usage."""
from __future__ import annotations

import math

import openai
import pytest
import requests

PROMPT = "The three primary colors are"
MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Name three fruits."},
]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_models_lists_the_served_model(client, server):
    models = client.models.list()
    assert [m.id for m in models.data] == [server.model]


def test_completion_greedy_is_deterministic_and_counts_usage(client, server):
    a = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=16, temperature=0)
    b = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=16, temperature=0)
    assert a.object == "text_completion"
    assert len(a.choices) == 1 and a.choices[0].text
    assert a.choices[0].text == b.choices[0].text
    assert a.choices[0].finish_reason in ("length", "stop")
    assert a.usage.completion_tokens <= 16
    assert a.usage.prompt_tokens > 0
    assert a.usage.total_tokens == a.usage.prompt_tokens + a.usage.completion_tokens
    # The second identical prompt finds nothing new to cache (too short for a full block), but says so.
    assert b.usage.prompt_tokens_details.cached_tokens >= 0


def test_completion_prompt_as_token_ids(client, server):
    ids = [504, 1345, 3063, 6480, 282]  # arbitrary in-vocabulary ids
    r = client.completions.create(model=server.model, prompt=ids, max_tokens=4, temperature=0)
    assert r.usage.prompt_tokens == len(ids)
    assert r.usage.completion_tokens == 4 or r.choices[0].finish_reason == "stop"


def test_chat_completion(client, server):
    r = client.chat.completions.create(model=server.model, messages=MESSAGES, max_tokens=24, temperature=0)
    assert r.object == "chat.completion"
    msg = r.choices[0].message
    assert msg.role == "assistant" and msg.content
    assert r.usage.completion_tokens <= 24


def test_streamed_text_equals_non_streamed_with_seed(client, server):
    kwargs = dict(model=server.model, prompt=PROMPT, max_tokens=24, temperature=0.9, top_p=0.95, seed=1234)
    whole = client.completions.create(**kwargs)
    pieces, finish = [], None
    for chunk in client.completions.create(stream=True, **kwargs):
        for c in chunk.choices:
            pieces.append(c.text)
            finish = c.finish_reason or finish
    assert "".join(pieces) == whole.choices[0].text
    assert finish == whole.choices[0].finish_reason


def test_chat_streamed_equals_non_streamed_with_seed(client, server):
    kwargs = dict(model=server.model, messages=MESSAGES, max_tokens=24, temperature=0.8, seed=7)
    whole = client.chat.completions.create(**kwargs)
    stream = client.chat.completions.create(stream=True, **kwargs)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_seed_reproducible_and_different_seeds_differ(client, server):
    kwargs = dict(model=server.model, prompt="Once upon a time", max_tokens=32, temperature=1.0)
    a = client.completions.create(seed=42, **kwargs).choices[0].text
    b = client.completions.create(seed=42, **kwargs).choices[0].text
    others = {client.completions.create(seed=s, **kwargs).choices[0].text for s in (1, 2, 3)}
    assert a == b
    assert len(others | {a}) > 1


def test_n_choices(client, server):
    r = client.completions.create(model=server.model, prompt="A list of animals:", max_tokens=12,
                                  temperature=1.0, n=3, seed=5)
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    assert 3 <= r.usage.completion_tokens <= 3 * 12
    # Seeded choices differ from each other but repeat exactly.
    again = client.completions.create(model=server.model, prompt="A list of animals:", max_tokens=12,
                                      temperature=1.0, n=3, seed=5)
    assert [c.text for c in sorted(r.choices, key=lambda c: c.index)] == \
           [c.text for c in sorted(again.choices, key=lambda c: c.index)]
    assert len({c.text for c in r.choices}) > 1


def test_n_choices_streaming(client, server):
    stream = client.chat.completions.create(model=server.model, messages=MESSAGES, max_tokens=8, n=2,
                                            temperature=1.0, seed=3, stream=True)
    texts, finished = {0: "", 1: ""}, set()
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            if c.finish_reason:
                finished.add(c.index)
    assert finished == {0, 1}
    assert all(texts.values())


def test_completion_logprobs(client, server):
    r = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=6, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    n = r.usage.completion_tokens
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n
    for value, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert value <= 0.0 and math.isfinite(value)
        assert 1 <= len(top) <= 3
        # Greedy: the chosen token is the most likely one.
        assert value == pytest.approx(max(top.values()), abs=1e-4)


def test_chat_logprobs_streaming(client, server):
    stream = client.chat.completions.create(model=server.model, messages=MESSAGES, max_tokens=5, temperature=0,
                                            logprobs=True, top_logprobs=2, stream=True,
                                            stream_options={"include_usage": True})
    entries, usage = [], None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            if c.logprobs and c.logprobs.content:
                entries += c.logprobs.content
    assert usage is not None
    assert len(entries) == usage.completion_tokens
    for e in entries:
        assert len(e.top_logprobs) == 2
        assert e.logprob == pytest.approx(e.top_logprobs[0].logprob, abs=1e-4)
        assert bytes(e.bytes).decode("utf-8", errors="replace") is not None


def test_stop_string_is_not_emitted(client, server):
    base = client.completions.create(model=server.model, prompt="Count: 1, 2, 3,", max_tokens=20, temperature=0)
    text = base.choices[0].text
    assert len(text) > 4
    stop = text[2:4]  # a string the greedy continuation is known to contain
    r = client.completions.create(model=server.model, prompt="Count: 1, 2, 3,", max_tokens=20, temperature=0,
                                  stop=[stop])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == text[: text.index(stop)]
    pieces = [c.choices[0].text for c in client.completions.create(
        model=server.model, prompt="Count: 1, 2, 3,", max_tokens=20, temperature=0, stop=[stop], stream=True)]
    assert "".join(pieces) == r.choices[0].text


def test_include_usage_in_stream(client, server):
    chunks = list(client.completions.create(model=server.model, prompt=PROMPT, max_tokens=7, temperature=0,
                                            stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    assert all(c.usage is None for c in chunks[:-1])
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == 7
    assert last.usage.prompt_tokens > 0


def test_extra_sampling_fields(client, server):
    r = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=10, temperature=0.7, seed=9,
                                  presence_penalty=0.5, frequency_penalty=0.5,
                                  extra_body={"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1,
                                              "ignore_eos": True})
    assert r.usage.completion_tokens == 10
    assert r.choices[0].finish_reason == "length"


def test_max_completion_tokens_and_default_chat_length(client, server):
    r = client.chat.completions.create(model=server.model, messages=MESSAGES, max_completion_tokens=3,
                                       extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 3


def test_tokenize_detokenize_round_trip(server):
    tok = requests.post(server.base_url + "/tokenize", json={"prompt": "Hello, world!"}, timeout=30).json()
    assert tok["count"] == len(tok["tokens"]) > 0
    detok = requests.post(server.base_url + "/detokenize", json={"tokens": tok["tokens"]}, timeout=30).json()
    assert detok["prompt"] == "Hello, world!"
    chat = requests.post(server.base_url + "/tokenize", json={"messages": MESSAGES}, timeout=30).json()
    assert chat["count"] > tok["count"]


def test_prefix_cache_reports_cached_tokens(client, server):
    system = "You are a meticulous assistant. " * 20  # well over one 16-token block
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": "Hi"}]
    client.chat.completions.create(model=server.model, messages=msgs, max_tokens=2)
    again = client.chat.completions.create(model=server.model, messages=msgs, max_tokens=2)
    assert again.usage.prompt_tokens_details.cached_tokens >= 16
