"""How one request is sampled and stopped: vLLM's ``SamplingParams``, same field names."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import List, Optional, Union


class RequestOutputKind(enum.Enum):
    """What each streamed :class:`~inferd.RequestOutput` holds (vLLM's names)."""

    CUMULATIVE = 0  #: everything generated so far
    DELTA = 1  #: only what is new since the previous output
    FINAL_ONLY = 2  #: nothing until the request finishes, then everything


@dataclass
class SamplingParams:
    """Sampling and stopping parameters of a request, as vLLM's ``SamplingParams``.

    The engine samples (its sampler, its stop handling); these are only passed
    on, and the engine checks them: an out-of-range value raises ``ValueError``
    with the engine's message when the request is made.

    Attributes:
        n: completions to generate for each prompt. With a ``seed``, completion
            ``k`` is seeded ``seed + k``, as the server does for ``n``.
        temperature: 0 is greedy.
        top_p: nucleus mass in (0, 1].
        top_k: keep the k most likely tokens; 0 or -1 keeps all.
        min_p: drop tokens below ``min_p`` times the top probability.
        presence_penalty, frequency_penalty: OpenAI's, on output tokens, in [-2, 2].
        repetition_penalty: on prompt and output tokens; 1 is off.
        seed: the request's random seed; ``None`` draws one (or derives one from
            the ``LLM``'s ``seed``).
        stop: strings that end the output; they are not part of the text.
        stop_token_ids: tokens that end the output; they are kept in ``token_ids``.
        ignore_eos: go on past end-of-generation tokens.
        max_tokens: output tokens at most; ``None`` fills the context.
        logprobs: with a number k, each token's logprob and the k most likely
            alternatives (vLLM's shape: a dict per token, see ``Logprob``).
        prompt_logprobs: with a number k, each prompt token's logprob (after
            the first, which has none) and the k most likely alternatives, in
            ``RequestOutput.prompt_logprobs``. Computed in the prompt's own
            forward passes; such a request does not use the prefix cache.
        skip_special_tokens: leave control tokens out of the text.
        output_kind: what streamed outputs hold (``AsyncLLM`` and ``LLM.stream``).
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: Optional[int] = None
    stop: Optional[Union[str, List[str]]] = None
    stop_token_ids: Optional[List[int]] = None
    ignore_eos: bool = False
    max_tokens: Optional[int] = 16
    logprobs: Optional[int] = None
    prompt_logprobs: Optional[int] = None
    skip_special_tokens: bool = True
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE

    def __post_init__(self) -> None:
        # What the engine cannot check, because it never sees it as such.
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"n must be at least 1, got {self.n}.")
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or self.max_tokens < 1):
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}.")
        if self.logprobs is not None and (not isinstance(self.logprobs, int) or self.logprobs < 0):
            raise ValueError(f"logprobs must be non-negative, got {self.logprobs}.")
        if self.prompt_logprobs is not None and (not isinstance(self.prompt_logprobs, int) or self.prompt_logprobs < 0):
            raise ValueError(f"prompt_logprobs must be non-negative, got {self.prompt_logprobs}.")
        if self.seed is not None and (not isinstance(self.seed, int) or self.seed < 0):
            raise ValueError(f"seed must be a non-negative integer, got {self.seed}.")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.stop is not None and any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError("stop must hold non-empty strings.")

    @property
    def stop_strings(self) -> List[str]:
        return list(self.stop or [])
