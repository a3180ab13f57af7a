"""Offline inference: vLLM's ``LLM`` on inferd's engine."""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

from . import _core
from ._engine import (
    Assembler,
    ChatMessage,
    EngineArgs,
    Prompt,
    PromptType,
    Seeder,
    check_error,
    completion_of,
    convert_prompt_logprobs,
    is_conversation,
    make_params,
    metrics_of,
    open_session,
    per_prompt,
    render_chat,
    stats_of,
    to_prompt,
    to_prompts,
)
from .outputs import EmbeddingOutput, EmbeddingRequestOutput, RequestOutput
from .sampling_params import RequestOutputKind, SamplingParams
from .tokenizer import Tokenizer

# How long a wait for the engine lasts before Python gets the GIL back (to
# draw the progress bar, and to raise KeyboardInterrupt on Ctrl-C).
_WAIT_SECONDS = 0.1


class LLM:
    """A model and its engine, for offline batches (vLLM's ``LLM``).

    The engine runs on its own thread, the same continuous-batching loop as
    ``inferd serve``: every prompt of a ``generate`` call is added at once and
    they share each forward pass. The GIL is released while the engine works.

    Args:
        model: a GGUF file (default: the default model of ``scripts/setup.sh``).
        **engine_args: :class:`EngineArgs` by name, vLLM's names:
            ``max_model_len``, ``max_num_seqs``, ``max_num_batched_tokens``,
            ``enable_prefix_caching``, ``seed``, ``kv_cache_memory`` (bytes or
            "2G"), ``kv_cache_dtype`` ("auto", "q8_0", "q4_0", ...),
            ``kv_cache_dtype_skip_layers`` ("sliding_window": those layers f16),
            ``speculative_config`` (vLLM's dict), ``threads``, ``numerics``
            ("exact", the default: llama.cpp's bits; "fast": integer kernels),
            ``tensor_parallel_size`` and ``pipeline_parallel_size`` (1 only: the
            engine runs in this process; a split model is served by ``mpirun -np
            N inferd serve``, and a larger size is refused saying so), ...

    Raises:
        ValueError: the model cannot be loaded, or an argument is out of range
            (the engine's message).
        TypeError: an argument inferd does not know.
    """

    def __init__(self, model: Optional[str] = None, **engine_args: Any) -> None:
        args = EngineArgs(**engine_args)
        self._session = open_session(model, args)
        self._seeder = Seeder(args.seed)
        self._tokenizer = Tokenizer(self._session)

    # ---- generation ----------------------------------------------------------

    def generate(
        self,
        prompts: Union[PromptType, Sequence[PromptType]],
        sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
        *,
        use_tqdm: bool = True,
    ) -> List[RequestOutput]:
        """Completes every prompt, all through the engine together.

        Args:
            prompts: a text, a list of token ids, vLLM's ``{"prompt": ...}`` or
                ``{"prompt_token_ids": [...]}``, or a list of these.
            sampling_params: one for all prompts, or one per prompt (default:
                ``SamplingParams()``, vLLM's defaults).
            use_tqdm: draw a progress bar of finished requests on stderr.

        Returns:
            One ``RequestOutput`` per prompt, in input order, each with ``n``
            completions.

        Raises:
            ValueError: a bad parameter or prompt (nothing is left running).
            EngineError: the engine gave up on a request.
            KeyboardInterrupt: on Ctrl-C, after every request of the call has
                been aborted (their KV blocks are freed within one step).
        """
        return self._run(to_prompts(self._session, prompts), sampling_params, use_tqdm)

    def chat(
        self,
        messages: Union[Sequence[ChatMessage], Sequence[Sequence[ChatMessage]]],
        sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
        *,
        use_tqdm: bool = True,
        chat_template: Optional[str] = None,
        add_generation_prompt: bool = True,
        chat_template_kwargs: Optional[Dict[str, Any]] = None,
        tools: Optional[List[Dict[str, Any]]] = None,
    ) -> List[RequestOutput]:
        """Answers one conversation, or a list of them, through the chat template.

        The conversation is rendered and tokenized exactly as ``inferd serve``'s
        /v1/chat/completions does (special-token text inside a message stays
        text). ``chat_template`` is a template's text overriding the model's.
        Returns one ``RequestOutput`` per conversation; its ``prompt`` is the
        rendered text.
        """
        conversations = [messages] if is_conversation(messages) else list(messages)
        prompts = [
            render_chat(self._session, c, add_generation_prompt, chat_template, chat_template_kwargs, tools)
            for c in conversations
        ]
        return self._run(prompts, sampling_params, use_tqdm)

    def stream(
        self,
        prompt: PromptType,
        sampling_params: Optional[SamplingParams] = None,
    ) -> Iterator[RequestOutput]:
        """Streams one request: yields a ``RequestOutput`` holding only what is
        new (vLLM's DELTA kind), for each choice as it grows; the last one of
        each choice has its ``finish_reason``. Closing the generator (or Ctrl-C)
        aborts what is unfinished."""
        params = sampling_params or SamplingParams()
        p = to_prompt(self._session, prompt)
        group = _core.RequestGroup(self._session)
        try:
            ids = group.add(make_params(self._session, p, params, self._seeder.seed_for(params)), params.n)
            assembler = Assembler(self._session, ids[0], p, ids, params, RequestOutputKind.DELTA)
            while not assembler.finished:
                for out in group.poll(_WAIT_SECONDS):
                    result = assembler.update(out)
                    if result is not None:
                        yield result
        finally:
            group.abort_unfinished()

    # ---- embeddings ------------------------------------------------------------

    def embed(
        self,
        prompts: Union[PromptType, Sequence[PromptType]],
        *,
        use_tqdm: bool = True,
    ) -> List[EmbeddingRequestOutput]:
        """Embeds every prompt, all through the engine together (vLLM's ``LLM.embed``).

        The model must be an embedding GGUF (a pooling type: a bert encoder such
        as all-MiniLM-L6-v2, or a decoder such as Qwen3-Embedding); each
        prompt's hidden states are pooled as the GGUF says and L2-normalized,
        the vectors ``inferd serve``'s /v1/embeddings returns. Text prompts are
        tokenized as there (BOS/EOS as the vocabulary says, special tokens parsed).

        Returns:
            One ``EmbeddingRequestOutput`` per prompt, in input order:
            ``.outputs.embedding`` (a list of floats) and ``.prompt_token_ids``.

        Raises:
            ValueError: the model cannot embed, or a prompt is empty or too long.
            EngineError: the engine gave up on a request.
        """
        prompts_ = to_prompts(self._session, prompts)
        group = _core.RequestGroup(self._session)
        try:
            ids = [group.add(_core.make_embed_params(p.token_ids), 1)[0] for p in prompts_]
            _wait_for_group(group, len(ids), use_tqdm)
        except BaseException:
            group.abort_unfinished()
            raise
        outputs = []
        for k, (p, engine_id) in enumerate(zip(prompts_, ids)):
            whole = group.whole(engine_id)
            check_error(whole)
            outputs.append(EmbeddingRequestOutput(request_id=str(k), prompt_token_ids=p.token_ids,
                                                  outputs=EmbeddingOutput(whole.embedding)))
        return outputs

    # ---- tokenizer, stats ------------------------------------------------------

    def get_tokenizer(self) -> Tokenizer:
        """The model's tokenizer (``encode``, ``decode``, ``apply_chat_template``)."""
        return self._tokenizer

    def stats(self) -> Dict[str, Any]:
        """The engine's counters: steps, ``mean_tokens_per_step``, ``max_step_tokens``,
        running and waiting requests, KV blocks, prefix-cache hits, preemptions, tokens."""
        return stats_of(self._session)

    @property
    def max_model_len(self) -> int:
        return self._session.max_model_len

    # ---- internals ---------------------------------------------------------------

    def _run(self, prompts: List[Prompt], sampling_params, use_tqdm: bool) -> List[RequestOutput]:
        params = per_prompt(sampling_params, len(prompts))
        group = _core.RequestGroup(self._session)
        try:
            ids = [
                group.add(make_params(self._session, p, sp, self._seeder.seed_for(sp)), sp.n)
                for p, sp in zip(prompts, params)
            ]
            _wait_for_group(group, sum(len(i) for i in ids), use_tqdm)
        except BaseException:
            group.abort_unfinished()  # Ctrl-C, or a bad prompt after others were added
            raise
        outputs = []
        for k, (p, sp, engine_ids) in enumerate(zip(prompts, params, ids)):
            wholes = [group.whole(i) for i in engine_ids]
            choices = [completion_of(self._session, j, w, sp.logprobs is not None) for j, w in enumerate(wholes)]
            metrics = metrics_of(wholes[0].metrics)
            outputs.append(
                RequestOutput(
                    request_id=str(k),
                    prompt=p.text,
                    prompt_token_ids=p.token_ids,
                    outputs=choices,
                    finished=True,
                    num_cached_tokens=metrics.num_cached_tokens,
                    metrics=metrics,
                    prompt_logprobs=None if sp.prompt_logprobs is None
                    else convert_prompt_logprobs(self._session, wholes[0].prompt_logprobs),
                )
            )
        return outputs


def _progress_bar(total: int):
    try:
        from tqdm.auto import tqdm
    except ImportError:  # tqdm is a dependency; without it, no bar
        return None
    return tqdm(total=total, desc="Processed requests", dynamic_ncols=True)


def _wait_for_group(group, total: int, use_tqdm: bool) -> None:
    """Gathers until every request of the group has finished, with a progress bar of
    ``total`` requests when asked for and there is more than one."""
    bar = _progress_bar(total) if use_tqdm and total > 1 else None
    try:
        while group.unfinished:
            finished = group.gather(_WAIT_SECONDS)
            if bar is not None and finished:
                bar.update(finished)
    finally:
        if bar is not None:
            bar.close()
