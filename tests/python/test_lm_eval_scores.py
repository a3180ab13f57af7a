"""The lm-evaluation-harness tasks of tests/e2e/lm_eval/ scored two ways: the harness
against `inferd serve` (local-completions), and the Python package's
SamplingParams(prompt_logprobs=...) on the same token ids. They must agree."""
from __future__ import annotations

import math

import pytest

from inferd import SamplingParams

from pkg_support import e2e

pytest.importorskip("lm_eval", reason="lm-eval is installed by scripts/setup.sh")


def scores(llm, ids_list):
    """Per prompt, the Python API's logprob of each token after the first."""
    outs = llm.generate(ids_list, SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0), use_tqdm=False)
    return [[entry[t].logprob for t, entry in zip(o.prompt_token_ids[1:], o.prompt_logprobs[1:])] for o in outs]


def test_the_harness_scores_equal_the_python_apis_prompt_logprobs(llm, server, tmp_path):
    results, samples = e2e.run_lm_eval(server, tmp_path)
    tok = llm.get_tokenizer()

    # Multiple choice: each choice's tokens after the question, as the harness splits them.
    wanted, ids_list = [], []
    for s in samples["inferd_mc"]:
        context = "Question: " + s["doc"]["question"] + "\nAnswer:"
        ctx = tok.encode(context, add_special_tokens=False)
        for choice, resp in zip(s["doc"]["choices"], s["resps"]):
            ids_list.append(tok.encode(context + " " + choice, add_special_tokens=False))
            wanted.append((len(ctx), float(resp[0][0])))
    for (n_ctx, harness), lps in zip(wanted, scores(llm, ids_list)):
        assert math.isclose(sum(lps[n_ctx - 1:]), harness, abs_tol=1e-3)

    # Perplexity: every token of each document after the prefix token (BOS, else EOS).
    prefix = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
    docs = samples["inferd_ppl"]
    ids_list = [[prefix] + tok.encode(s["doc"]["text"], add_special_tokens=False) for s in docs]
    for s, lps in zip(docs, scores(llm, ids_list)):
        assert math.isclose(sum(lps), float(s["resps"][0][0]), abs_tol=1e-2)
    assert results["inferd_mc"]["acc,none"] > 0.25
