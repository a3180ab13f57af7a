#!/usr/bin/env python3
"""Streaming with inferd's Python API.

    python3 examples/streaming.py                 # one request, printed as it is generated
    python3 examples/streaming.py --concurrent 4  # AsyncLLM: several requests at once from asyncio

LLM.stream() is a generator of deltas for one request; AsyncLLM.generate() is an
async generator, one per request, for many requests at once (as a web server
would use it). Leaving either early aborts its request.
"""
import argparse
import asyncio
import sys

from inferd import AsyncLLM, LLM, RequestOutputKind, SamplingParams


def stream_one(args) -> None:
    llm = LLM(model=args.model, max_model_len=2048)
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    print(args.prompt, end="", flush=True)
    for delta in llm.stream(args.prompt, params):
        print(delta.outputs[0].text, end="", flush=True)
        if delta.finished:
            print(f"\n[finish_reason: {delta.outputs[0].finish_reason}]")


async def stream_many(args) -> None:
    engine = AsyncLLM(model=args.model, max_model_len=2048)
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, output_kind=RequestOutputKind.DELTA)
    prompts = [f"{args.prompt} (take {i + 1})" for i in range(args.concurrent)]
    texts = {i: "" for i in range(len(prompts))}

    async def one(i: int, prompt: str) -> None:
        async for delta in engine.generate(prompt, params, request_id=f"req-{i}"):
            texts[i] += delta.outputs[0].text
            sys.stdout.write(f"[req-{i}] +{len(delta.outputs[0].token_ids)} tokens\n")

    await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    for i, prompt in enumerate(prompts):
        print(f"--- req-{i}: {prompt!r}\n{texts[i]}")
    stats = engine.stats()
    print(f"=== {len(prompts)} requests; largest engine step {stats['max_step_tokens']} tokens")
    engine.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="GGUF file (default: the default model)")
    ap.add_argument("--prompt", default="Once upon a time")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--concurrent", type=int, default=0, help="run this many requests at once with AsyncLLM")
    args = ap.parse_args()
    if args.concurrent > 0:
        asyncio.run(stream_many(args))
    else:
        stream_one(args)


if __name__ == "__main__":
    main()
