#!/usr/bin/env python3
"""A mid-size random-weight `qwen35` GGUF (Gated DeltaNet layers beside gated attention, Qwen3.5's
head shapes at a reduced width), for benchmarks whose cost depends on the recurrent state's size
(speculative rollback: bench/state_rollback_bench.cpp). Built with make_tiny_models.py's qwen35
writer; Q8_0 throughout, the real Qwen3.5 tokenizer (llama.cpp's models/ggml-vocab-qwen35.gguf).

  python3 bench/make_synthetic_qwen35.py [--out ~/.cache/inferd/synthetic/qwen35-mid-L8-q8_0.gguf]

Default shape: 8 layers (6 Gated DeltaNet, 2 attention), width 1536, FFN 4096, 16 value heads and
8 key heads of 128 (Qwen3.5-4B has 32 and 16): about 0.5 GB, a recurrent state of 6.3 MiB per sequence.
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools" / "reference"))
import make_tiny_models as tm  # noqa: E402
from gguf import GGUFWriter, GGMLQuantizationType as T  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path.home() / ".cache/inferd/synthetic/qwen35-mid-L8-q8_0.gguf")
    ap.add_argument("--layers", type=int, default=8, help="a multiple of 4: every fourth is attention")
    ap.add_argument("--width", type=int, default=1536)
    ap.add_argument("--ffn", type=int, default=4096)
    ap.add_argument("--v-heads", type=int, default=16)
    ap.add_argument("--k-heads", type=int, default=8)
    args = ap.parse_args()
    h = dict(n_ctx_train=32768, n_embd=args.width, n_layer=args.layers, n_ff=args.ffn, n_head=8, n_head_kv=2,
             head_dim=128, rope_base=10000000.0, rms_eps=1e-6, rope_dim=64, rope_sections=[11, 11, 10, 0],
             full_attention_interval=4)
    dn = dict(conv_kernel=4, head=128, k_heads=args.k_heads, v_heads=args.v_heads)
    q8 = {key: T.Q8_0 for key in tm.QWEN35_TYPES[0]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    w = GGUFWriter(args.out, "qwen35")
    tm.qwen35_hparams(w, "qwen35", "inferd synthetic qwen35 (random, mid-size)", h, dn, 0)
    tm.copy_tokenizer(w, tm.QWEN35_VOCAB)
    b = tm.Builder(seed=73)
    b.matrix("token_embd.weight", 151936, h["n_embd"], T.Q8_0, std=0.6)
    b.norm("output_norm.weight", h["n_embd"], spread=1.0, center=0.0)
    n_embd, n_ff = h["n_embd"], h["n_ff"]
    for i in range(h["n_layer"]):
        p = f"blk.{i}."
        if (i + 1) % h["full_attention_interval"] != 0:
            tm.delta_net_block(b, h, dn, q8, p)
        else:
            tm.gated_attention_block(b, h, q8, p)
        b.norm(p + "post_attention_norm.weight", n_embd)
        b.matrix(p + "ffn_gate.weight", n_ff, n_embd, T.Q8_0)
        b.matrix(p + "ffn_up.weight", n_ff, n_embd, T.Q8_0)
        b.matrix(p + "ffn_down.weight", n_embd, n_ff, T.Q8_0, std=1.5 / n_ff ** 0.5)
    b.write(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.1f} MB)", file=sys.stderr)


if __name__ == "__main__":
    main()
