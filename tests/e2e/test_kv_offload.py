"""KV offload tiers through the server (issue 20): a multi-turn chat workload
larger than a small KV pool gets its earlier turns back from the host and disk
tiers (the /metrics counters show it) with the same answers as a server whose
pool keeps every block, and a server restarted on the same --kv-store-path
answers an old conversation from its disk tier."""
from __future__ import annotations

import requests

from conftest import start, stop

# The default model's blocks are 368,640 bytes: 12M is 33 blocks (528 tokens),
# while the conversations below reach about 6 x 300 tokens.
SMALL_POOL = ["--kv-cache-memory", "12M"]
CONVERSATIONS = 6
TURNS = 3


def topic(c: int, turn: int) -> str:
    subjects = ["rivers", "mountains", "deserts", "forests", "oceans", "islands", "glaciers"]
    return (f"Conversation {c}, question {turn}: tell me one short fact about {subjects[(c + turn) % 7]} "
            f"and mention the number {c * 10 + turn}. Keep it to one sentence, please, and be precise.")


def chat(srv, messages):
    r = requests.post(srv.base_url + "/v1/chat/completions", headers=srv.headers(), timeout=120,
                      json={"messages": messages, "max_tokens": 16, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def run_workload(srv) -> list[list[dict]]:
    """The turns go round the conversations, so each comes back after the
    others have pushed its blocks out of a small pool."""
    history = [[{"role": "system", "content": "You are a concise assistant."}] for _ in range(CONVERSATIONS)]
    for turn in range(TURNS):
        for c in range(CONVERSATIONS):
            history[c].append({"role": "user", "content": topic(c, turn)})
            history[c].append({"role": "assistant", "content": chat(srv, history[c])})
    return history


def test_tiers_serve_evicted_turns_and_survive_a_restart(start_server, tmp_path):
    store = tmp_path / "kv-store"
    reference = run_workload(start_server())  # 256M: every block stays in the pool

    tiered = start_server(*SMALL_POOL, "--kv-offload-size", "64M", "--kv-store-path", str(store))
    assert run_workload(tiered) == reference
    assert tiered.metric("inferd:kv_offload_hits_total", tier="host") > 0
    assert tiered.metric("inferd:kv_offload_saves_total", tier="host") > 0
    assert tiered.metric("inferd:kv_offload_saves_total", tier="disk") > 0
    assert tiered.metric("inferd:external_prefix_cache_hits_total") > 0
    assert tiered.metric("inferd:kv_offload_dropped_blocks_total") == 0
    assert stop(tiered) == 0

    # Restarted on the same store: the first conversation, asked again, is
    # found on disk (nothing is in the new pool or host tier yet).
    again = start_server(*SMALL_POOL, "--kv-offload-size", "64M", "--kv-store-path", str(store))
    assert again.metric("inferd:kv_offload_blocks", tier="disk") > 0
    assert chat(again, reference[0][:-1]) == reference[0][-1]["content"]
    assert again.metric("inferd:kv_offload_hits_total", tier="disk") > 0
    assert again.metric("inferd:external_prefix_cache_hits_total") > 0


def test_bad_offload_flags_are_refused(tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file")
    for args, needle in [(["--kv-offload-size", "lots"], "--kv-offload-size"),
                         (["--kv-store-path", str(blocker)], "KV store directory"),
                         (["--kv-offload-size", "64M", "--no-enable-prefix-caching"], "prefix caching")]:
        srv = start(tmp_path, args, wait_ready=False)
        assert srv.process.wait(timeout=60) != 0
        assert needle in srv.log(), srv.log()
