#!/usr/bin/env python3
"""Reference beam searches over llama.cpp's logits (via llama-cpp-python).

An independent beam search, written here in Python with no code of inferd's, over the logits that
llama.cpp computes for each beam's sequence. The rules are vLLM's beam search (its
`beam_search()` over 2 * beam_width logprobs per beam and step, and `get_beam_search_score`),
with vLLM v0 / Hugging Face early stopping:

  - every live beam proposes its 2 * W most likely next tokens, by the log-softmax of its raw
    logits (most likely first, lower id on equal logits), each scored cumulative logprob + the
    token's logprob;
  - the candidates are sorted by that score (a stable sort: ties keep the order of the beams,
    then of the tokens); a candidate that is an end-of-generation token (EOS or another EOG
    token) finishes its beam, whatever its rank; one that reaches max_tokens finishes with
    "length"; of the others, the best W live on;
  - finished beams are ranked by cumulative logprob / length ** length_penalty, the length
    counting the prompt and not the stop token; the best W are kept;
  - the search ends when no beam lives on, or early stopping allows it: true, as soon as W beams
    have finished; false, when the best live beam at its current length cannot beat the worst
    kept finished one; "never", when it cannot at the longest length it may reach (length
    penalty > 0) or its current one (otherwise).

Each sequence's logits are computed as inferd computes them: the prompt in one llama_decode
call, then one llama_decode call per output token (llama.cpp settings of logits_reference.py:
n_ctx 2048, n_ubatch 512, f16 K/V cache, flash attention off, 2 threads, CPU only).

Writes tests/data/beam_search/<model>.json (or --out): the cases (prompt ids, beam width,
max_tokens, length penalty, early stopping) and for each the W best beams, best first (token
ids, the stop token included; cumulative logprob; finish reason), plus min_gap, the smallest
difference between a kept candidate and the best one left out over the search (a near-tie there
could let another arithmetic choose otherwise). Read by
tests/unit/engine_beam_search_reference_test.cpp.

Usage: python tools/reference/beam_search_reference.py [--model PATH] [--out PATH]
"""

import argparse
import datetime
import json
import os
import sys
from pathlib import Path

import numpy as np
import llama_cpp

sys.path.insert(0, str(Path(__file__).resolve().parent))
import logits_reference as lr  # noqa: E402  (llama.cpp set-up, shared with the logits reference)

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL_DIR = Path(os.environ.get("INFERD_MODEL_DIR", Path.home() / ".cache/inferd/models"))
DEFAULT_MODEL = DEFAULT_MODEL_DIR / "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_OUT = REPO_ROOT / "tests/data/beam_search/smollm2-135m.json"

PROMPTS = [
    ("story", "Once upon a time, in a small village by the sea, there lived"),
    ("science", "The main reason the sky looks blue during the day is that"),
    ("code", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
    # Chats end where the assistant answers: a short answer ends with <|im_end|> (EOG), so
    # beams finish with a stop token inside max_tokens.
    ("chat_capital", lr.chatml([("user", "What is the capital of France? Answer in one word.")])),
    ("chat_math", lr.chatml([("user", "What is 2 + 2? Reply with the number only.")])),
]

MAX_TOKENS = 12
# (beam width, length penalty, early stopping) for every prompt, then extra settings for the chats.
SETTINGS = [(2, 1.0, False), (4, 1.0, False)]
CHAT_SETTINGS = [(2, 0.5, "never"), (4, 2.0, True), (3, 0.0, "never")]


class Logits:
    """Logits after each prefix of prompt + output, computed the way inferd computes them, and
    memoized (beams share prefixes)."""

    def __init__(self, model):
        self.ctx = lr.new_context(model, **{k: lr.SETTINGS[k] for k in ("n_ctx", "n_batch", "n_ubatch")},
                                  n_threads=lr.SETTINGS["n_threads"], flash_attn=False)
        self.memo = {}
        self.decodes = 0

    def __call__(self, prompt, output):
        key = (tuple(prompt), tuple(output))
        if key in self.memo:
            return self.memo[key]
        # From an empty cache: the prompt in one call, then one call per output token, keeping
        # the logits of every prefix on the way.
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self.ctx), True)
        logits = lr.decode(self.ctx, list(prompt), 0)
        self.memo[(tuple(prompt), ())] = logits
        for i, t in enumerate(output):
            logits = lr.decode(self.ctx, [t], len(prompt) + i)
            self.decodes += 1
            self.memo[(tuple(prompt), tuple(output[:i + 1]))] = logits
        return logits

    def free(self):
        llama_cpp.llama_free(self.ctx)


def log_softmax(logits):
    x = logits.astype(np.float64)
    m = x.max()
    return x - (m + np.log(np.exp(x - m).sum()))


def top_tokens(logits, k):
    """The k most likely token ids, most likely first, lower id first on equal logits."""
    order = np.lexsort((np.arange(len(logits)), -logits.astype(np.float64)))
    return [int(t) for t in order[:k]]


def score(cum, length, length_penalty):
    return cum / (length ** length_penalty)


def beam_search(logits_of, prompt, width, max_tokens, length_penalty, early_stopping, stop_ids):
    live = [([], 0.0)]  # (output tokens, cumulative logprob)
    finished = []       # dicts, best score first, at most `width`
    min_gap = float("inf")
    for _ in range(max_tokens):
        candidates = []
        for b, (tokens, cum) in enumerate(live):
            lg = logits_of(prompt, tokens)
            lp = log_softmax(lg)
            for t in top_tokens(lg, 2 * width):
                candidates.append((cum + float(lp[t]), b, t))
        candidates.sort(key=lambda c: -c[0])  # stable
        next_live, left_out = [], []
        for cum, b, t in candidates:
            tokens = live[b][0] + [t]
            if t in stop_ids:
                finished.append({"token_ids": tokens, "cumulative_logprob": cum, "finish_reason": "stop",
                                 "score": score(cum, len(prompt) + len(tokens) - 1, length_penalty)})
            elif len(tokens) >= max_tokens:
                finished.append({"token_ids": tokens, "cumulative_logprob": cum, "finish_reason": "length",
                                 "score": score(cum, len(prompt) + len(tokens), length_penalty)})
            elif len(next_live) < width:
                next_live.append((tokens, cum))
            else:
                left_out.append(cum)
        if next_live and left_out:
            min_gap = min(min_gap, next_live[-1][1] - left_out[0])
        finished = sorted(finished, key=lambda f: -f["score"])[:width]  # stable
        live = next_live
        if not live:
            break
        if len(finished) >= width:
            worst = finished[-1]["score"]
            best_cum, cur_len = live[0][1], len(prompt) + len(live[0][0])
            if early_stopping is True:
                break
            if early_stopping is False and worst >= score(best_cum, cur_len, length_penalty):
                break
            if early_stopping == "never":
                length = len(prompt) + max_tokens if length_penalty > 0 else cur_len
                if worst >= score(best_cum, length, length_penalty):
                    break
    return finished, min_gap


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()

    lr.init_backend()
    model = lr.load_model(args.model)
    vocab = llama_cpp.llama_model_get_vocab(model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    add_bos = bool(llama_cpp.llama_vocab_get_add_bos(vocab))
    # What ends a beam: every end-of-generation token, EOS among them.
    stop_ids = {t for t in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t)}
    stop_ids.add(llama_cpp.llama_vocab_eos(vocab))
    logits_of = Logits(model)

    cases = []
    for name, text in PROMPTS:
        prompt = lr.tokenize(vocab, text, add_bos=add_bos, special=True)
        settings = SETTINGS + (CHAT_SETTINGS if name.startswith("chat") else [])
        for width, length_penalty, early_stopping in settings:
            beams, min_gap = beam_search(logits_of, prompt, width, MAX_TOKENS, length_penalty, early_stopping,
                                         stop_ids)
            for b in beams:
                del b["score"]
                b["text"] = lr.detokenize_bytes(vocab, [t for t in b["token_ids"] if t not in stop_ids]).decode(
                    "utf-8", errors="replace")
            cases.append({"name": f"{name}_w{width}_lp{length_penalty:g}_es{str(early_stopping).lower()}",
                          "prompt_ids": prompt, "beam_width": width, "max_tokens": MAX_TOKENS,
                          "length_penalty": length_penalty, "early_stopping": early_stopping,
                          "min_gap": None if min_gap == float("inf") else min_gap, "beams": beams})
            print(f"  {name:<14} W={width} lp={length_penalty} es={early_stopping!s:<5} min gap {min_gap:.2e}  "
                  f"best: {beams[0]['text']!r} ({beams[0]['finish_reason']})", file=sys.stderr)
    logits_of.free()

    system_info = llama_cpp.llama_print_system_info().decode().strip()
    data = {
        "generator": "tools/reference/beam_search_reference.py",
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "llama_cpp_python_version": llama_cpp.__version__,
        "ggml_build": lr.ggml_build_info(),
        "llama_cpp_system_info": system_info,
        "ggml_flavour": lr.ggml_flavour(system_info),
        "model_file": args.model.name,
        "model_sha256": lr.sha256_file(args.model),
        "settings": {k: lr.SETTINGS[k] for k in ("n_ctx", "n_batch", "n_ubatch", "n_threads", "type_k", "type_v",
                                                 "flash_attn")},
        "stop_token_ids": sorted(stop_ids),
        "cases": cases,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {args.out}: {len(cases)} cases, {logits_of.decodes} decode calls", file=sys.stderr)


if __name__ == "__main__":
    main()
