"""What LLM and AsyncLLM share: opening the engine from vLLM-named arguments,
turning prompts and SamplingParams into engine requests, and engine outputs
into RequestOutputs. Nothing here samples, stops or renders templates: the C++
engine does (inferd._core)."""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass, replace
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from . import _core
from .outputs import CompletionOutput, Logprob, PromptLogprobs, RequestMetrics, RequestOutput
from .sampling_params import RequestOutputKind, SamplingParams

#: A prompt: text, token ids, or vLLM's dicts {"prompt": text} / {"prompt_token_ids": ids}.
PromptType = Union[str, Sequence[int], Mapping[str, Any]]
#: A chat message, OpenAI's shape: {"role": ..., "content": ...} (plus tool_calls / tool_call_id).
ChatMessage = Mapping[str, Any]


class EngineError(RuntimeError):
    """The engine gave up on a request (its message says why)."""


def default_model() -> str:
    """Where ``scripts/fetch_models.sh`` puts the default model (as the ``inferd`` binary looks)."""
    model_dir = os.environ.get("INFERD_MODEL_DIR") or os.path.join(os.path.expanduser("~"), ".cache/inferd/models")
    return os.path.join(model_dir, "SmolLM2-135M-Instruct.Q4_1.gguf")


@dataclass
class EngineArgs:
    """The engine's arguments, named as vLLM's (and as ``inferd serve``'s flags).

    The engine checks them (``ValueError`` with its message); an argument
    inferd does not know is a ``TypeError``, as for any Python call.
    """

    max_model_len: Optional[int] = None  #: prompt + output tokens at most; None: the model's context
    max_num_seqs: int = 128  #: requests running at once
    max_num_batched_tokens: int = 2048  #: the token budget of one engine step
    enable_prefix_caching: bool = True  #: reuse the KV cache of shared prompt prefixes
    #: KV cache size: bytes, or text such as "512M" or "2G"; None: kv_cache_memory_fraction of free memory
    kv_cache_memory: Optional[Union[int, str]] = None
    kv_cache_memory_fraction: float = 0.25
    #: this many KV-cache blocks instead of what the size buys (vLLM's num_gpu_blocks_override); None: none
    num_gpu_blocks_override: Optional[int] = None
    block_size: int = 16  #: tokens per KV-cache block
    #: vLLM's speculative decoding config, e.g. {"method": "ngram", "num_speculative_tokens": 4}
    speculative_config: Optional[Union[Mapping[str, Any], str]] = None
    max_logprobs: int = 20  #: the largest ``SamplingParams.logprobs`` allowed
    long_prefill_token_threshold: int = 0  #: > 0: the most tokens of one prompt per step
    #: projection multiply-adds one attention multiply-add costs: chunks deep
    #: in a long prompt shorten to keep steps level (0: sized by tokens alone)
    chunk_attention_cost: float = 2.0
    threads: Optional[int] = None  #: the forward pass's threads; None: one per hardware thread
    chat_template: Optional[str] = None  #: a template file overriding the model's
    #: seeds the requests that have no seed of their own, so that a script repeats its samples
    seed: Optional[int] = None
    #: host-memory tier for prefix blocks the KV cache evicts: bytes or "4G"; None: none
    kv_offload_size: Optional[Union[int, str]] = None
    kv_store_path: Optional[str] = None  #: disk tier's directory (found again after a restart); None: none
    kv_store_size: Union[int, str] = "10G"  #: the disk tier's bound
    #: the KV cache's element type: "auto" (f16), "f16", "bf16", "q8_0", "q4_0", ... (vLLM's name; llama.cpp's
    #: types). q8_0 holds about 1.9x and q4_0 3.5x the tokens of f16 in the same memory, at a small cost in accuracy
    kv_cache_dtype: str = "auto"
    #: layers whose cache stays f16 whatever ``kv_cache_dtype`` says (vLLM's name): "sliding_window" (Gemma 3's
    #: local layers, gpt-oss's windowed ones); a list of kinds is accepted too. None: none
    kv_cache_dtype_skip_layers: Optional[Union[str, List[str]]] = None
    #: the kernels' arithmetic: "exact" (bit-identical with llama.cpp's CPU build) or "fast" (activations quantized
    #: once per row, integer sums per weight block; differs from exact by the activation quantization's error).
    #: None: the engine's default (exact; kernels/cpu/numerics.h says why)
    numerics: Optional[str] = None
    #: vLLM's names, for a model split across processes. The Python engine runs in the calling process, so only 1
    #: is accepted; a split model is served by ``mpirun -np N inferd serve`` (see ``check_parallel_sizes``)
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1


def check_parallel_sizes(args: EngineArgs) -> None:
    """Refuses a model split across processes, saying how to run one.

    inferd splits a model across MPI ranks that ``mpirun`` starts, each a whole ``inferd`` process whose rank 0
    serves; the Python engine lives inside the caller's process, which no launcher started and which cannot be
    several ranks at once. So ``LLM(tensor_parallel_size=N)`` is refused, naming the command that runs the split
    model (reached with any OpenAI client), rather than silently running on one process.
    """
    sizes = {"tensor_parallel_size": args.tensor_parallel_size, "pipeline_parallel_size": args.pipeline_parallel_size}
    for name, size in sizes.items():
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"{name} must be a positive integer, not {size!r}")
    split = {name: size for name, size in sizes.items() if size > 1}
    if split:
        ranks = args.tensor_parallel_size * args.pipeline_parallel_size
        given = ", ".join(f"{name}={size}" for name, size in split.items())
        flags = " ".join(f"--{name.replace('_', '-')} {size}" for name, size in split.items())
        raise ValueError(
            f"{given}: the Python engine runs in this one "
            f"process and cannot be split across processes. Serve the split model with "
            f"`mpirun -np {ranks} inferd serve MODEL {flags}` and use it through its OpenAI API "
            f"(e.g. openai.OpenAI(base_url='http://127.0.0.1:8000/v1'))")


def open_session(model: Optional[str], args: EngineArgs) -> "_core.Session":
    """Loads the model and starts the engine's loop; ``ValueError`` with the engine's message on failure."""
    check_parallel_sizes(args)
    core = _core.EngineArgs()
    core.max_model_len = args.max_model_len or 0
    core.max_num_seqs = args.max_num_seqs
    core.max_num_batched_tokens = args.max_num_batched_tokens
    core.enable_prefix_caching = bool(args.enable_prefix_caching)
    core.kv_cache_memory = "" if args.kv_cache_memory is None else str(args.kv_cache_memory)
    core.kv_cache_memory_fraction = float(args.kv_cache_memory_fraction)
    core.num_gpu_blocks_override = int(args.num_gpu_blocks_override or 0)
    core.block_size = args.block_size
    spec = args.speculative_config
    core.speculative_config = json.dumps(dict(spec)) if isinstance(spec, Mapping) else (spec or "")
    core.max_logprobs = args.max_logprobs
    core.long_prefill_token_threshold = args.long_prefill_token_threshold
    core.chunk_attention_cost = args.chunk_attention_cost
    core.kv_offload_size = "" if args.kv_offload_size is None else str(args.kv_offload_size)
    core.kv_store_path = os.fspath(args.kv_store_path) if args.kv_store_path else ""
    core.kv_store_size = str(args.kv_store_size)
    core.kv_cache_dtype = str(args.kv_cache_dtype)
    skip = args.kv_cache_dtype_skip_layers
    core.kv_cache_dtype_skip_layers = ",".join(skip) if isinstance(skip, (list, tuple)) else (skip or "")
    if args.numerics is not None:
        core.numerics = str(args.numerics)
    return _core.Session(
        model=os.fspath(model) if model is not None else default_model(),
        args=core,
        threads=int(args.threads or 0),
        chat_template=os.fspath(args.chat_template) if args.chat_template else "",
    )


def stats_of(session: "_core.Session") -> Dict[str, Any]:
    return json.loads(session.stats_json())


class Prompt:
    """A prompt as the engine takes it: token ids, and the text when it was given as text."""

    __slots__ = ("text", "token_ids")

    def __init__(self, text: Optional[str], token_ids: List[int]):
        self.text = text
        self.token_ids = token_ids


def to_prompt(session: "_core.Session", prompt: PromptType) -> Prompt:
    """Tokenizes a text prompt as the server's /v1/completions does (BOS added, special tokens parsed)."""
    if isinstance(prompt, str):
        return Prompt(prompt, session.encode(prompt, True, True))
    if isinstance(prompt, Mapping):
        if "prompt_token_ids" in prompt:
            return Prompt(prompt.get("prompt"), [int(t) for t in prompt["prompt_token_ids"]])
        if "prompt" in prompt:
            return to_prompt(session, prompt["prompt"])
        raise ValueError("a prompt dict needs 'prompt' or 'prompt_token_ids'")
    if isinstance(prompt, Sequence) and all(isinstance(t, int) for t in prompt):
        return Prompt(None, list(prompt))
    raise TypeError(f"a prompt is a str, a list of token ids or a dict, not {type(prompt).__name__}")


def to_prompts(session: "_core.Session", prompts: Union[PromptType, Sequence[PromptType]]) -> List[Prompt]:
    """One prompt or a list of them (a flat list of ints is one prompt of token ids)."""
    if isinstance(prompts, (str, Mapping)):
        return [to_prompt(session, prompts)]
    if isinstance(prompts, Sequence) and prompts and all(isinstance(t, int) for t in prompts):
        return [to_prompt(session, prompts)]
    return [to_prompt(session, p) for p in prompts]


def per_prompt(params: Union[SamplingParams, Sequence[SamplingParams], None], n: int) -> List[SamplingParams]:
    if params is None:
        return [SamplingParams()] * n
    if isinstance(params, SamplingParams):
        return [params] * n
    params = list(params)
    if len(params) != n:
        raise ValueError(f"{len(params)} sampling params for {n} prompts; give one, or one per prompt")
    return params


class Seeder:
    """The engine-wide ``seed``: requests without a seed of their own get one drawn
    from it, so that a script run twice samples the same tokens. Without it they
    stay unseeded (random)."""

    def __init__(self, seed: Optional[int]):
        self._rng = random.Random(seed) if seed is not None else None

    def seed_for(self, params: SamplingParams) -> Optional[int]:
        if params.seed is not None or self._rng is None:
            return params.seed
        return self._rng.getrandbits(63)


def make_params(
    session: "_core.Session",
    prompt: Prompt,
    params: SamplingParams,
    seed: Optional[int],
    request_id: str = "",
) -> "_core.GenerationParams":
    max_tokens = params.max_tokens
    if max_tokens is None:  # vLLM: up to the context length
        max_tokens = max(1, session.max_model_len - len(prompt.token_ids))
    return _core.make_params(
        prompt_token_ids=prompt.token_ids,
        temperature=float(params.temperature),
        top_p=float(params.top_p),
        top_k=int(params.top_k),
        min_p=float(params.min_p),
        repetition_penalty=float(params.repetition_penalty),
        frequency_penalty=float(params.frequency_penalty),
        presence_penalty=float(params.presence_penalty),
        seed=seed,
        max_tokens=int(max_tokens),
        stop=params.stop_strings,
        stop_token_ids=[int(t) for t in (params.stop_token_ids or [])],
        ignore_eos=bool(params.ignore_eos),
        logprobs=-1 if params.logprobs is None else int(params.logprobs),
        skip_special_tokens=bool(params.skip_special_tokens),
        request_id=request_id,
        prompt_logprobs=-1 if params.prompt_logprobs is None else int(params.prompt_logprobs),
    )


def chat_messages(conversation: Sequence[ChatMessage]) -> List[Tuple[str, str, str, str]]:
    """OpenAI-shaped messages as the engine's chat template takes them: content
    parts joined into text, an assistant's tool calls as JSON (arguments given
    as a JSON string passed as the object, as templates expect)."""
    out = []
    for m in conversation:
        if not isinstance(m, Mapping) or "role" not in m:
            raise ValueError("a chat message is a dict with 'role' and 'content'")
        content = m.get("content")
        if content is None:
            text = ""
        elif isinstance(content, str):
            text = content
        elif isinstance(content, Sequence):
            parts = []
            for part in content:
                if not isinstance(part, Mapping) or part.get("type") != "text":
                    raise ValueError("only text content parts ({'type': 'text', 'text': ...}) are supported")
                parts.append(str(part.get("text", "")))
            text = "".join(parts)
        else:
            raise ValueError("a message's content is a string or a list of text parts")
        tool_calls = ""
        if m.get("tool_calls"):
            calls = []
            for call in m["tool_calls"]:
                call = dict(call)
                fn = dict(call.get("function", {}))
                args = fn.get("arguments")
                if isinstance(args, str):
                    try:
                        parsed = json.loads(args)
                        if isinstance(parsed, dict):
                            fn["arguments"] = parsed
                    except ValueError:
                        pass
                call["function"] = fn
                calls.append(call)
            tool_calls = json.dumps(calls)
        out.append((str(m["role"]), text, tool_calls, str(m.get("tool_call_id") or "")))
    return out


def render_chat(
    session: "_core.Session",
    conversation: Sequence[ChatMessage],
    add_generation_prompt: bool = True,
    chat_template: Optional[str] = None,
    template_vars: Optional[Mapping[str, Any]] = None,
    tools: Optional[Sequence[Mapping[str, Any]]] = None,
) -> Prompt:
    """A conversation through the chat template, rendered and tokenized by the
    engine as the server's /v1/chat/completions does; ``chat_template`` is a
    template's text overriding the model's."""
    text, ids = session.render_chat(
        chat_messages(conversation),
        add_generation_prompt,
        json.dumps(dict(template_vars)) if template_vars else "",
        json.dumps(list(tools)) if tools else "",
        chat_template or "",
    )
    return Prompt(text, ids)


def is_conversation(messages: Any) -> bool:
    return isinstance(messages, Sequence) and (not messages or isinstance(messages[0], Mapping))


def convert_logprobs(session: "_core.Session", raw: List[tuple]) -> List[Dict[int, Logprob]]:
    """Engine logprobs -> vLLM's shape: per token, the sampled token and the most likely ones."""
    out = []
    for token, logprob, rank, top in raw:
        entry = {token: Logprob(logprob, rank, session.token_piece(token))}
        for i, (t, lp) in enumerate(top):
            if t not in entry:
                entry[t] = Logprob(lp, i + 1, session.token_piece(t))
        out.append(entry)
    return out


def convert_prompt_logprobs(session: "_core.Session", raw: List[tuple]) -> PromptLogprobs:
    """Engine prompt logprobs -> vLLM's shape: None for the first prompt token, then as convert_logprobs."""
    return [None] + convert_logprobs(session, raw)


def metrics_of(raw: tuple) -> RequestMetrics:
    return RequestMetrics(*raw)


def check_error(out: "_core.Output") -> None:
    if out.error:
        raise EngineError(out.error)


class Assembler:
    """Turns the engine outputs of one request's ``n`` choices into RequestOutputs,
    as ``output_kind`` asks (streaming)."""

    def __init__(
        self,
        session: "_core.Session",
        request_id: str,
        prompt: Prompt,
        engine_ids: List[str],
        params: SamplingParams,
        kind: RequestOutputKind,
    ):
        self._session = session
        self.request_id = request_id
        self._prompt = prompt
        self._index = {eid: k for k, eid in enumerate(engine_ids)}
        self._want_logprobs = params.logprobs is not None
        # Every choice's engine request scores the same prompt: the first one's are kept.
        self._prompt_logprobs: Optional[PromptLogprobs] = [None] if params.prompt_logprobs is not None else None
        self._kind = kind
        self.choices = [
            CompletionOutput(index=k, text="", token_ids=[], logprobs=[] if self._want_logprobs else None,
                             cumulative_logprob=0.0 if self._want_logprobs else None)
            for k in range(len(engine_ids))
        ]
        self.unfinished = len(engine_ids)
        self._metrics: Optional[RequestMetrics] = None

    @property
    def finished(self) -> bool:
        return self.unfinished == 0

    def update(self, out: "_core.Output") -> Optional[RequestOutput]:
        """Folds one engine output in; returns what to yield for it, if anything."""
        check_error(out)
        k = self._index[out.request_id]
        c = self.choices[k]
        if self._prompt_logprobs is not None and k == 0:
            self._prompt_logprobs.extend(convert_logprobs(self._session, out.prompt_logprobs))
        text, token_ids = out.text, out.token_ids
        logprobs = convert_logprobs(self._session, out.logprobs) if self._want_logprobs else None
        c.text += text
        c.token_ids.extend(token_ids)
        if logprobs is not None:
            c.logprobs.extend(logprobs)
            c.cumulative_logprob += sum(entry[t].logprob for entry, t in zip(logprobs, token_ids))
        if out.finished:
            c.finish_reason = out.finish_reason
            c.stop_reason = out.stop_string
            self.unfinished -= 1
            self._metrics = metrics_of(out.metrics)
        if self._kind == RequestOutputKind.FINAL_ONLY and not self.finished:
            return None
        if self._kind == RequestOutputKind.DELTA:
            delta = replace(c, text=text, token_ids=list(token_ids), logprobs=logprobs)
            return self._output([delta])
        return self._output([replace(x, token_ids=list(x.token_ids),
                                     logprobs=None if x.logprobs is None else list(x.logprobs))
                             for x in self.choices])

    def _output(self, outputs: List[CompletionOutput]) -> RequestOutput:
        m = self._metrics
        return RequestOutput(
            request_id=self.request_id,
            prompt=self._prompt.text,
            prompt_token_ids=self._prompt.token_ids,
            outputs=outputs,
            finished=self.finished,
            num_cached_tokens=m.num_cached_tokens if m else None,
            metrics=m,
            prompt_logprobs=None if self._prompt_logprobs is None else list(self._prompt_logprobs),
        )


def completion_of(session: "_core.Session", index: int, whole: "_core.Output", want_logprobs: bool) -> CompletionOutput:
    """A finished choice from its whole engine output (LLM.generate)."""
    check_error(whole)
    logprobs = convert_logprobs(session, whole.logprobs) if want_logprobs else None
    cumulative = None
    if logprobs is not None:
        cumulative = sum(entry[t].logprob for entry, t in zip(logprobs, whole.token_ids))
    return CompletionOutput(
        index=index,
        text=whole.text,
        token_ids=list(whole.token_ids),
        cumulative_logprob=cumulative,
        logprobs=logprobs,
        finish_reason=whole.finish_reason,
        stop_reason=whole.stop_string,
    )
