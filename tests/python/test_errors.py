"""Errors are Python exceptions with the engine's message; Ctrl-C aborts cleanly."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

import inferd
from inferd import SamplingParams

from pkg_support import DEFAULT_MODEL, MAX_MODEL_LEN, wait_idle


def test_bad_sampling_parameters_raise_value_error(llm):
    with pytest.raises(ValueError, match="temperature"):
        llm.generate("Hi", SamplingParams(temperature=-1.0), use_tqdm=False)
    with pytest.raises(ValueError, match="top_p"):
        llm.generate("Hi", SamplingParams(top_p=0.0), use_tqdm=False)
    with pytest.raises(ValueError, match="logprobs"):
        llm.generate("Hi", SamplingParams(logprobs=1000), use_tqdm=False)
    with pytest.raises(ValueError, match="prompt_logprobs"):
        llm.generate("Hi", SamplingParams(prompt_logprobs=1000), use_tqdm=False)
    with pytest.raises(ValueError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=-1)
    with pytest.raises(ValueError, match="n must be"):
        SamplingParams(n=0)
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)


def test_bad_prompts_raise_value_error_and_leave_nothing_running(llm):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.generate([[1, 2, 10**7]], SamplingParams(max_tokens=4), use_tqdm=False)
    with pytest.raises(ValueError):
        llm.generate("Hi", SamplingParams(max_tokens=MAX_MODEL_LEN + 1), use_tqdm=False)
    # The first prompts of a call were added before the bad one was refused: they are aborted.
    with pytest.raises(ValueError):
        llm.generate(["fine", "also fine", [10**7]], SamplingParams(max_tokens=200, ignore_eos=True),
                     use_tqdm=False)
    wait_idle(llm)
    with pytest.raises(TypeError):
        llm.generate([1.5], use_tqdm=False)


def test_bad_engine_arguments():
    with pytest.raises(ValueError, match="cannot load model"):
        inferd.LLM("/nonexistent/model.gguf")
    with pytest.raises(TypeError):  # an engine argument inferd does not have
        inferd.LLM(str(DEFAULT_MODEL), data_parallel_size=2)
    with pytest.raises(ValueError, match="kv_cache_memory"):
        inferd.LLM(str(DEFAULT_MODEL), kv_cache_memory="lots")
    with pytest.raises(ValueError, match="speculative_config"):
        inferd.LLM(str(DEFAULT_MODEL), speculative_config={"method": "eagle", "num_speculative_tokens": 2})
    with pytest.raises(ValueError, match=r"numerics 'turbo' is not a numerics tier: use exact"):
        inferd.LLM(str(DEFAULT_MODEL), numerics="turbo")


def test_bad_kv_cache_dtypes_name_the_argument_and_what_is_supported():
    with pytest.raises(ValueError, match=r"kv_cache_dtype: unknown KV cache dtype 'int4' \(expected one of auto, f16"):
        inferd.LLM(str(DEFAULT_MODEL), kv_cache_dtype="int4")
    with pytest.raises(ValueError, match=r"kv_cache_dtype: KV cache dtype 'fp8_e5m2' is not supported"):
        inferd.LLM(str(DEFAULT_MODEL), kv_cache_dtype="fp8_e5m2")
    # A GGML type the CPU attention kernels do not read: refused with those they do.
    with pytest.raises(ValueError, match=r"KV cache dtype q5_1 is not supported for this model .*; supported: f16"):
        inferd.LLM(str(DEFAULT_MODEL), kv_cache_memory="64M", max_model_len=512, threads=2, kv_cache_dtype="q5_1")


def test_ctrl_c_aborts_the_batch_and_frees_its_blocks(llm):
    prompts = [f"Count from {i} to a million:" for i in range(8)]
    # More tokens than the KV cache holds at once (8 x ~2,000 against ~11,600), so the batch runs for a while.
    params = SamplingParams(temperature=0, max_tokens=MAX_MODEL_LEN - 32, ignore_eos=True)
    before = wait_idle(llm)

    # Ctrl-C once the batch is decoding, not at a fixed time: a fast host once finished the whole batch
    # before a timer fired, and a loaded one may not have added the requests yet.
    def interrupt_once_decoding():
        deadline = time.time() + 60
        while time.time() < deadline and llm.stats()["generation_tokens"] == before["generation_tokens"]:
            time.sleep(0.005)
        os.kill(os.getpid(), signal.SIGINT)

    # Python raises KeyboardInterrupt only if SIGINT had its default handler at start-up: a process started in
    # the background by a shell without job control (nohup ... &) inherits SIGINT ignored.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    interrupter = threading.Thread(target=interrupt_once_decoding)
    interrupter.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            llm.generate(prompts, params, use_tqdm=False)
    finally:
        interrupter.join()
        signal.signal(signal.SIGINT, previous)
    stats = wait_idle(llm)
    # Every request the call had added is aborted. On a loaded host Ctrl-C can
    # come before all eight are in (each add waits for the engine's step):
    # those never start, and none of the call's requests runs on.
    added = stats["requests_added"] - before["requests_added"]
    assert 1 <= added <= len(prompts)
    assert stats["aborted"] - before["aborted"] == added
    # The engine goes on serving.
    out = llm.generate("The capital of France is", SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    assert out[0].outputs[0].finish_reason in ("length", "stop")


@pytest.mark.parametrize("sizes,command", [
    ({"tensor_parallel_size": 2}, "mpirun -np 2 inferd serve MODEL --tensor-parallel-size 2"),
    ({"pipeline_parallel_size": 3}, "mpirun -np 3 inferd serve MODEL --pipeline-parallel-size 3"),
])
def test_a_model_split_across_processes_is_refused_naming_the_command(sizes, command):
    """The Python engine runs in the caller's process: vLLM's tensor_parallel_size / pipeline_parallel_size above
    1 are refused before the model loads, naming the mpirun command that serves the split model."""
    with pytest.raises(ValueError) as e:
        inferd.LLM(str(DEFAULT_MODEL), **sizes)
    name, size = next(iter(sizes.items()))
    assert f"{name}={size}" in str(e.value) and command in str(e.value)
    with pytest.raises(ValueError, match="tensor_parallel_size must be a positive integer"):
        inferd.LLM(str(DEFAULT_MODEL), tensor_parallel_size=0)


def test_parallel_sizes_of_one_run_in_this_process():
    llm = inferd.LLM(str(DEFAULT_MODEL), tensor_parallel_size=1, pipeline_parallel_size=1, max_model_len=256,
                     kv_cache_memory="16M", threads=1)
    out = llm.generate("Hello", SamplingParams(max_tokens=2, temperature=0), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 2


def test_a_block_count_overrides_the_kv_cache_size():
    # vLLM's num_gpu_blocks_override: 37 blocks whatever 16M buys (about 700 of SmolLM2's); one of them is
    # the pool's null block.
    llm = inferd.LLM(str(DEFAULT_MODEL), max_model_len=256, kv_cache_memory="16M", num_gpu_blocks_override=37,
                     threads=1)
    assert llm.stats()["kv_cache_blocks"] == 36
    with pytest.raises(ValueError, match="num_gpu_blocks_override"):
        inferd.LLM(str(DEFAULT_MODEL), max_model_len=256, kv_cache_memory="16M", num_gpu_blocks_override=-1,
                   threads=1)
