"""inferd: vLLM's offline and online Python API on inferd's C++ engine.

    from inferd import LLM, SamplingParams
    llm = LLM()  # the default model; or LLM(model="path/to/model.gguf", max_num_seqs=64)
    for out in llm.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=16)):
        print(out.outputs[0].text)

The engine (scheduler, sampler, stop handling, chat templates, tokenizer) is
the one ``inferd serve`` runs; this package only drives it.
"""

from ._engine import EngineArgs, EngineError
from .async_llm import AsyncLLM
from .llm import LLM
from .outputs import CompletionOutput, EmbeddingOutput, EmbeddingRequestOutput, Logprob, RequestMetrics, RequestOutput
from .sampling_params import RequestOutputKind, SamplingParams
from .tokenizer import Tokenizer

__all__ = [
    "LLM",
    "AsyncLLM",
    "EngineArgs",
    "SamplingParams",
    "RequestOutputKind",
    "RequestOutput",
    "CompletionOutput",
    "EmbeddingOutput",
    "EmbeddingRequestOutput",
    "Logprob",
    "RequestMetrics",
    "Tokenizer",
    "EngineError",
]
__version__ = "0.1.0"
