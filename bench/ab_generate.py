#!/usr/bin/env python3
"""Two inferd binaries (a change and the commit before it) side by side on one
generate command, run after run, alternating: on a shared VM the host's load
moves a single run by 10-20%, so only interleaved runs compared pair by pair
tell a few per cent apart.

  bench/ab_generate.py OLD_BINARY NEW_BINARY [--reps 8] [--prompt-tokens 0 | --context 0]
                       [--kv-cache-dtype q8_0] [--numerics fast | --numerics exact,fast]

Decode (default): tokens/s over 128 decode steps after the prompt "Hello".
With --prompt-tokens N: prompt tokens/s of an N-token prompt (1 token out).
With --context N: decode tokens/s over 128 steps after an N-token prompt (attention
over N to N + 128 positions, where the decode attention kernels change path).
With --numerics A,B: OLD runs tier A and NEW tier B (the same binary twice compares the tiers).
Prints each run, the medians and the median of the per-pair ratios.
"""
import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_llama_bench import MODEL_DIR, prompt_of  # noqa: E402


def rate(binary, model, prompt, n_gen, threads, prompt_speed, ctx=2048, kv_cache_dtype="", numerics=""):
    out = subprocess.run([binary, "generate", "-m", model, "-p", prompt, "-n", str(n_gen), "--temp", "0",
                          "--ignore-eos", "--json", "-t", str(threads), "-c", str(ctx)]
                         + (["--kv-cache-dtype", kv_cache_dtype] if kv_cache_dtype else [])
                         + (["--numerics", numerics] if numerics else []),
                         check=True, capture_output=True, text=True).stdout
    t = json.loads(out)["timings"]
    if prompt_speed:
        return t["prompt_tokens"] / t["prompt_seconds"]
    return (t["generated_tokens"] - 1) / t["decode_seconds"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--model", default=str(MODEL_DIR / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=0)
    ap.add_argument("--context", type=int, default=0)
    ap.add_argument("--kv-cache-dtype", default="", help="e.g. q8_0 (default: the engine's, f16)")
    ap.add_argument("--numerics", default="",
                    help="exact or fast (default: the engine's); OLD_TIER,NEW_TIER gives each side its own")
    args = ap.parse_args()
    if args.prompt_tokens:
        prompt, n_gen = prompt_of(args.new, args.model, args.prompt_tokens, args.threads), 1
    elif args.context:
        prompt, n_gen = prompt_of(args.new, args.model, args.context, args.threads), 129
    else:
        prompt, n_gen = "Hello", 129
    tiers = args.numerics.split(",") if "," in args.numerics else [args.numerics] * 2
    if len(tiers) != 2:
        ap.error("--numerics takes one tier or two, OLD,NEW")
    runs = {"old": [], "new": []}
    for _ in range(args.reps):
        for name, tier in zip(("old", "new"), tiers):
            runs[name].append(rate(getattr(args, name), args.model, prompt, n_gen, args.threads,
                                   args.prompt_tokens > 0, max(2048, args.context + 256), args.kv_cache_dtype,
                                   tier))
    what = (f"prompt of {args.prompt_tokens} tokens" if args.prompt_tokens else
            f"decode, 128 steps after {args.context} tokens" if args.context else "decode, 128 steps")
    if args.kv_cache_dtype:
        what += f", {args.kv_cache_dtype} KV cache"
    if args.numerics:
        what += f", {' -> '.join(dict.fromkeys(tiers))} numerics"
    print(f"{what}, {args.reps} alternating pairs, tok/s")
    for name in ("old", "new"):
        print(f"  {name}: median {statistics.median(runs[name]):.1f}  "
              f"({', '.join(f'{x:.1f}' for x in runs[name])})")
    ratios = [n / o for o, n in zip(runs["old"], runs["new"])]
    print(f"  new / old: {statistics.median(runs['new']) / statistics.median(runs['old']):.3f} "
          f"(median of the pairs' ratios {statistics.median(ratios):.3f})")


if __name__ == "__main__":
    sys.exit(main())
