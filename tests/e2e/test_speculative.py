"""Speculative decoding over HTTP with the official openai client: a server
with --speculative-config (n-gram drafts, or a draft model) answers exactly as
the plain server does, greedy and seeded, plain and streamed, and reports its
drafts on /metrics; a bad config or a draft model with another vocabulary is
refused at start-up with a message."""
import re
import subprocess
import urllib.request

from openai import OpenAI

from conftest import BINARY, DEFAULT_MODEL, MODEL_NAME, REPO

TINY_QWEN3 = REPO / "tests" / "data" / "models" / "tiny-qwen3.gguf"

SPEC = '{"method": "ngram", "num_speculative_tokens": 6, "prompt_lookup_min": 2, "prompt_lookup_max": 4}'
PARAGRAPH = ("The lighthouse stood on a narrow spit of rock at the mouth of the harbour. For more than a century "
             "its lamp had turned every night, warning the fishing boats away from the reef below the surface.")
ASK = [{"role": "user", "content": "Repeat the following paragraph exactly.\n\n" + PARAGRAPH}]


def client(srv) -> OpenAI:
    return OpenAI(base_url=srv.base_url + "/v1", api_key="none", max_retries=0)


def metric(srv, name: str) -> float:
    text = urllib.request.urlopen(srv.base_url + "/metrics", timeout=10).read().decode()
    m = re.search(rf"^{re.escape(name)}{{[^}}]*}} (\S+)$", text, re.M)
    assert m, f"{name} missing from /metrics"
    return float(m.group(1))


def answers(srv) -> list:
    c = client(srv)
    out = []
    for extra in ({"temperature": 0}, {"temperature": 0.8, "seed": 7, "top_p": 0.95}):
        r = c.chat.completions.create(model=MODEL_NAME, messages=ASK, max_tokens=80, **extra)
        out.append((r.choices[0].message.content, r.choices[0].finish_reason, r.usage.completion_tokens))
        stream = c.chat.completions.create(model=MODEL_NAME, messages=ASK, max_tokens=80, stream=True, **extra)
        out.append("".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices))
    return out


def test_ngram_speculation_answers_exactly_as_plain_decoding(server, start_server):
    spec = start_server("--speculative-config", SPEC)
    assert answers(spec) == answers(server)
    drafts = metric(spec, "inferd:spec_decode_num_draft_tokens_total")
    accepted = metric(spec, "inferd:spec_decode_num_accepted_tokens_total")
    assert drafts > 0 and 0 < accepted <= drafts, (drafts, accepted)
    assert metric(server, "inferd:spec_decode_num_draft_tokens_total") == 0


def test_draft_model_speculation_answers_exactly_as_plain_decoding(server, start_server):
    # The model drafting for itself: every confident draft is accepted.
    spec = start_server("--speculative-config",
                        f'{{"model": "{DEFAULT_MODEL}", "num_speculative_tokens": 4, "draft_p_min": 0.5}}')
    assert answers(spec) == answers(server)
    drafts = metric(spec, "inferd:spec_decode_num_draft_tokens_total")
    accepted = metric(spec, "inferd:spec_decode_num_accepted_tokens_total")
    assert drafts > 0 and 0 < accepted <= drafts, (drafts, accepted)


def test_bad_speculative_config_is_refused_at_start_up():
    for config, message in (
            (f'{{"method": "draft_model", "model": "{TINY_QWEN3}", "num_speculative_tokens": 2}}',
             "vocabulary does not match the target's: the tokenizers differ"),
            ('{"method": "draft_model", "model": "/no/such/draft.gguf", "num_speculative_tokens": 2}',
             "cannot load the draft model"),
            ('{"method": "draft_model", "num_speculative_tokens": 2}', "needs 'model'"),
            (f'{{"model": "{DEFAULT_MODEL}", "num_speculative_tokens": 2, "draft_p_min": 2}}',
             "draft_p_min must be between 0 and 1"),
            ('{"method": "eagle", "num_speculative_tokens": 2}', "method 'eagle' is not supported"),
                            ('{"method": "ngram"}', "'num_speculative_tokens' must be given"),
                            ('{"method": "ngram", "num_speculative_tokens": 0}', "num_speculative_tokens must be"),
                            ("[1]", "expected a JSON object")):
        r = subprocess.run([str(BINARY), "serve", "-m", str(DEFAULT_MODEL), "--port", "0", "--speculative-config",
                            config], capture_output=True, text=True, timeout=120)
        assert r.returncode != 0
        assert message in r.stdout + r.stderr, r.stdout + r.stderr
