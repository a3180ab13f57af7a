"""What a request returns: vLLM's ``RequestOutput``, ``CompletionOutput`` and ``Logprob`` shapes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, NamedTuple, Optional


@dataclass
class Logprob:
    """One token's log-probability (from the model's raw distribution)."""

    logprob: float
    rank: Optional[int] = None  #: 1 for the most likely token
    decoded_token: Optional[str] = None


#: Per generated token: token id -> Logprob, the sampled token and the
#: requested number of most likely alternatives (vLLM's ``SampleLogprobs``).
SampleLogprobs = List[Dict[int, Logprob]]

#: Per prompt token: None for the first (nothing comes before it), then as
#: ``SampleLogprobs``: the prompt's token and the most likely ones (vLLM's ``PromptLogprobs``).
PromptLogprobs = List[Optional[Dict[int, Logprob]]]


@dataclass
class CompletionOutput:
    """One completion of a prompt (one of ``n``)."""

    index: int
    text: str
    token_ids: List[int]
    cumulative_logprob: Optional[float] = None
    logprobs: Optional[SampleLogprobs] = None
    finish_reason: Optional[str] = None  #: "stop", "length" or "abort"; None while running
    stop_reason: Optional[str] = None  #: the stop string that ended it, if one did

    def finished(self) -> bool:
        return self.finish_reason is not None


class RequestMetrics(NamedTuple):
    """Timestamps (seconds on the engine's steady clock; 0: not reached) and token counts of a request."""

    arrival_time: float
    first_scheduled_time: float
    first_token_time: float
    last_token_time: float
    finished_time: float
    num_prompt_tokens: int
    num_cached_tokens: int  #: prompt tokens served by the prefix cache
    num_output_tokens: int
    num_preemptions: int


@dataclass
class RequestOutput:
    """A prompt and its completions, as vLLM's ``RequestOutput``."""

    request_id: str
    prompt: Optional[str]
    prompt_token_ids: List[int]
    outputs: List[CompletionOutput]
    finished: bool
    num_cached_tokens: Optional[int] = None
    metrics: Optional[RequestMetrics] = None
    #: with ``SamplingParams(prompt_logprobs=k)``; None otherwise
    prompt_logprobs: Optional[PromptLogprobs] = field(default=None)


@dataclass
class EmbeddingOutput:
    """A prompt's embedding: the model's pooled vector, L2-normalized (as /v1/embeddings returns it)."""

    embedding: List[float]

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)


@dataclass
class EmbeddingRequestOutput:
    """A prompt and its embedding, as vLLM's ``EmbeddingRequestOutput``."""

    request_id: str
    prompt_token_ids: List[int]
    outputs: EmbeddingOutput
    finished: bool = True
