"""Pipeline parallelism under mpirun (issue 40): `mpirun -np P inferd serve|generate --pipeline-parallel-size P`.

A pipeline runs the same kernels on the same numbers in the same order as one process, so its outputs are
compared for equality with a single process's: greedy and seeded sampling, streamed and not, many requests at
once. Also: the sizes that cannot run are refused with the rule, and a stage that dies ends the run.

OpenMPI refuses to run as root without OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM), and a 2-core machine has fewer slots
than ranks without --oversubscribe; each rank runs one compute thread.
"""
from __future__ import annotations

import concurrent.futures
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import time

import openai
import pytest

from conftest import BINARY, DEFAULT_MODEL, MODEL_NAME, REPO, Server, require_model, stop
import mpi_ranks
from mpi_ranks import MPI_ENV, mpirun, stop_ranks, wait_for_pid

TINY = REPO / "tests" / "data" / "models"

pytestmark = pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun is missing: scripts/setup.sh installs OpenMPI")


def serve(tmp: pathlib.Path, ranks: int, model: pathlib.Path = DEFAULT_MODEL) -> Server:
    return mpi_ranks.serve(tmp, model, ranks, "--pipeline-parallel-size")


def generate(model: pathlib.Path, ranks: int, *flags: str, timeout: float = 120) -> subprocess.CompletedProcess:
    size = ["--pipeline-parallel-size", str(ranks)] if ranks > 1 else []
    return mpi_ranks.generate(model, ranks, *flags, *size, timeout=timeout)


# 32 requests: greedy and seeded sampling (with penalties), completions and chat, streamed and not, some with
# logprobs, prompts of different lengths so prefills and decodes share steps.
def request_specs() -> list[dict]:
    specs = []
    for i in range(32):
        sampled = i % 2 == 1
        spec = {"prompt": f"Request {i}: " + "tell me about the sea and the mountains. " * (1 + i % 5),
                "max_tokens": 12 + i % 7, "stream": i % 4 >= 2, "chat": i % 3 == 0,
                "temperature": 0.9 if sampled else 0.0, "seed": 1000 + i if sampled else None,
                "frequency_penalty": 0.3 if i % 5 == 0 else 0.0, "logprobs": i % 6 == 1}
        specs.append(spec)
    return specs


def run_one(client: openai.OpenAI, spec: dict) -> dict:
    common = dict(model=MODEL_NAME, max_tokens=spec["max_tokens"], temperature=spec["temperature"],
                  frequency_penalty=spec["frequency_penalty"])
    if spec["seed"] is not None:
        common["seed"] = spec["seed"]
    if spec["chat"]:
        kw = dict(common, messages=[{"role": "user", "content": spec["prompt"]}])
        if spec["logprobs"]:
            kw.update(logprobs=True, top_logprobs=2)
        if spec["stream"]:
            text, lps = "", []
            for chunk in client.chat.completions.create(stream=True, **kw):
                if chunk.choices:
                    text += chunk.choices[0].delta.content or ""
                    if chunk.choices[0].logprobs and chunk.choices[0].logprobs.content:
                        lps += [(t.token, t.logprob) for t in chunk.choices[0].logprobs.content]
            return {"text": text, "logprobs": lps}
        r = client.chat.completions.create(**kw)
        lps = [(t.token, t.logprob) for t in r.choices[0].logprobs.content] if spec["logprobs"] else []
        return {"text": r.choices[0].message.content, "logprobs": lps, "finish": r.choices[0].finish_reason}
    kw = dict(common, prompt=spec["prompt"])
    if spec["logprobs"]:
        kw["logprobs"] = 2
    if spec["stream"]:
        text, lps = "", []
        for chunk in client.completions.create(stream=True, **kw):
            if chunk.choices:
                text += chunk.choices[0].text
                if chunk.choices[0].logprobs:
                    lps += list(zip(chunk.choices[0].logprobs.tokens, chunk.choices[0].logprobs.token_logprobs))
        return {"text": text, "logprobs": lps}
    r = client.completions.create(**kw)
    lps = list(zip(r.choices[0].logprobs.tokens, r.choices[0].logprobs.token_logprobs)) if spec["logprobs"] else []
    return {"text": r.choices[0].text, "logprobs": lps, "finish": r.choices[0].finish_reason}


def run_all(srv: Server) -> list[dict]:
    client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="none", max_retries=0, timeout=300)
    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        return list(pool.map(lambda s: run_one(client, s), request_specs()))


QWEN = DEFAULT_MODEL.parent / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"


# Stages balanced by bytes, the first and last sharing the tied head (half its vocabulary rows each):
# SmolLM2's 30 equal layers and Qwen2.5-Coder-0.5B's 24 split evenly.
@pytest.mark.parametrize("model,rank1", [
    (DEFAULT_MODEL, r"layers \[15, 30\), head rows \[24576, 49152\)"),
    (QWEN, r"layers \[12, 24\), head rows \[75968, 151936\)"),
], ids=["smollm2", "qwen2.5-coder-0.5b"])
def test_pipeline_serves_what_one_process_serves(tmp_path, model, rank1):
    """32 concurrent mixed requests: two stages give every output bit for bit."""
    require_model(model)
    one = serve(tmp_path, 1, model)
    try:
        expected = run_all(one)
    finally:
        assert stop(one) == 0, one.log()[-3000:]
    two = serve(tmp_path, 2, model)
    try:
        got = run_all(two)
        log = two.log()
    finally:
        code = stop_ranks(two)
    assert code == 0, two.log()[-3000:]
    assert re.search(r"rank 1 \(pid \d+\): pipeline stage of " + rank1, log), log[-3000:]
    assert all(e["text"] for e in expected)
    for spec, e, g in zip(request_specs(), expected, got):
        assert g == e, spec


@pytest.mark.parametrize("model,ranks", [("tiny-llama3", 2), ("tiny-gemma3", 2), ("tiny-gemma3", 3),
                                         ("tiny-qwen3moe", 2), ("tiny-qwen3moe", 3)])
def test_generate_pipeline_matches_one_process(model, ranks):
    """generate --json: greedy and seeded sampling, across 2 and 3 stages (qwen3moe's 3 layers over 3: a middle
    stage that receives and sends the stream); gemma3's windowed KV groups and sandwich norms cross a boundary."""
    path = TINY / f"{model}.gguf"
    for flags in (["--temp", "0"], ["--temp", "1.0", "--seed", "7", "--top-k", "0", "--top-p", "1", "--min-p", "0"]):
        common = ["-p", "Once upon a time", "-n", "24", "--ignore-eos", "--json", *flags]
        one = generate(path, 1, *common)
        assert one.returncode == 0, one.stderr
        split = generate(path, ranks, *common)
        assert split.returncode == 0, split.stdout + split.stderr
        # The ranks' log lines share stdout (each stage's wait, logged at the end, comes after the result).
        result = next(line for line in split.stdout.splitlines() if line.startswith("{"))
        assert json.loads(result)["ids"] == json.loads(one.stdout)["ids"]


def test_a_given_layer_partition_runs_and_a_wrong_one_is_refused():
    """--pipeline-layer-partition sets each stage's layers (the same bits as one process), each stage logs how
    long it waited, and counts that do not add up to the model's layers are refused with the rule."""
    common = ["-p", "Once upon a time", "-n", "16", "--ignore-eos", "--json", "--temp", "0"]
    one = generate(DEFAULT_MODEL, 1, *common)
    assert one.returncode == 0, one.stderr
    split = generate(DEFAULT_MODEL, 2, *common, "--pipeline-layer-partition", "10,20")
    out = split.stdout + split.stderr
    assert split.returncode == 0, out
    assert re.search(r"rank 1 \(pid \d+\): pipeline stage of layers \[10, 30\)", out), out[-3000:]
    assert re.search(r"rank 1: \d+ steps in the pipeline; waited [\d.]+ s of [\d.]+ s", out), out[-3000:]
    result = next(line for line in split.stdout.splitlines() if line.startswith("{"))
    assert json.loads(result)["ids"] == json.loads(one.stdout)["ids"]
    wrong = generate(DEFAULT_MODEL, 2, "-p", "hi", "-n", "1", "--pipeline-layer-partition", "10,10")
    assert wrong.returncode != 0
    assert "--pipeline-layer-partition 10,10: the counts add up to 20, and this model has 30 layers" in \
        wrong.stdout + wrong.stderr, wrong.stdout + wrong.stderr


def test_pipeline_without_mpirun_is_refused():
    r = generate(TINY / "tiny-llama3.gguf", 1, "-p", "hi", "-n", "1", "--pipeline-parallel-size", "2")
    assert r.returncode == 2
    assert "mpirun -np 2" in r.stderr, r.stderr


def test_process_count_must_equal_the_sizes():
    args = mpirun(2) + [str(BINARY), "generate", "-m", str(TINY / "tiny-llama3.gguf"), "-p", "hi", "-n", "1"]
    r = subprocess.run(args, capture_output=True, text=True, env=MPI_ENV, timeout=60)
    assert r.returncode != 0
    assert "mpirun started 2 processes" in r.stderr and "must equal" in r.stderr, r.stderr


def test_more_stages_than_layers_are_refused():
    r = generate(TINY / "tiny-llama3.gguf", 3, "-p", "hi", "-n", "1")  # 2 layers
    assert r.returncode != 0
    assert "a pipeline of 3 stages needs at least 3 layers" in r.stderr, r.stdout + r.stderr


def test_a_stage_that_dies_ends_the_server(tmp_path):
    """Rank 1 killed mid-stream: rank 0 fails the stream with an error, answers /health 503 naming rank 1, then
    the job exits non-zero with the message (mpirun's SIGTERM, about 1 s after the loss, cuts the grace short)."""
    seen = mpi_ranks.kill_a_rank_mid_stream(serve(tmp_path, 2))
    print(f"exit {seen['exit_code']} after {seen['seconds_to_exit']:.2f} s; /health: {seen['health'][-1]}")
    mpi_ranks.assert_lost_rank_reported(seen)
    assert re.search(r"rank 1 .*(exited on signal 9|killed)", seen["log"], re.IGNORECASE | re.DOTALL)


def test_a_stage_that_dies_ends_generate():
    """generate with rank 1 killed while it runs: rank 0 says which rank ended and ends the job at once."""
    args = mpirun(2) + [str(BINARY), "generate", "-m", str(DEFAULT_MODEL), "-p", "The sea", "-n", "1500", "-c", "2048",
                        "--ignore-eos", "--threads", "1", "--pipeline-parallel-size", "2"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=MPI_ENV, text=True)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if m := re.search(r"rank 1 \(pid (\d+)\)", line):
                time.sleep(0.5)  # generating (or still loading: the watch starts before rank 0 loads)
                os.kill(int(m.group(1)), signal.SIGKILL)
                break
        lines += proc.communicate(timeout=60)[0].splitlines(keepends=True)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = "".join(lines)
    assert proc.returncode != 0
    assert re.search(r"rank 1 \(pid \d+ on .*\) ended: the model cannot run without it; ending every rank", out), \
        out[-3000:]
