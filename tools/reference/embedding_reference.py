#!/usr/bin/env python3
"""Reference tokens and sentence embeddings of all-MiniLM-L6-v2 for every
sentence of tests/data/embeddings/sentences.jsonl, from the model's own
Hugging Face implementation: token ids by the `tokenizers` package from the
model's tokenizer.json (no truncation, no padding), embeddings by
transformers' BertModel on CPU in float32, mean-pooled over the tokens and
L2-normalized as sentence-transformers' Pooling and Normalize modules do.

Writes tests/data/embeddings/all-minilm-l6-v2.expected.jsonl, one line per
sentence: {"text", "ids", "embedding"} ("embedding" left out where the input
is longer than the model's 512 positions: those check the tokenizer only).

Needs torch, transformers and tokenizers (pip), and the Hugging Face model
directory that scripts/fetch_models.sh unpacks:

    python3 tools/reference/embedding_reference.py [--model-dir DIR]
"""
import argparse
import json
import os
from pathlib import Path

import torch
from tokenizers import Tokenizer
from transformers import BertModel

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "embeddings"


def main() -> None:
    default_dir = Path(os.environ.get("INFERD_MODEL_DIR", Path.home() / ".cache/inferd/models")) / "all-MiniLM-L6-v2"
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", type=Path, default=default_dir)
    args = ap.parse_args()

    tokenizer = Tokenizer.from_file(str(args.model_dir / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    model = BertModel.from_pretrained(str(args.model_dir), torch_dtype=torch.float32).eval()
    max_positions = model.config.max_position_embeddings

    out = []
    for line in (DATA / "sentences.jsonl").read_text().splitlines():
        text = json.loads(line)["text"]
        ids = tokenizer.encode(text).ids
        entry = {"text": text, "ids": ids}
        if len(ids) <= max_positions:
            with torch.no_grad():
                hidden = model(input_ids=torch.tensor([ids])).last_hidden_state[0]
            pooled = hidden.mean(dim=0)
            pooled = pooled / pooled.norm()
            entry["embedding"] = [round(float(v), 7) for v in pooled]
        out.append(entry)
    with open(DATA / "all-minilm-l6-v2.expected.jsonl", "w") as f:
        for entry in out:
            f.write(json.dumps(entry, ensure_ascii=False) + "\n")
    print(f"wrote {len(out)} entries")


if __name__ == "__main__":
    main()
