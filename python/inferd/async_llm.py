"""Online inference from asyncio: vLLM's ``AsyncLLM`` on inferd's engine.

The engine runs on its own thread. Each request's stream tells a shared
eventfd when it has output; the event loop watches that fd (``add_reader``), so
no thread blocks and the engine never waits for the GIL. Outputs are handed to
the waiting ``generate`` iterators on the loop's thread.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any, AsyncIterator, Dict, List, Optional, Sequence, Union

from . import _core
from ._engine import (
    Assembler,
    ChatMessage,
    EngineArgs,
    PromptType,
    Seeder,
    make_params,
    open_session,
    render_chat,
    stats_of,
    to_prompt,
)
from .outputs import RequestOutput
from .sampling_params import SamplingParams
from .tokenizer import Tokenizer


class AsyncLLM:
    """Many concurrent requests from one asyncio event loop, e.g. a web server's.

    Takes the same arguments as :class:`inferd.LLM` (a model and :class:`EngineArgs`). Use it from one event loop
    (the one that first calls ``generate``)::

        engine = AsyncLLM(model="model.gguf")
        async for out in engine.generate("Hello", SamplingParams(max_tokens=32), request_id="r1"):
            print(out.outputs[0].text)
    """

    def __init__(self, model: Optional[str] = None, **engine_args: Any) -> None:
        args = EngineArgs(**engine_args)
        self._session = open_session(model, args)
        self._seeder = Seeder(args.seed)
        self._tokenizer = Tokenizer(self._session)
        self._group = _core.RequestGroup(self._session, with_fd=True)
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._queues: Dict[str, asyncio.Queue] = {}  # engine id -> its request's queue
        self._ids = itertools.count()

    async def generate(
        self,
        prompt: PromptType,
        sampling_params: Optional[SamplingParams] = None,
        request_id: Optional[str] = None,
    ) -> AsyncIterator[RequestOutput]:
        """Runs one request, yielding ``RequestOutput``s as it progresses
        (``sampling_params.output_kind``: cumulative by default, as vLLM).
        Leaving the loop early, or cancelling the task, aborts the request.

        Raises:
            ValueError: a bad parameter or prompt.
            EngineError: the engine gave up on the request.
        """
        self._attach()
        params = sampling_params or SamplingParams()
        p = to_prompt(self._session, prompt)
        async for out in self._run(p, params, request_id):
            yield out

    async def chat(
        self,
        messages: Sequence[ChatMessage],
        sampling_params: Optional[SamplingParams] = None,
        request_id: Optional[str] = None,
        *,
        chat_template: Optional[str] = None,
        add_generation_prompt: bool = True,
        chat_template_kwargs: Optional[Dict[str, Any]] = None,
        tools: Optional[List[Dict[str, Any]]] = None,
    ) -> AsyncIterator[RequestOutput]:
        """``generate`` for a conversation rendered through the chat template."""
        self._attach()
        params = sampling_params or SamplingParams()
        p = render_chat(self._session, messages, add_generation_prompt, chat_template, chat_template_kwargs, tools)
        async for out in self._run(p, params, request_id):
            yield out

    async def abort(self, request_id: Union[str, Sequence[str]]) -> None:
        """Aborts requests by the ``request_id`` given to ``generate`` (all their choices)."""
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        for rid in ids:
            for eid in [e for e in self._queues if e == rid or e.startswith(rid + "-")]:
                self._group.abort(eid)

    def get_tokenizer(self) -> Tokenizer:
        return self._tokenizer

    def stats(self) -> Dict[str, Any]:
        """The engine's counters (see ``LLM.stats``)."""
        return stats_of(self._session)

    def shutdown(self) -> None:
        """Aborts every request and stops watching the engine."""
        self._group.abort_unfinished()
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._group.fileno())
        self._loop = None

    # ---- internals ---------------------------------------------------------------

    def _attach(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        if self._loop is not None and not self._loop.is_closed():
            raise RuntimeError("this AsyncLLM is in use by another event loop")
        self._loop = loop
        loop.add_reader(self._group.fileno(), self._on_output)

    def _on_output(self) -> None:
        # On the loop's thread: whatever the engine has pushed, to its request's queue.
        for out in self._group.poll(0):
            queue = self._queues.get(out.request_id)
            if queue is not None:
                queue.put_nowait(out)

    async def _run(self, p, params: SamplingParams, request_id: Optional[str]) -> AsyncIterator[RequestOutput]:
        rid = request_id if request_id is not None else f"async-{next(self._ids)}"
        queue: asyncio.Queue = asyncio.Queue()
        ids = self._group.add(make_params(self._session, p, params, self._seeder.seed_for(params), rid), params.n)
        for eid in ids:
            self._queues[eid] = queue
        self._on_output()  # outputs that came before the queue was registered
        assembler = Assembler(self._session, rid, p, ids, params, params.output_kind)
        try:
            while not assembler.finished:
                result = assembler.update(await queue.get())
                if result is not None:
                    yield result
        finally:
            for eid in ids:
                self._group.abort(eid)  # a no-op for finished ones
                self._queues.pop(eid, None)

    def __del__(self) -> None:
        try:
            self.shutdown()
        except Exception:
            pass
