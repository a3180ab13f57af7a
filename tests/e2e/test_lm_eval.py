"""lm-evaluation-harness (the `lm-eval` package) against `inferd serve`, as whoever
measures a quantized model runs it: `--model local-completions` with the server's
tokenizer (`tokenizer_backend=remote`: /tokenizer_info, /tokenize, /detokenize), on
a multiple-choice task and a perplexity task committed in tests/e2e/lm_eval/
(nothing fetched). Each score the harness reports is checked against the same
sum taken from the server's vLLM-style `prompt_logprobs`."""
from __future__ import annotations

import math

import pytest
import requests

from conftest import run_lm_eval

pytest.importorskip("lm_eval", reason="lm-eval is installed by scripts/setup.sh")


def tokenize(server, text):
    r = requests.post(server.base_url + "/tokenize", json={"prompt": text, "add_special_tokens": False}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def prompt_logprobs(server, ids):
    """The server's logprob of each token of `ids` after the first (vLLM's prompt_logprobs)."""
    r = requests.post(server.base_url + "/v1/completions",
                      json={"model": server.model, "prompt": ids, "max_tokens": 1, "temperature": 0,
                            "prompt_logprobs": 0}, timeout=60)
    assert r.status_code == 200, r.text
    plp = r.json()["choices"][0]["prompt_logprobs"]
    assert plp[0] is None
    return [entry[str(t)]["logprob"] for t, entry in zip(ids[1:], plp[1:])]


@pytest.fixture(scope="module")
def lm_eval_run(server, tmp_path_factory):
    return run_lm_eval(server, tmp_path_factory.mktemp("lm_eval"))


def test_multiple_choice_scores_are_the_servers_prompt_logprobs(server, lm_eval_run):
    results, samples = lm_eval_run
    acc = results["inferd_mc"]["acc,none"]
    assert 0.25 < acc <= 1.0  # above chance (one in four) on six easy questions
    docs = samples["inferd_mc"]
    assert len(docs) == 6
    for s in docs:
        context = "Question: " + s["doc"]["question"] + "\nAnswer:"
        ctx_ids = tokenize(server, context)
        for choice, (ll, _greedy) in zip(s["doc"]["choices"], [r[0] for r in s["resps"]]):
            # As the harness splits it: the whole text tokenized, the context's tokens cut off.
            whole = tokenize(server, context + " " + choice)
            assert whole[:len(ctx_ids)] == ctx_ids
            lps = prompt_logprobs(server, whole)
            assert math.isclose(float(ll), sum(lps[len(ctx_ids) - 1:]), abs_tol=1e-3), (context, choice)


def test_perplexity_is_the_servers_prompt_logprobs(server, lm_eval_run):
    results, samples = lm_eval_run
    ppl = results["inferd_ppl"]["word_perplexity,none"]
    assert 1.0 < ppl < 1000.0
    for s in samples["inferd_ppl"]:
        text = s["doc"]["text"]
        ids = tokenize(server, text)
        # loglikelihood_rolling scores every token, the first after the prefix token (BOS, else EOS).
        info = requests.get(server.base_url + "/tokenizer_info", timeout=30).json()
        prefix = tokenize(server, info["bos_token"] or info["eos_token"])
        total = sum(prompt_logprobs(server, prefix + ids))
        got = float(s["resps"][0][0])
        assert math.isclose(got, total, abs_tol=1e-2), text[:40]
