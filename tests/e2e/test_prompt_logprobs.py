"""Scoring text through the server, as evaluation harnesses do (lm-evaluation-harness's
local-completions): /v1/completions with echo, logprobs and max_tokens 0, and vLLM's
prompt_logprobs on both completion endpoints, through the official `openai` client."""
from __future__ import annotations

import math

import openai
import pytest
import requests

PROMPT = "The capital of France is Paris, and the capital of Italy is"


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def post(server, path, body):
    r = requests.post(server.base_url + path, json={"model": server.model, **body}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def score(client, server, prompt, k=1, max_tokens=0):
    return client.completions.create(model=server.model, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                     echo=True, logprobs=k)


def test_echo_with_max_tokens_zero_scores_the_prompt_alone(client, server):
    r = score(client, server, PROMPT, k=2)
    c = r.choices[0]
    assert c.text == PROMPT
    assert c.finish_reason == "length"
    assert r.usage.completion_tokens == 0
    lp = c.logprobs
    n = r.usage.prompt_tokens
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n
    # The first token has nothing before it (null, as OpenAI and vLLM give it).
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(x <= 0.0 for x in lp.token_logprobs[1:])
    assert all(len(top) <= 2 and max(top.values()) >= lp.token_logprobs[i + 1] - 1e-6
               for i, top in enumerate(lp.top_logprobs[1:]))
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    assert "".join(lp.tokens) == PROMPT  # the pieces spell the prompt


def test_echo_with_a_completion_puts_the_prompt_first_as_lm_eval_asks(client, server):
    # lm-eval's loglikelihood request: echo, logprobs 1, max_tokens 1 (it drops the last entry).
    alone = score(client, server, PROMPT).choices[0].logprobs
    r = score(client, server, PROMPT, max_tokens=1)
    c = r.choices[0]
    plain = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=1, temperature=0, logprobs=1)
    assert c.text == PROMPT + plain.choices[0].text
    n = r.usage.prompt_tokens
    assert len(c.logprobs.tokens) == n + 1
    assert c.logprobs.tokens[:n] == alone.tokens
    assert c.logprobs.token_logprobs[:n] == alone.token_logprobs
    assert c.logprobs.token_logprobs[n] == plain.choices[0].logprobs.token_logprobs[0]
    assert c.logprobs.text_offset[n] == len(PROMPT)


def test_a_prompt_tokens_score_is_the_logprob_of_generating_it(client, server):
    # Greedy one token after the prompt, then score prompt + that token: its
    # logprob as the last prompt token equals its logprob as the generated one.
    ids = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=0, echo=True, logprobs=0)
    plain = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=1, temperature=0, logprobs=0)
    prompt_ids = post(server, "/tokenize", {"prompt": PROMPT})["tokens"]
    assert len(prompt_ids) == ids.usage.prompt_tokens
    gen_id = post(server, "/tokenize", {"prompt": plain.choices[0].text, "add_special_tokens": False})["tokens"]
    if len(gen_id) != 1:
        pytest.skip("the generated token's text does not tokenize back to one token")
    r = score(client, server, prompt_ids + gen_id, k=0)
    assert math.isclose(r.choices[0].logprobs.token_logprobs[-1], plain.choices[0].logprobs.token_logprobs[0],
                        abs_tol=1e-3)


def test_several_prompts_and_token_id_prompts_are_each_echoed(client, server):
    ids = [504, 1345, 3063, 6480, 282]
    r = client.completions.create(model=server.model, prompt=[PROMPT, "Hello there"], max_tokens=0, echo=True,
                                  logprobs=0)
    assert sorted(c.text for c in r.choices) == sorted([PROMPT, "Hello there"])
    t = client.completions.create(model=server.model, prompt=ids, max_tokens=0, echo=True, logprobs=0)
    assert len(t.choices[0].logprobs.tokens) == len(ids)
    assert t.choices[0].text == post(server, "/detokenize", {"tokens": ids})["prompt"]


def test_vllm_prompt_logprobs_on_completions_agree_with_echo(client, server):
    echo = score(client, server, PROMPT, k=3).choices[0].logprobs
    r = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=1, temperature=0,
                                  extra_body={"prompt_logprobs": 3})
    plp = r.choices[0].model_dump()["prompt_logprobs"]
    assert len(plp) == r.usage.prompt_tokens and plp[0] is None
    for i, entry in enumerate(plp[1:], start=1):
        assert 3 <= len(entry) <= 4  # the prompt's token, and the 3 most likely
        assert {1, 2, 3} <= {v["rank"] for v in entry.values()}
        assert any(math.isclose(v["logprob"], echo.token_logprobs[i], abs_tol=1e-6) for v in entry.values())
        assert all(isinstance(v["decoded_token"], str) for v in entry.values())


def test_vllm_prompt_logprobs_on_chat(client, server):
    messages = [{"role": "user", "content": "Name a colour."}]
    r = client.chat.completions.create(model=server.model, messages=messages, max_tokens=2, temperature=0,
                                       extra_body={"prompt_logprobs": 0})
    plp = r.model_dump()["prompt_logprobs"]
    assert len(plp) == r.usage.prompt_tokens and plp[0] is None
    assert all(len(entry) == 1 and next(iter(entry.values()))["logprob"] <= 0.0 for entry in plp[1:])


@pytest.mark.parametrize("body, param", [
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 0, "echo": True, "stream": True}, "echo"),
    ({"max_tokens": 0, "echo": True, "logprobs": 21}, "logprobs"),
    ({"max_tokens": 1, "prompt_logprobs": 21}, "prompt_logprobs"),
    ({"max_tokens": 1, "prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
])
def test_bad_scoring_requests_get_400_naming_the_field(client, server, body, param):
    body = dict(body)
    kwargs = {k: body.pop(k) for k in ("max_tokens", "echo", "stream", "logprobs") if k in body}
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=server.model, prompt=PROMPT, extra_body=body, **kwargs)
    assert e.value.body["param"] == param, e.value.body
