#!/usr/bin/env python3
"""What the Python binding costs: LLM.generate's offline throughput beside
`inferd bench throughput` on the same shape (random prompts of ordinary
tokens, ignore_eos, temperature 1, top_k 0, top_p 1, request i seeded seed + i).

Both time only the generation (from adding the requests to the last output),
not loading. Each round draws fresh prompts (seed + round) and makes a fresh
LLM, as each binary run is a fresh process: no prefix cache carries over, and
both sides touch their KV pool's pages for the first time while timed. Runs alternate (binary, Python, binary, ...) so that a machine
whose speed drifts affects both alike; prints each run and the ratio of the
medians. Not a test: run it on a quiet machine.

    python3 bench/python_throughput.py                       # 256 prompts, 128 in, 128 out, 3 rounds
    python3 bench/python_throughput.py --rounds 5 --input-len 64 --output-len 64
"""
from __future__ import annotations

import argparse
import json
import pathlib
import random
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]


def binary_run(args, seed: int) -> float:
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        cmd = [str(args.binary), "bench", "throughput", "--num-prompts", str(args.num_prompts),
               "--input-len", str(args.input_len), "--output-len", str(args.output_len),
               "--seed", str(seed), "--output-json", f.name]
        if args.model:
            cmd += ["-m", args.model]
        if args.threads:
            cmd += ["--threads", str(args.threads)]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return json.load(open(f.name))["output_tokens_per_second"]


def python_run(llm, prompts, args, seed: int) -> float:
    from inferd import SamplingParams

    params = [SamplingParams(temperature=1.0, top_k=0, top_p=1.0, max_tokens=args.output_len, ignore_eos=True,
                             seed=seed + i) for i in range(len(prompts))]
    start = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    generated = sum(len(o.outputs[0].token_ids) for o in outputs)
    assert generated == args.output_len * len(prompts), generated
    return generated / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="GGUF file (default: the default model)")
    ap.add_argument("--binary", default=str(REPO / "build" / "inferd"), help="the inferd binary to compare with")
    ap.add_argument("--num-prompts", type=int, default=256)
    ap.add_argument("--input-len", type=int, default=128, help="prompt tokens per request")
    ap.add_argument("--output-len", type=int, default=128, help="output tokens per request")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each, alternating")
    ap.add_argument("--threads", type=int, default=0, help="forward-pass threads (0: one per hardware thread)")
    ap.add_argument("--seed", type=int, default=0, help="prompts and sampling seeds")
    args = ap.parse_args()

    from inferd import LLM

    native, python = [], []
    for r in range(args.rounds):
        # A fresh LLM each round, as each binary run is a fresh process: its KV
        # pool's pages are touched for the first time inside the timed part on
        # both sides, and no prefix cache carries over.
        llm = LLM(model=args.model, threads=args.threads or None)
        session = llm._session  # the engine's vocabulary, to draw ordinary tokens as the binary does
        ordinary = [t for t in range(session.n_vocab) if not session.is_control(t)]
        seed = args.seed + 1000 * r
        rng = random.Random(seed)
        prompts = [[rng.choice(ordinary) for _ in range(args.input_len)] for _ in range(args.num_prompts)]
        native.append(binary_run(args, seed))
        python.append(python_run(llm, prompts, args, seed))
        del llm, session
        print(f"round {r + 1}: inferd bench throughput {native[-1]:.1f} output tok/s, "
              f"LLM.generate {python[-1]:.1f} output tok/s", flush=True)
    ratio = statistics.median(python) / statistics.median(native)
    print(f"LLM.generate / inferd bench throughput (medians): {ratio:.3f} "
          f"({args.num_prompts} prompts, {args.input_len} in, {args.output_len} out)")
    sys.exit(0)


if __name__ == "__main__":
    main()
