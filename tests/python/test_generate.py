"""LLM.generate against the server: the same engine must give the same tokens."""
from __future__ import annotations

import math

import pytest
import requests

from inferd import LLM, SamplingParams

from pkg_support import DEFAULT_MODEL, ENGINE_ARGS

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a land far away,",
    "1, 2, 3, 4,",
    "The quick brown fox",
    "Water boils at",
    "My favourite colour is",
    "Q: What is 2 + 2?\nA:",
]


def server_completion(server, prompt, **body):
    body = {"model": server.model, "prompt": prompt, **body}
    r = requests.post(server.base_url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_greedy_batch_equals_the_server_token_for_token(llm, server):
    params = SamplingParams(temperature=0, max_tokens=24, logprobs=0)
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    assert [o.prompt for o in outputs] == PROMPTS  # input order
    tok = llm.get_tokenizer()
    for prompt, out in zip(PROMPTS, outputs):
        ref = server_completion(server, prompt, temperature=0, max_tokens=24, logprobs=0)["choices"][0]
        got = out.outputs[0]
        assert got.text == ref["text"], prompt
        # Token for token: the server names each output token by its piece.
        assert tok.convert_ids_to_tokens(got.token_ids) == ref["logprobs"]["tokens"], prompt
        assert got.finish_reason == ref["finish_reason"]
        assert out.prompt_token_ids == tok.encode(prompt)
        assert len(got.token_ids) <= 24


def test_token_id_prompts_equal_the_server(llm, server):
    tok = llm.get_tokenizer()
    ids = [tok.encode(p) for p in PROMPTS[:3]]
    outputs = llm.generate(ids, SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)
    ref = server_completion(server, ids, temperature=0, max_tokens=16)["choices"]
    assert [o.outputs[0].text for o in outputs] == [c["text"] for c in sorted(ref, key=lambda c: c["index"])]
    assert all(o.prompt is None and o.prompt_token_ids == i for o, i in zip(outputs, ids))


def test_logprobs_have_vllms_shape_and_the_servers_values(llm, server):
    out = llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=8, logprobs=3), use_tqdm=False)[0]
    got = out.outputs[0]
    ref = server_completion(server, PROMPTS[0], temperature=0, max_tokens=8, logprobs=3)["choices"][0]["logprobs"]
    assert len(got.logprobs) == len(got.token_ids) == len(ref["token_logprobs"])
    for token, entry, ref_lp in zip(got.token_ids, got.logprobs, ref["token_logprobs"]):
        assert token in entry and 3 <= len(entry) <= 4
        assert entry[token].rank == 1  # greedy takes the most likely token
        assert math.isclose(entry[token].logprob, ref_lp, abs_tol=1e-4)
        assert sorted(e.rank for e in entry.values())[:3] == [1, 2, 3]
    assert math.isclose(got.cumulative_logprob, sum(ref["token_logprobs"]), abs_tol=1e-3)


def test_prompt_logprobs_have_vllms_shape_and_the_servers_echo_values(llm, server):
    params = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=2)
    outs = llm.generate(PROMPTS[:2], params, use_tqdm=False)
    for prompt, out in zip(PROMPTS[:2], outs):
        plp = out.prompt_logprobs
        assert len(plp) == len(out.prompt_token_ids) and plp[0] is None
        ref = server_completion(server, prompt, max_tokens=0, echo=True, logprobs=2)["choices"][0]["logprobs"]
        assert ref["token_logprobs"][0] is None
        for token, entry, ref_lp, ref_top in zip(out.prompt_token_ids[1:], plp[1:], ref["token_logprobs"][1:],
                                                 ref["top_logprobs"][1:]):
            assert token in entry and 2 <= len(entry) <= 3  # the prompt's token and the 2 most likely
            assert math.isclose(entry[token].logprob, ref_lp, abs_tol=1e-4)
            assert {1, 2} <= {e.rank for e in entry.values()}
            top = sorted((e for e in entry.values() if e.rank <= 2), key=lambda e: e.rank)
            assert {e.decoded_token for e in top} == set(ref_top)
    # Without it there are none; the generation is the same either way.
    plain = llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)[0]
    assert plain.prompt_logprobs is None
    assert plain.outputs[0].token_ids == outs[0].outputs[0].token_ids


def test_seeds_reproduce_and_differ(llm):
    def sample(seed):
        p = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=32, seed=seed, ignore_eos=True)
        return llm.generate("Tell me a story:", p, use_tqdm=False)[0].outputs[0].token_ids

    a, b, c = sample(1234), sample(1234), sample(4321)
    assert a == b
    assert a != c


def test_n_choices_are_seeded_as_the_servers(llm, server):
    p = SamplingParams(n=3, temperature=1.0, max_tokens=16, seed=7, ignore_eos=True)
    out = llm.generate("Write a word:", p, use_tqdm=False)[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    texts = [c.text for c in out.outputs]
    assert len(set(texts)) > 1
    ref = server_completion(server, "Write a word:", n=3, temperature=1.0, max_tokens=16, seed=7, ignore_eos=True)
    assert texts == [c["text"] for c in sorted(ref["choices"], key=lambda c: c["index"])]
    # Choice k is the request seeded seed + k.
    one = llm.generate("Write a word:", SamplingParams(temperature=1.0, max_tokens=16, seed=8, ignore_eos=True),
                       use_tqdm=False)[0]
    assert one.outputs[0].text == texts[1]


def test_stop_strings_and_tokens(llm):
    base = llm.generate("1, 2, 3, 4,", SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)[0].outputs[0]
    assert " 7" in base.text, base.text
    stopped = llm.generate("1, 2, 3, 4,", SamplingParams(temperature=0, max_tokens=16, stop=[" 7"]),
                           use_tqdm=False)[0].outputs[0]
    assert stopped.text == base.text[: base.text.index(" 7")]
    assert stopped.finish_reason == "stop" and stopped.stop_reason == " 7"
    first = base.token_ids[2]
    by_token = llm.generate("1, 2, 3, 4,", SamplingParams(temperature=0, max_tokens=16, stop_token_ids=[first]),
                            use_tqdm=False)[0].outputs[0]
    assert by_token.token_ids == base.token_ids[: base.token_ids.index(first) + 1]
    assert by_token.finish_reason == "stop"


def test_sampling_params_per_prompt(llm):
    outs = llm.generate(PROMPTS[:2], [SamplingParams(temperature=0, max_tokens=4),
                                      SamplingParams(temperature=0, max_tokens=9, ignore_eos=True)],
                        use_tqdm=False)
    assert len(outs[0].outputs[0].token_ids) <= 4
    assert len(outs[1].outputs[0].token_ids) == 9
    with pytest.raises(ValueError):
        llm.generate(PROMPTS[:2], [SamplingParams()] * 3, use_tqdm=False)


def test_a_batch_of_64_prompts_shares_engine_steps(llm):
    before = llm.stats()
    prompts = [f"Item {i}: the number {i} is" for i in range(64)]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True), use_tqdm=False)
    after = llm.stats()
    assert all(len(o.outputs[0].token_ids) == 16 for o in outs)
    steps = after["steps"] - before["steps"]
    tokens = after["scheduled_tokens"] - before["scheduled_tokens"]
    # One at a time would take 64 x (1 prefill + 15 decodes) = 1,024 steps of
    # about 1.5 tokens; together, a few prefill steps and 15 decode steps of 64.
    assert steps < 64, steps
    assert tokens / steps > 32, (tokens, steps)
    assert after["max_step_tokens"] >= 64


def test_tokenizer_matches_the_server(llm, server):
    tok = llm.get_tokenizer()
    text = "Hello, world! <|im_start|> héllo"
    ids = tok.encode(text)
    r = requests.post(server.base_url + "/tokenize", json={"prompt": text}, timeout=30).json()
    assert ids == r["tokens"]
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == "Hello, world!  héllo"  # control token skipped
    assert tok.decode(tok.encode(text, add_special_tokens=False), skip_special_tokens=False) == text
    assert tok.eos_token_id is not None and len(tok) > tok.eos_token_id


def test_speculative_config_gives_the_same_greedy_tokens(llm):
    spec = LLM(str(DEFAULT_MODEL), speculative_config={"method": "ngram", "num_speculative_tokens": 4},
               **ENGINE_ARGS)
    prompt = "a b c d a b c d a b c d a b c d a b"
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    assert spec.generate(prompt, params, use_tqdm=False)[0].outputs[0].token_ids == \
        llm.generate(prompt, params, use_tqdm=False)[0].outputs[0].token_ids
    assert spec.stats()["spec_draft_tokens"] > 0


def test_kv_cache_dtype_sets_the_caches_type_and_its_capacity(llm):
    f16 = llm.stats()
    assert f16["kv_cache_dtype"] == "f16"  # auto
    assert f16["kv_capacity_tokens"] == f16["kv_cache_blocks"] * 16
    q8 = LLM(str(DEFAULT_MODEL), kv_cache_dtype="q8_0", **ENGINE_ARGS)
    s = q8.stats()
    assert s["kv_cache_dtype"] == "q8_0"
    # The same 256M: 34 bytes per 32 values instead of 64.
    assert s["kv_capacity_tokens"] / f16["kv_capacity_tokens"] == pytest.approx(64 / 34, rel=0.01)
    assert s["kv_bytes_per_token"] * 64 == f16["kv_bytes_per_token"] * 34
    # Quantized keys and values move the logits a little, not the model's
    # answers: the first greedy token of most prompts is f16's.
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    mine = [o.outputs[0].token_ids for o in q8.generate(PROMPTS, params, use_tqdm=False)]
    ref = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    assert all(len(t) == 8 for t in mine)
    assert sum(a[0] == b[0] for a, b in zip(mine, ref)) >= 6, (mine, ref)
