#!/usr/bin/env python3
"""Offline batch inference with inferd's Python API (vLLM's LLM/SamplingParams).

    python3 examples/batch.py                      # the default model
    python3 examples/batch.py --model path/to/model.gguf --max-tokens 64

Every prompt goes into the engine at once; they share its forward passes
(continuous batching). Prints each completion, then the engine's counters.
"""
import argparse
import time

from inferd import LLM, SamplingParams

PROMPTS = [
    "The capital of France is",
    "The three primary colours are",
    "A haiku about the sea:",
    "def is_prime(n):",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="GGUF file (default: the default model)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--chat", action="store_true", help="send each prompt as a user message through the chat template")
    args = ap.parse_args()

    llm = LLM(model=args.model, max_model_len=2048)
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, seed=0)
    start = time.perf_counter()
    if args.chat:
        outputs = llm.chat([[{"role": "user", "content": p}] for p in PROMPTS], params)
    else:
        outputs = llm.generate(PROMPTS, params)
    elapsed = time.perf_counter() - start

    for prompt, out in zip(PROMPTS, outputs):
        completion = out.outputs[0]
        print(f"--- {prompt!r} ({len(completion.token_ids)} tokens, {completion.finish_reason})")
        print(completion.text)
    stats = llm.stats()
    generated = sum(len(o.outputs[0].token_ids) for o in outputs)
    print(f"=== {len(outputs)} prompts, {generated} tokens in {elapsed:.2f} s; "
          f"{stats['steps']} engine steps, {stats['mean_tokens_per_step']:.1f} tokens per step")


if __name__ == "__main__":
    main()
