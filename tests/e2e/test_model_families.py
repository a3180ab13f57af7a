"""The server on each model family beside the default one (Qwen2.5-Coder,
Gemma 3), through the official openai client: each model answers with its own
chat template (Gemma 3 270M's file has none: the architecture's default, the
official Gemma 3 template, stands in), streaming and not.

The rendered prompts are checked against the templates' known formats (the
templates themselves are checked against llama.cpp's Jinja renderer in
tests/unit/chat_template_test.cpp); what this adds is that a real server
loads each architecture, applies its template and generates over HTTP.
"""
from __future__ import annotations

import pytest
import requests
from openai import OpenAI

from conftest import MODEL_DIR, require_model, start, stop

QUESTION = "What is the capital of France? Answer in one word."

# file, the chat rendered by the model's own template (system turn included;
# the BOS, where there is one, comes from the template), and a word the greedy
# answer contains (None for Gemma 3 270M, a base model that does not answer).
FAMILIES = {
    "qwen2": (
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\n" + QUESTION +
        "<|im_end|>\n<|im_start|>assistant\n",
        "Paris",
    ),
    "gemma3": (
        "gemma-3-270m-q4_k_m.gguf",
        # Gemma's template has no system role: the system text opens the first user turn.
        "<bos><start_of_turn>user\nYou are terse.\n\n" + QUESTION + "<end_of_turn>\n<start_of_turn>model\n",
        None,
    ),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family_server(request, tmp_path_factory):
    file, rendered, word = FAMILIES[request.param]
    require_model(MODEL_DIR / file)
    srv = start(tmp_path_factory.mktemp(request.param), model=MODEL_DIR / file)
    yield srv, rendered, word
    assert stop(srv) == 0, srv.log()[-4000:]


def messages():
    return [{"role": "system", "content": "You are terse."}, {"role": "user", "content": QUESTION}]


def test_chat_template_is_the_models_own(family_server):
    srv, rendered, _ = family_server
    chat = requests.post(srv.base_url + "/tokenize", json={"messages": messages()}, timeout=30).json()
    text = requests.post(srv.base_url + "/tokenize", json={"prompt": rendered, "add_special_tokens": False},
                         timeout=30).json()
    assert chat["tokens"] == text["tokens"]


def test_chat_completion_answers(family_server):
    srv, _, word = family_server
    client = OpenAI(base_url=srv.base_url + "/v1", api_key="unused")
    r = client.chat.completions.create(model=srv.model, messages=messages(), max_tokens=16, temperature=0)
    assert r.choices[0].message.content
    if word:
        assert word in r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0


def test_streamed_chat_equals_the_whole_answer(family_server):
    srv, _, _ = family_server
    client = OpenAI(base_url=srv.base_url + "/v1", api_key="unused")
    whole = client.chat.completions.create(model=srv.model, messages=messages(), max_tokens=24, temperature=0)
    stream = client.chat.completions.create(model=srv.model, messages=messages(), max_tokens=24, temperature=0,
                                            stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == whole.choices[0].message.content
