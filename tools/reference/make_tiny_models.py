#!/usr/bin/env python3
"""Tiny random-weight GGUF models for architectures we have no small real model of.

Writes, under tests/data/models/ (or --out), with the `gguf` Python package:
  tiny-qwen3.gguf    `qwen3`: per-head RMS norms of q and k (attn_q_norm/attn_k_norm), no
                     biases, NeoX RoPE (base 1e6), head_dim 32 with n_embd 32 (so the query
                     width n_head*head_dim = 128 differs from n_embd, as in real Qwen3), GQA 4/2,
                     tied output. Qwen2.5's tokenizer (151,936 tokens, copied from the
                     Qwen2.5-Coder-0.5B GGUF, chat template included). n_embd is 32 because the
                     tokenizer alone takes ~6 MB and the Q5_0 embedding 3.3 MB at that width.
  tiny-qwen3moe.gguf `qwen3moe`: tiny-qwen3's attention (per-head q/k RMS norms, NeoX RoPE base
                     1e6, GQA 4/2 with head_dim 32 at n_embd 32, tied output) with a mixture-of-
                     experts FFN in every layer: an F32 router (ffn_gate_inp, as real Qwen3-MoE
                     files keep it), 16 experts of width 64 (3-D ffn_gate_exps/ffn_up_exps/
                     ffn_down_exps), 4 chosen per token by softmax, their weights renormalized
                     (llama.cpp's build_moe_ffn with norm_w). Qwen2.5's tokenizer, as tiny-qwen3.
  tiny-llama3.gguf   `llama` with Llama 3 RoPE scaling: a `rope_freqs.weight` tensor of per-
                     dimension frequency factors computed as convert_hf_to_gguf.py computes them
                     from a Llama 3.x config (rope_type "llama3": factor 32, low_freq_factor 1,
                     high_freq_factor 4, original context 8192, base 500,000: Llama 3.2's values),
                     normal RoPE, GQA 2/1, an untied output matrix. SmolLM2's tokenizer (49,152
                     tokens; SmolLM2 is a `llama` model too).
  tiny-llama-mxfp4.gguf  `llama` with MXFP4 weights (gpt-oss's type): every attention
                     projection, the FFN's gate and up, and the output matrix; n_embd 64, GQA
                     2/1, head_dim 32, so q, k, v, o (64, 32, 32, 64 rows) and the output (49,152
                     rows) have rows % 8 == 0 (llama.cpp's repack buffer: the mxfp4_8x8 gemv/
                     gemm) while gate and up have n_ff = 100 rows (rows % 8 != 0: ggml_vec_dot_
                     mxfp4_q8_0). ffn_down, whose rows of 100 no 32-element block fits, is F32.
                     Q8_0 embeddings, normal RoPE (base 1e4), SmolLM2's tokenizer.
  tiny-gemma3.gguf   `gemma3`: 6 layers, 0, 1, 3, 4 attending within a 64-token sliding window
                     (sliding_window_pattern written as one bool per layer) with RoPE base 1e4
                     (rope.freq_base_swa), 2 and 5 globally with base 1e6; NeoX RoPE, per-head
                     q/k RMS norms, sandwich norms (post_attention_norm, post_ffw_norm), GeGLU,
                     embeddings scaled by sqrt(n_embd), tied output; n_embd 64, GQA 4/1 with
                     head_dim 32 (query width 128 != n_embd). SmolLM2's tokenizer (small, unlike
                     Gemma's 262,144 tokens) with add_bos_token set true, as Gemma's. The window
                     is far below the 1,000-token reference prompts, so the windowed masks and
                     llama.cpp's iSWA cache are exercised by quick tests.
  tiny-mistral.gguf  `llama` as Mistral-7B-Instruct-v0.3 has it (GQA, RoPE base 1e6, untied
                     output) with a tokenizer of its own: a 386-token SentencePiece vocabulary
                     (<unk>, <s>, </s>, then Mistral's control tokens [INST], [/INST],
                     [TOOL_CALLS], [AVAILABLE_TOOLS], [/AVAILABLE_TOOLS], [TOOL_RESULTS],
                     [/TOOL_RESULTS] as CONTROL tokens at v0.3's ids 3-9, the 256 <0xXX> byte
                     tokens, "▁", printable ASCII and a few two-character pieces) and the
                     v0.3-style tools template tests/data/chat/mistral_v3_tools.jinja. For the
                     tool-calling tests of the mistral format, whose marker is a control token.
  tiny-gpt-oss.gguf  `gpt-oss`: 4 layers, 0 and 2 attending within a 128-token sliding window,
                     1 and 3 globally (llama.cpp's default pattern for gpt-oss, no pattern key);
                     NeoX RoPE base 150,000 with YaRN (factor 32, original context 4,096, as the
                     real files); biases on Q/K/V and the output projection; a sink per query
                     head (attn_sinks); the FFN norm stored as post_attention_norm; n_embd 32,
                     GQA 4/2 with head_dim 64 (query width 256); a mixture of experts in every
                     layer: an F32 router with a bias, 16 MXFP4 experts of width 64 (rows % 8 == 0,
                     so GGML repacks them) with F32 biases on gate, up and down, 4 chosen per
                     token by a softmax over the chosen logits, the clamped SwiGLU; an untied
                     output. gpt-oss's own tokenizer (o200k_harmony, 201,088 tokens, made by
                     make_gpt_oss_vocab.py into tests/data/vocab/gpt-oss-vocab.gguf) and
                     llama.cpp's vendored gpt-oss chat template (tests/data/chat/).
  tiny-glm4moe.gguf  `glm4moe` (GLM-4.5): 5 blocks, of which the last is a NextN/MTP block
                     (nextn_predict_layers 1: the main model runs 4 and skips it; it carries
                     nextn.eh_proj/enorm/hnorm/shared_head_norm as real files do); layers 0 and 1
                     dense (leading_dense_block_count 2), 2 and 3 a mixture of 16 experts of width 64
                     with one shared expert (ffn_{gate,up,down}_shexp, width 64, run for every
                     token and added to the routed sum), 4 chosen by sigmoid gating with a
                     per-expert selection bias (exp_probs_b.bias), the weights renormalized and
                     scaled by 2.5 (expert_weights_norm, expert_weights_scale); biases on Q/K/V,
                     no QK norms (as GLM-4.5-Air), the FFN norm stored as post_attention_norm,
                     partial NeoX RoPE (16 of head_dim 32 rotated, as GLM's factor 0.5); n_embd
                     32, GQA 4/2; tied output. Qwen2.5's tokenizer, as tiny-qwen3.
  tiny-deepseek2-lite.gguf  `deepseek2` shaped as DeepSeek-V2-Lite: multi-head latent attention
                     with no query compression (attn_q straight from the norm; q_lora_rank 0),
                     keys and values compressed to a kv_lora_rank-64 latent (attn_kv_a_mqa, then
                     attn_kv_a_norm) plus a 16-wide RoPE key shared by the 4 heads, the latent
                     expanded per head by attn_k_b (3-D: 32 nope dims of each head's key from the
                     latent) and attn_v_b (the head's 32-wide value), as convert_hf_to_gguf.py
                     splits kv_b_proj; YaRN RoPE (factor 40, mscale_all_dim 0.707 as V2-Lite's
                     config); layer 0 dense, 1 and 2 a mixture of 16 experts of width 32, 4 chosen
                     by softmax (weights not renormalized, scale 1), 2 shared experts; n_embd 32
                     (the query width 4 x 48 and the value width 4 x 32 differ from it), tied output. Qwen2.5's tokenizer, as tiny-qwen3.
  tiny-deepseek2-latent128.gguf  tiny-deepseek2-lite's shape with a kv_lora_rank-96 latent and a
                     32-wide RoPE key (qk_nope 32): a 128-wide latent row, a multiple of the
                     quantized blocks, which llama.cpp needs for a q8_0/q4_0 latent cache (-ctk);
                     its own seed.
  tiny-deepseek2.gguf `deepseek2` shaped as DeepSeek-V3: the same latent attention with query
                     compression (attn_q_a -> attn_q_a_norm -> attn_q_b, q_lora_rank 64), a
                     96-wide latent; YaRN RoPE (factor 40, mscale_all_dim 1); layers 0 and 1
                     dense, 2 and 3 a mixture of 16 experts chosen by sigmoid gating with a
                     selection bias (exp_probs_b.bias), renormalized and scaled by 2.5, one shared
                     expert. Qwen2.5's tokenizer.
  tiny-deepseek2-kv-b.gguf  tiny-deepseek2's weights as the converter wrote such models before it split
                     kv_b_proj: one F16 attn_kv_b a layer in place of attn_k_b/attn_v_b, MHA-shaped
                     metadata (head_count_kv 4, key_length 48, value_length 32, no *_mla keys).
  tiny-deepseek2-kv-b-split.gguf  the same attn_kv_b split as today's converter splits it (F16
                     attn_k_b transposed, attn_v_b): inferd's split at load must give its logits.
  tiny-bert-reranker.gguf  `bert` with rank pooling (a cross-encoder): 2 post-norm layers,
                     n_embd 32, 4 heads, n_ff 64, biases everywhere, learned positions (512)
                     and token types, and the classification head cls (32 -> 32, tanh) and
                     cls.output (-> 1 score); llama.cpp's BERT vocabulary (its
                     models/ggml-vocab-bert-bge.gguf, found through INFERD_LLAMA_CPP_SRC,
                     default ~/.cache/inferd/llama.cpp/src); token embeddings F16, the head F32.
  tiny-qwen3-embed-last.gguf  tiny-qwen3 made a decoder embedding model as Qwen3-Embedding's
                     GGUFs are: pooling_type 3 (last token), EOS <|endoftext|> and add_eos_token
                     true (the input ends in <|endoftext|>, whose final-normed hidden state is the embedding);
                     its own seed, an output norm around 1, and no output matrix (an
                     embedding model never runs its LM head; the tied token_embd stands in).
  tiny-llama-embed-mean.gguf  tiny-llama3's shape as a decoder embedding model with
                     pooling_type 1 (mean over the tokens' final-normed hidden states); its own
                     seed, no output matrix; SmolLM2's tokenizer (BOS added).
  tiny-qwen35.gguf   `qwen35` (Qwen3.5, hybrid): 4 trunk layers, 0-2 Gated DeltaNet (attn_qkv,
                     attn_gate, ssm_beta, ssm_alpha, a 4-tap F32 ssm_conv1d, ssm_dt.bias, ssm_a,
                     ssm_norm, ssm_out; 2 key heads and 4 value heads of 32, so key heads broadcast)
                     and 3 gated full attention (full_attention_interval 4: attn_q holds each head's
                     query then its output gate; per-head q/k norms; NeoX rotation of 8 of 32 dims
                     with rope.dimension_sections as Qwen3.5 writes them), the FFN norm stored as
                     post_attention_norm, then one multi-token-prediction block (nextn_predict_layers
                     1) that the main model skips; n_embd 32, GQA 4/2, tied output; alpha and beta in
                     F32 in some layers. Tokenizer: llama.cpp's models/ggml-vocab-qwen35.gguf (pre
                     "qwen35", 151,936 tokens; found through INFERD_LLAMA_CPP_SRC).
  tiny-nemotron-h.gguf  `nemotron_h` (Nemotron-H, hybrid): 8 layers of one branch each, "M-M*-M*-"
                     (M: Mamba-2: ssm_in, a 4-tap F32 ssm_conv1d with its bias, ssm_dt.bias, ssm_a,
                     ssm_d, ssm_norm over 2 groups, ssm_out; 4 heads of 16, B and C in 2 groups, a
                     state of 80; *: attention without RoPE, GQA 4/2 of 32; -: a squared-ReLU MLP
                     of 128, no gate), the per-layer feed_forward_length and head_count_kv arrays
                     that tell them apart; n_embd 32, tied output. Tokenizer: llama.cpp's
                     models/ggml-vocab-llama-bpe.gguf (pre "llama-bpe", 128,256 tokens; the
                     nearest vendored one to Nemotron-H's tiktoken-style BPE).
(`qwen2`, with its q/k/v biases, is covered by the real Qwen2.5-Coder models.)

Like real Llama 3 GGUFs, tiny-llama3 carries no `llama.rope.scaling.type` key: the converter
writes the llama3 scaling only as the rope_freqs tensor, and this llama.cpp rejects "llama3" as
a scaling type (llama_model::load_hparams asserts on an unknown name).

The weights are random (numpy's PCG64, fixed seeds) with scales that keep the residual stream
near unit RMS and the logits at a standard deviation of a few units, so greedy continuations
are not one repeated token and top-2 gaps are mostly far above 1e-3. The projections use a mix
of GGML types (Q8_0, Q5_0, Q4_1), quantized by the gguf package; norms,
biases and rope_freqs are F32 (Gemma's norm weights, like those of Gemma GGUFs, include the +1
of Gemma's (1 + w): random around 1). Deterministic: a rerun writes byte-identical files.

Usage: python3 tools/reference/make_tiny_models.py [--models-dir DIR] [--out DIR] [--only NAME]
"""

import argparse
import math
import os
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T, GGUFReader, GGUFValueType, GGUFWriter, quants

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO_ROOT / "tests/data/models"
DEFAULT_MODEL_DIR = Path(os.environ.get("INFERD_MODEL_DIR", Path.home() / ".cache/inferd/models"))

QWEN_VOCAB_FROM = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
GPT_OSS_VOCAB = REPO_ROOT / "tests/data/vocab/gpt-oss-vocab.gguf"
GPT_OSS_TEMPLATE = REPO_ROOT / "tests/data/chat/gpt_oss.jinja"
SMOL_VOCAB_FROM = "SmolLM2-135M-Instruct.Q4_1.gguf"


def copy_tokenizer(writer, src_path, overrides=None):
    """Every tokenizer.* key of src_path (vocabulary, merges, token types, pre-tokenizer,
    special ids, add-BOS flags, chat template), values as they are, except the keys of
    `overrides` ({key: (value, GGUFValueType)}), written in their place with those values
    (and added after the others where src_path has no such key)."""
    r = GGUFReader(src_path)
    overrides = overrides or {}
    n = 0
    for key, f in r.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = f.types[0]
        if key in overrides:
            writer.add_key_value(key, *overrides[key])
        elif vtype == GGUFValueType.ARRAY:
            if f.types[-1] == GGUFValueType.STRING:
                writer.add_array(key, [bytes(f.parts[i]) for i in f.data])
            else:
                sub = f.types[-1]
                vals = np.concatenate([f.parts[i] for i in f.data]) if f.data else np.array([])
                # add_array would pick the element type from Python values; keep the source's.
                writer.add_key_value(key, vals.tolist(), GGUFValueType.ARRAY, sub_type=sub)
        elif vtype == GGUFValueType.STRING:
            writer.add_string(key, bytes(f.parts[-1]).decode("utf-8"))
        else:
            writer.add_key_value(key, f.parts[-1].tolist()[0], vtype)
        n += 1
    for key, value in overrides.items():
        if key not in r.fields:
            writer.add_key_value(key, *value)
            n += 1
    return n


class Builder:
    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.tensors = []  # (name, data, raw_dtype or None)

    def normal(self, shape, std):
        return (self.rng.standard_normal(shape) * std).astype(np.float32)

    def matrix(self, name, n_out, n_in, qtype, std=None):
        """A weight of GGUF shape [n_in, n_out] (numpy [n_out, n_in]), std 1/sqrt(n_in) by default."""
        w = self.normal((n_out, n_in), std if std is not None else 1.0 / math.sqrt(n_in))
        self.add(name, w, qtype)

    def norm(self, name, n, spread=0.1, center=1.0):
        self.add(name, (center + self.normal((n,), spread)).astype(np.float32), T.F32)

    def bias(self, name, n, std):
        self.add(name, self.normal((n,), std), T.F32)

    def add(self, name, data, qtype):
        if qtype == T.F32:
            self.tensors.append((name, data.astype(np.float32), None))
        elif qtype == T.F16:
            self.tensors.append((name, data.astype(np.float16), None))
        else:
            self.tensors.append((name, quants.quantize(data, qtype), qtype))

    def write(self, writer):
        for name, data, qtype in self.tensors:
            if qtype is None:
                writer.add_tensor(name, data)
            else:
                writer.add_tensor(name, data, raw_dtype=qtype)


def llama3_rope_factors(head_dim, base, factor, low_freq_factor, high_freq_factor, old_context_len):
    """convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors for rope_type "llama3"
    (float32 frequencies, as torch computes them there)."""
    exps = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
    freqs = (1.0 / (np.float32(base) ** exps)).astype(np.float32)
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / float(freq)
        if wavelen < high_freq_wavelen:
            out.append(1.0)
        elif wavelen > low_freq_wavelen:
            out.append(factor)
        else:
            smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def common_hparams(w, arch, name, h):
    w.add_name(name)
    w.add_description("random weights for inferd's tests (tools/reference/make_tiny_models.py); "
                      "not a trained model")
    w.add_context_length(h["n_ctx_train"])
    w.add_embedding_length(h["n_embd"])
    w.add_block_count(h["n_layer"])
    w.add_feed_forward_length(h["n_ff"])
    w.add_head_count(h["n_head"])
    w.add_head_count_kv(h["n_head_kv"])
    w.add_rope_freq_base(h["rope_base"])
    w.add_layer_norm_rms_eps(h["rms_eps"])
    if h.get("head_dim"):
        w.add_key_length(h["head_dim"])
        w.add_value_length(h["head_dim"])


# Types per layer, cycled, so that each projection kind meets several GGML types.
# Only types whose every GGML path inferd follows bit for bit (kernels_ggml_matmul_test's
# matched(): Q4_1, Q5_0, Q8_0; the K-quants need rows of 256 and more): a model made of
# others would test kernels that are not yet exact, not the architecture.
QWEN3_TYPES = [
    dict(q=T.Q8_0, k=T.Q5_0, v=T.Q4_1, o=T.Q5_0, gate=T.Q8_0, up=T.Q4_1, down=T.Q5_0),
    dict(q=T.Q5_0, k=T.Q8_0, v=T.Q5_0, o=T.Q4_1, gate=T.Q5_0, up=T.Q8_0, down=T.Q8_0),
]
LLAMA3_TYPES = [
    dict(q=T.Q5_0, k=T.Q8_0, v=T.Q4_1, o=T.Q8_0, gate=T.Q5_0, up=T.Q4_1, down=T.Q8_0),
    dict(q=T.Q8_0, k=T.Q5_0, v=T.Q8_0, o=T.Q4_1, gate=T.Q8_0, up=T.Q8_0, down=T.Q4_1),
]


def attention_block(b, h, t, p, q_k_norm=False, qkv_bias=False):
    """Layer p's attention norm and projections (types t), in the order the files hold them."""
    n_embd = h["n_embd"]
    head_dim = h.get("head_dim") or n_embd // h["n_head"]
    q_dim, kv_dim = h["n_head"] * head_dim, h["n_head_kv"] * head_dim
    b.norm(p + "attn_norm.weight", n_embd)
    b.matrix(p + "attn_q.weight", q_dim, n_embd, t["q"])
    b.matrix(p + "attn_k.weight", kv_dim, n_embd, t["k"])
    b.matrix(p + "attn_v.weight", kv_dim, n_embd, t["v"])
    if qkv_bias:
        b.bias(p + "attn_q.bias", q_dim, 0.5)
        b.bias(p + "attn_k.bias", kv_dim, 0.5)
        b.bias(p + "attn_v.bias", kv_dim, 0.1)
    if q_k_norm:
        b.norm(p + "attn_q_norm.weight", head_dim, spread=0.2)
        b.norm(p + "attn_k_norm.weight", head_dim, spread=0.2)
    # Output projections a little larger than 1/sqrt(n): attention and FFN should move the
    # residual stream enough that the context matters to the next token.
    b.matrix(p + "attn_output.weight", n_embd, q_dim, t["o"], std=1.5 / math.sqrt(q_dim))


def transformer_layers(b, h, types, q_k_norm=False, qkv_bias=False):
    n_embd, n_ff = h["n_embd"], h["n_ff"]
    for i in range(h["n_layer"]):
        t = types[i % len(types)]
        p = f"blk.{i}."
        attention_block(b, h, t, p, q_k_norm, qkv_bias)
        b.norm(p + "ffn_norm.weight", n_embd)
        b.matrix(p + "ffn_gate.weight", n_ff, n_embd, t["gate"])
        b.matrix(p + "ffn_up.weight", n_ff, n_embd, t["up"])
        b.matrix(p + "ffn_down.weight", n_embd, n_ff, t["down"], std=1.5 / math.sqrt(n_ff))


def make_qwen3(models_dir, path):
    h = dict(n_ctx_train=4096, n_embd=32, n_layer=2, n_ff=96, n_head=4, n_head_kv=2, head_dim=32,
             rope_base=1000000.0, rms_eps=1e-6)
    w = GGUFWriter(path, "qwen3")
    common_hparams(w, "qwen3", "inferd tiny qwen3 (random)", h)
    copy_tokenizer(w, models_dir / QWEN_VOCAB_FROM)
    n_vocab = 151936
    b = Builder(seed=3)
    # Tied output: logits = (g * norm(h)) . token_embd, so the embedding's scale sets the logits'
    # spread. With g near 1 the input token's own embedding, which dominates the residual stream
    # of an untrained model, would score highest and greedy would repeat it forever; a zero-mean
    # output norm weight g removes that bias.
    b.matrix("token_embd.weight", n_vocab, h["n_embd"], T.Q5_0, std=0.6)
    b.norm("output_norm.weight", h["n_embd"], spread=1.0, center=0.0)
    transformer_layers(b, h, QWEN3_TYPES, q_k_norm=True)
    b.write(w)
    return w


def make_qwen3_embed_last(models_dir, path):
    h = dict(n_ctx_train=4096, n_embd=32, n_layer=2, n_ff=96, n_head=4, n_head_kv=2, head_dim=32,
             rope_base=1000000.0, rms_eps=1e-6)
    w = GGUFWriter(path, "qwen3")
    common_hparams(w, "qwen3", "inferd tiny qwen3 embedding, last-token pooling (random)", h)
    w.add_pooling_type(gguf.PoolingType.LAST)
    copy_tokenizer(w, models_dir / QWEN_VOCAB_FROM,
                   {"tokenizer.ggml.eos_token_id": (151643, GGUFValueType.UINT32),  # <|endoftext|>
                    "tokenizer.ggml.add_eos_token": (True, GGUFValueType.BOOL)})
    b = Builder(seed=71)
    b.matrix("token_embd.weight", 151936, h["n_embd"], T.Q5_0, std=0.6)
    b.norm("output_norm.weight", h["n_embd"])
    transformer_layers(b, h, QWEN3_TYPES, q_k_norm=True)
    b.write(w)
    return w


def make_llama_embed_mean(models_dir, path):
    h = dict(n_ctx_train=8192, n_embd=64, n_layer=2, n_ff=192, n_head=2, n_head_kv=1,
             rope_base=500000.0, rms_eps=1e-5)
    w = GGUFWriter(path, "llama")
    common_hparams(w, "llama", "inferd tiny llama embedding, mean pooling (random)", h)
    w.add_rope_dimension_count(h["n_embd"] // h["n_head"])
    w.add_vocab_size(49152)
    w.add_pooling_type(gguf.PoolingType.MEAN)
    copy_tokenizer(w, models_dir / SMOL_VOCAB_FROM)
    b = Builder(seed=73)
    b.matrix("token_embd.weight", 49152, h["n_embd"], T.Q8_0, std=1.0)
    transformer_layers(b, h, LLAMA3_TYPES)
    b.norm("output_norm.weight", h["n_embd"])
    b.write(w)
    return w


# Expert tensors are 3-D with one GGML type for all of a layer's experts; the types cycle per
# layer as the dense projections' do.
QWEN3MOE_TYPES = [
    dict(q=T.Q8_0, k=T.Q5_0, v=T.Q4_1, o=T.Q5_0, gate=T.Q8_0, up=T.Q4_1, down=T.Q5_0),
    dict(q=T.Q5_0, k=T.Q8_0, v=T.Q5_0, o=T.Q4_1, gate=T.Q5_0, up=T.Q8_0, down=T.Q8_0),
    dict(q=T.Q4_1, k=T.Q8_0, v=T.Q8_0, o=T.Q8_0, gate=T.Q4_1, up=T.Q5_0, down=T.Q4_1),
]


def make_qwen3moe(models_dir, path):
    h = dict(n_ctx_train=4096, n_embd=32, n_layer=3, n_ff=256, n_head=4, n_head_kv=2, head_dim=32,
             rope_base=1000000.0, rms_eps=1e-6)
    n_expert, n_expert_used, n_ff_exp = 16, 4, 64
    w = GGUFWriter(path, "qwen3moe")
    common_hparams(w, "qwen3moe", "inferd tiny qwen3moe (random)", h)
    w.add_expert_count(n_expert)
    w.add_expert_used_count(n_expert_used)
    w.add_expert_feed_forward_length(n_ff_exp)
    copy_tokenizer(w, models_dir / QWEN_VOCAB_FROM)
    n_vocab = 151936
    b = Builder(seed=37)
    b.matrix("token_embd.weight", n_vocab, h["n_embd"], T.Q5_0, std=0.6)
    b.norm("output_norm.weight", h["n_embd"], spread=1.0, center=0.0)  # zero-mean: see make_qwen3
    n_embd = h["n_embd"]
    for i in range(h["n_layer"]):
        t = QWEN3MOE_TYPES[i % len(QWEN3MOE_TYPES)]
        p = f"blk.{i}."
        attention_block(b, h, t, p, q_k_norm=True)
        b.norm(p + "ffn_norm.weight", n_embd)
        # Router logits with a standard deviation near 2: each token has favourites, yet the
        # top-4 weights are not one-hot, so every chosen expert moves the output.
        b.matrix(p + "ffn_gate_inp.weight", n_expert, n_embd, T.F32, std=2.0 / math.sqrt(n_embd))
        b.add(p + "ffn_gate_exps.weight", b.normal((n_expert, n_ff_exp, n_embd), 1.0 / math.sqrt(n_embd)), t["gate"])
        b.add(p + "ffn_up_exps.weight", b.normal((n_expert, n_ff_exp, n_embd), 1.0 / math.sqrt(n_embd)), t["up"])
        b.add(p + "ffn_down_exps.weight", b.normal((n_expert, n_embd, n_ff_exp), 3.0 / math.sqrt(n_ff_exp)),
              t["down"])
    b.write(w)
    return w


def make_llama3(models_dir, path):
    h = dict(n_ctx_train=131072, n_embd=64, n_layer=2, n_ff=192, n_head=2, n_head_kv=1,
             rope_base=500000.0, rms_eps=1e-5)
    head_dim = h["n_embd"] // h["n_head"]
    w = GGUFWriter(path, "llama")
    common_hparams(w, "llama", "inferd tiny llama 3 (random)", h)
    w.add_rope_dimension_count(head_dim)
    w.add_vocab_size(49152)
    copy_tokenizer(w, models_dir / SMOL_VOCAB_FROM)
    n_vocab = 49152
    b = Builder(seed=31)
    b.matrix("token_embd.weight", n_vocab, h["n_embd"], T.Q8_0, std=1.0)
    b.add("rope_freqs.weight", llama3_rope_factors(head_dim, h["rope_base"], factor=32.0, low_freq_factor=1.0,
                                                   high_freq_factor=4.0, old_context_len=8192), T.F32)
    transformer_layers(b, h, LLAMA3_TYPES)
    b.norm("output_norm.weight", h["n_embd"])
    b.matrix("output.weight", n_vocab, h["n_embd"], T.Q8_0, std=0.6)
    b.write(w)
    return w


def make_llama_mxfp4(models_dir, path):
    h = dict(n_ctx_train=4096, n_embd=64, n_layer=2, n_ff=100, n_head=2, n_head_kv=1,
             rope_base=10000.0, rms_eps=1e-5)
    head_dim = h["n_embd"] // h["n_head"]
    w = GGUFWriter(path, "llama")
    common_hparams(w, "llama", "inferd tiny llama, MXFP4 (random)", h)
    w.add_rope_dimension_count(head_dim)
    w.add_vocab_size(49152)
    copy_tokenizer(w, models_dir / SMOL_VOCAB_FROM)
    n_vocab = 49152
    b = Builder(seed=39)
    b.matrix("token_embd.weight", n_vocab, h["n_embd"], T.Q8_0, std=1.0)
    t = dict(q=T.MXFP4, k=T.MXFP4, v=T.MXFP4, o=T.MXFP4)
    for i in range(h["n_layer"]):
        p = f"blk.{i}."
        attention_block(b, h, t, p)
        b.norm(p + "ffn_norm.weight", h["n_embd"])
        b.matrix(p + "ffn_gate.weight", h["n_ff"], h["n_embd"], T.MXFP4)
        b.matrix(p + "ffn_up.weight", h["n_ff"], h["n_embd"], T.MXFP4)
        b.matrix(p + "ffn_down.weight", h["n_embd"], h["n_ff"], T.F32, std=1.5 / math.sqrt(h["n_ff"]))
    b.norm("output_norm.weight", h["n_embd"])
    b.matrix("output.weight", n_vocab, h["n_embd"], T.MXFP4, std=0.6)
    b.write(w)
    return w


# Cycled over the six layers (layers 2 and 5, the global ones, get the third).
GEMMA3_TYPES = [
    dict(q=T.Q5_0, k=T.Q8_0, v=T.Q4_1, o=T.Q8_0, gate=T.Q4_1, up=T.Q5_0, down=T.Q8_0),
    dict(q=T.Q8_0, k=T.Q4_1, v=T.Q5_0, o=T.Q4_1, gate=T.Q8_0, up=T.Q8_0, down=T.Q5_0),
    dict(q=T.Q4_1, k=T.Q5_0, v=T.Q8_0, o=T.Q5_0, gate=T.Q5_0, up=T.Q4_1, down=T.Q4_1),
]
# `gemma3.attention.sliding_window_pattern` as one flag per layer (llama.cpp's
# load_swa_pattern reads a bool array, or an int period n: every n-th layer global; without the
# key gemma3's period is 6, as in real Gemma 3 files): layers 2 and 5 attend globally, the
# others within the window.
GEMMA3_WINDOWED = [True, True, False, True, True, False]
# The window: far below the reference prompts (up to 1,000 tokens + 64 generated), so that the
# windowed layers' masks cut off most of a long prompt, and below one 512-token micro-batch.
GEMMA3_SLIDING_WINDOW = 64
# Scales. Token embeddings are multiplied by sqrt(n_embd) = 8 on input: std 0.08 puts the
# scaled embedding near the unit RMS that each sandwich-normed branch adds, so the context
# steers the next token. q/k norm weights near 2 (RMS 2 per head after the norm) sharpen the
# attention (scores of std ~4 at scale 1/sqrt(32)); near 1 the softmax is so flat that greedy
# keeps repeating tokens. The tied output's zero-mean output norm weight (spread 5) sets the
# logits' standard deviation (~3.5).
GEMMA3_EMBD_STD = 0.08
GEMMA3_OUT_NORM_SPREAD = 5.0
GEMMA3_QK_NORM_CENTER = 2.0


def make_gemma3(models_dir, path):
    h = dict(n_ctx_train=32768, n_embd=64, n_layer=6, n_ff=192, n_head=4, n_head_kv=1, head_dim=32,
             rope_base=1000000.0, rms_eps=1e-6)
    w = GGUFWriter(path, "gemma3")
    common_hparams(w, "gemma3", "inferd tiny gemma 3 (random)", h)
    w.add_sliding_window(GEMMA3_SLIDING_WINDOW)
    w.add_sliding_window_pattern(GEMMA3_WINDOWED)
    # The windowed layers' RoPE base: llama.cpp's default (real Gemma 3 files leave the key out),
    # written so that the file says it; the global layers use rope.freq_base (1e6).
    w.add_rope_freq_base_swa(10000.0)
    # SmolLM2's tokenizer, but with a BOS in front of every prompt, as Gemma's tokenizer does.
    copy_tokenizer(w, models_dir / SMOL_VOCAB_FROM,
                   overrides={"tokenizer.ggml.add_bos_token": (True, GGUFValueType.BOOL)})
    n_vocab = 49152
    b = Builder(seed=7)
    # Tied output, as Gemma 3; the zero-mean output norm weight also removes the tied
    # embedding's pull towards the input token (see make_qwen3).
    b.matrix("token_embd.weight", n_vocab, h["n_embd"], T.Q5_0, std=GEMMA3_EMBD_STD)
    b.norm("output_norm.weight", h["n_embd"], spread=GEMMA3_OUT_NORM_SPREAD, center=0.0)
    n_embd, n_ff, head_dim = h["n_embd"], h["n_ff"], h["head_dim"]
    q_dim, kv_dim = h["n_head"] * head_dim, h["n_head_kv"] * head_dim
    for i in range(h["n_layer"]):
        t = GEMMA3_TYPES[i % len(GEMMA3_TYPES)]
        p = f"blk.{i}."
        # Norm weights as Gemma GGUFs store them, with the +1 of Gemma's (1 + w) folded in.
        b.norm(p + "attn_norm.weight", n_embd)
        b.matrix(p + "attn_q.weight", q_dim, n_embd, t["q"])
        b.matrix(p + "attn_k.weight", kv_dim, n_embd, t["k"])
        b.matrix(p + "attn_v.weight", kv_dim, n_embd, t["v"])
        b.norm(p + "attn_q_norm.weight", head_dim, spread=0.3, center=GEMMA3_QK_NORM_CENTER)
        b.norm(p + "attn_k_norm.weight", head_dim, spread=0.3, center=GEMMA3_QK_NORM_CENTER)
        b.matrix(p + "attn_output.weight", n_embd, q_dim, t["o"])
        b.norm(p + "post_attention_norm.weight", n_embd, spread=0.2)
        b.norm(p + "ffn_norm.weight", n_embd)
        b.matrix(p + "ffn_gate.weight", n_ff, n_embd, t["gate"])
        b.matrix(p + "ffn_up.weight", n_ff, n_embd, t["up"])
        b.matrix(p + "ffn_down.weight", n_embd, n_ff, t["down"])
        b.norm(p + "post_ffw_norm.weight", n_embd, spread=0.2)
    b.write(w)
    return w


# Mistral v0.3's first ids: <unk>, <s>, </s>, then its control tokens (v0.3 has 771 of them before
# the byte tokens; these are the ones its tools template writes).
MISTRAL_SPECIALS = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
                    "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"]
# Pieces of two characters, merged by SentencePiece's bigram scores (both halves are tokens), so
# JSON and the template's words do not all go one character a token.
MISTRAL_PAIRS = ['{"', '":', '",', '"}', '▁"', '▁{', '▁[', "}]", "},", "▁a", "▁t", "▁w", "th", "he", "in",
                 "er", "an", "re", "on", "at", "es", "na", "me", "ty", "it"]
MISTRAL_TEMPLATE = REPO_ROOT / "tests/data/chat/mistral_v3_tools.jinja"


def mistral_vocab():
    """(tokens, scores, token types) of the tiny Mistral's SentencePiece vocabulary."""
    tokens, scores, types = [], [], []
    for i, t in enumerate(MISTRAL_SPECIALS):
        tokens.append(t)
        scores.append(0.0)
        types.append(gguf.TokenType.UNKNOWN if i == 0 else gguf.TokenType.CONTROL)
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        scores.append(0.0)
        types.append(gguf.TokenType.BYTE)
    singles = ["▁"] + [chr(c) for c in range(0x21, 0x7F)]
    for i, t in enumerate(singles):
        tokens.append(t)
        scores.append(-1000.0 - i)  # below every pair: pairs merge first
        types.append(gguf.TokenType.NORMAL)
    for i, t in enumerate(MISTRAL_PAIRS):
        tokens.append(t)
        scores.append(-10.0 - i)
        types.append(gguf.TokenType.NORMAL)
    return tokens, scores, types


def make_mistral(models_dir, path):
    h = dict(n_ctx_train=32768, n_embd=64, n_layer=2, n_head=2, n_head_kv=1, n_ff=192,
             rope_base=1000000.0, rms_eps=1e-5)
    w = GGUFWriter(path, "llama")
    common_hparams(w, "llama", "inferd tiny mistral v0.3 (random)", h)
    w.add_rope_dimension_count(h["n_embd"] // h["n_head"])
    tokens, scores, types = mistral_vocab()
    n_vocab = len(tokens)
    w.add_vocab_size(n_vocab)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_chat_template(MISTRAL_TEMPLATE.read_text())
    b = Builder(seed=37)
    b.matrix("token_embd.weight", n_vocab, h["n_embd"], T.Q8_0, std=1.0)
    transformer_layers(b, h, LLAMA3_TYPES)
    b.norm("output_norm.weight", h["n_embd"])
    b.matrix("output.weight", n_vocab, h["n_embd"], T.Q8_0, std=0.6)
    b.write(w)
    return w



# gpt-oss keeps its attention and router in 8 bits or more and its experts in MXFP4; the
# attention types cycle per layer as elsewhere.
GPT_OSS_TYPES = [
    dict(q=T.Q8_0, k=T.Q5_0, v=T.Q4_1, o=T.Q5_0),
    dict(q=T.Q5_0, k=T.Q8_0, v=T.Q5_0, o=T.Q4_1),
]


def make_gpt_oss(models_dir, path):
    h = dict(n_ctx_train=131072, n_embd=32, n_layer=4, n_ff=64, n_head=4, n_head_kv=2, head_dim=64,
             rope_base=150000.0, rms_eps=1e-5)
    n_expert, n_expert_used, n_ff_exp = 16, 4, 64
    w = GGUFWriter(path, "gpt-oss")
    common_hparams(w, "gpt-oss", "inferd tiny gpt-oss (random)", h)
    w.add_expert_count(n_expert)
    w.add_expert_used_count(n_expert_used)
    w.add_expert_feed_forward_length(n_ff_exp)
    w.add_sliding_window(128)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(32.0)
    w.add_rope_scaling_orig_ctx_len(4096)
    copy_tokenizer(w, GPT_OSS_VOCAB,
                   {"tokenizer.chat_template": (GPT_OSS_TEMPLATE.read_text(), GGUFValueType.STRING)})
    if not any(k == "tokenizer.chat_template" for k in GGUFReader(GPT_OSS_VOCAB).fields):
        w.add_chat_template(GPT_OSS_TEMPLATE.read_text())
    n_vocab = 201088
    n_embd, q_dim = h["n_embd"], h["n_head"] * h["head_dim"]
    b = Builder(seed=38)
    b.matrix("token_embd.weight", n_vocab, n_embd, T.Q5_0, std=1.0)
    for i in range(h["n_layer"]):
        t = GPT_OSS_TYPES[i % len(GPT_OSS_TYPES)]
        p = f"blk.{i}."
        attention_block(b, h, t, p, qkv_bias=True)
        b.bias(p + "attn_output.bias", n_embd, 0.1)
        # Sinks near the scores' scale: some heads put real weight on them, none all.
        b.add(p + "attn_sinks.weight", b.normal((h["n_head"],), 1.0), T.F32)
        b.norm(p + "post_attention_norm.weight", n_embd)
        b.matrix(p + "ffn_gate_inp.weight", n_expert, n_embd, T.F32, std=2.0 / math.sqrt(n_embd))
        b.bias(p + "ffn_gate_inp.bias", n_expert, 0.5)
        # Gate and up wide enough that the clamp at 7 and the sigmoid's tails are reached.
        b.add(p + "ffn_gate_exps.weight", b.normal((n_expert, n_ff_exp, n_embd), 3.0 / math.sqrt(n_embd)), T.MXFP4)
        b.add(p + "ffn_gate_exps.bias", b.normal((n_expert, n_ff_exp), 0.5), T.F32)
        b.add(p + "ffn_up_exps.weight", b.normal((n_expert, n_ff_exp, n_embd), 3.0 / math.sqrt(n_embd)), T.MXFP4)
        b.add(p + "ffn_up_exps.bias", b.normal((n_expert, n_ff_exp), 0.5), T.F32)
        b.add(p + "ffn_down_exps.weight", b.normal((n_expert, n_embd, n_ff_exp), 1.0 / math.sqrt(n_ff_exp)),
              T.MXFP4)
        b.add(p + "ffn_down_exps.bias", b.normal((n_expert, n_embd), 0.1), T.F32)
    b.norm("output_norm.weight", n_embd)
    b.matrix("output.weight", n_vocab, n_embd, T.Q5_0, std=0.6)
    b.write(w)
    return w


def shared_expert_moe_block(b, p, t, n_embd, n_expert, n_ff_exp, n_shared, selection_bias, down_std):
    """A mixture-of-experts FFN with shared experts (glm4moe, deepseek2): an F32 router, a selection
    bias when asked, the 3-D experts (types t, the down projection's std down_std / sqrt(width)), and
    the shared experts' dense MLP of n_ff_exp * n_shared."""
    b.matrix(p + "ffn_gate_inp.weight", n_expert, n_embd, T.F32, std=2.0 / math.sqrt(n_embd))
    if selection_bias:
        # A selection bias of the sigmoid probabilities' own scale: it changes which experts are
        # chosen for many tokens, but not the chosen ones' weights.
        b.bias(p + "exp_probs_b.bias", n_expert, 0.3)
    b.add(p + "ffn_gate_exps.weight", b.normal((n_expert, n_ff_exp, n_embd), 1.0 / math.sqrt(n_embd)), t["gate"])
    b.add(p + "ffn_up_exps.weight", b.normal((n_expert, n_ff_exp, n_embd), 1.0 / math.sqrt(n_embd)), t["up"])
    b.add(p + "ffn_down_exps.weight", b.normal((n_expert, n_embd, n_ff_exp), down_std / math.sqrt(n_ff_exp)),
          t["down"])
    n_ff_sh = n_ff_exp * n_shared
    b.matrix(p + "ffn_gate_shexp.weight", n_ff_sh, n_embd, t["gate"])
    b.matrix(p + "ffn_up_shexp.weight", n_ff_sh, n_embd, t["up"])
    b.matrix(p + "ffn_down_shexp.weight", n_embd, n_ff_sh, t["down"], std=1.5 / math.sqrt(n_ff_sh))


# The dense leading layers and the MoE layers cycle types as qwen3moe's; the shared expert takes
# the layer's dense gate/up/down types.
def make_glm4moe(models_dir, path):
    n_trunk, n_nextn, n_dense = 4, 1, 2
    h = dict(n_ctx_train=4096, n_embd=32, n_layer=n_trunk + n_nextn, n_ff=96, n_head=4, n_head_kv=2, head_dim=32,
             rope_base=1000000.0, rms_eps=1e-5)
    n_expert, n_expert_used, n_ff_exp, n_shared = 16, 4, 64, 1
    rope_dim = h["head_dim"] // 2  # GLM-4.5's partial_rotary_factor 0.5
    w = GGUFWriter(path, "glm4moe")
    common_hparams(w, "glm4moe", "inferd tiny glm4moe (random)", h)
    w.add_rope_dimension_count(rope_dim)
    w.add_expert_count(n_expert)
    w.add_expert_used_count(n_expert_used)
    w.add_expert_feed_forward_length(n_ff_exp)
    w.add_expert_shared_count(n_shared)
    w.add_leading_dense_block_count(n_dense)
    w.add_expert_weights_scale(2.5)
    w.add_expert_weights_norm(True)
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_nextn_predict_layers(n_nextn)
    copy_tokenizer(w, models_dir / QWEN_VOCAB_FROM)
    n_vocab = 151936
    b = Builder(seed=45)
    b.matrix("token_embd.weight", n_vocab, h["n_embd"], T.Q5_0, std=0.6)
    b.norm("output_norm.weight", h["n_embd"], spread=1.0, center=0.0)  # zero-mean: see make_qwen3
    n_embd, n_ff = h["n_embd"], h["n_ff"]
    for i in range(h["n_layer"]):
        t = QWEN3MOE_TYPES[i % len(QWEN3MOE_TYPES)]
        p = f"blk.{i}."
        attention_block(b, h, t, p, qkv_bias=True)
        b.norm(p + "post_attention_norm.weight", n_embd)
        if i < n_dense:
            b.matrix(p + "ffn_gate.weight", n_ff, n_embd, t["gate"])
            b.matrix(p + "ffn_up.weight", n_ff, n_embd, t["up"])
            b.matrix(p + "ffn_down.weight", n_embd, n_ff, t["down"], std=1.5 / math.sqrt(n_ff))
        else:
            shared_expert_moe_block(b, p, t, n_embd, n_expert, n_ff_exp, n_shared, selection_bias=True,
                                    down_std=1.5)
        if i >= n_trunk:
            # The NextN block's own tensors: llama.cpp's main graph never reads them.
            b.matrix(p + "nextn.eh_proj.weight", n_embd, 2 * n_embd, T.Q8_0)
            b.norm(p + "nextn.enorm.weight", n_embd)
            b.norm(p + "nextn.hnorm.weight", n_embd)
            b.norm(p + "nextn.shared_head_norm.weight", n_embd)
    b.write(w)
    return w


# Types per layer for the latent attention's projections, cycled as qwen3moe's.
DEEPSEEK2_TYPES = [
    dict(q=T.Q8_0, q_a=T.Q5_0, q_b=T.Q8_0, kv_a=T.Q5_0, k_b=T.Q8_0, v_b=T.Q4_1, o=T.Q5_0, gate=T.Q8_0, up=T.Q4_1,
         down=T.Q5_0),
    dict(q=T.Q5_0, q_a=T.Q8_0, q_b=T.Q4_1, kv_a=T.Q8_0, k_b=T.Q5_0, v_b=T.Q8_0, o=T.Q4_1, gate=T.Q5_0, up=T.Q8_0,
         down=T.Q8_0),
    dict(q=T.Q4_1, q_a=T.Q4_1, q_b=T.Q5_0, kv_a=T.Q8_0, k_b=T.Q8_0, v_b=T.Q5_0, o=T.Q8_0, gate=T.Q4_1, up=T.Q5_0,
         down=T.Q4_1),
]


def make_deepseek2_variant(models_dir, path, name, seed, n_layer, n_dense, q_lora_rank, kv_lora_rank,
                           mscale_all_dim, n_shared, sigmoid, kv_b=None, qk_rope=16):
    """A `deepseek2` file as convert_hf_to_gguf.py writes DeepSeek V2/V3 (DeepseekV2Model): MQA-shaped
    latent attention (head_count_kv 1, key_length kv_lora_rank + rope, value_length kv_lora_rank, the
    per-head sizes in key_length_mla/value_length_mla), kv_b_proj split into attn_k_b (transposed)
    and attn_v_b.

    kv_b "unsplit": as the converter wrote these models before that split: kv_b_proj as one F16
    attn_kv_b, MHA-shaped metadata (head_count_kv n_head, key_length qk_nope + qk_rope, value_length
    v_head, no *_mla keys). kv_b "split": that attn_kv_b split as today's converter splits it
    (modify_tensors: view per head, split, transpose k_b), in F16. Both draw the same weights as the
    default (k_b and v_b drawn as it draws them, then laid out as kv_b_proj)."""
    n_embd, n_head, qk_nope, v_head = 32, 4, 32, 32
    n_ff, n_expert, n_expert_used, n_ff_exp = 96, 16, 4, 32
    yarn_factor, orig_ctx = 40.0, 4096
    w = GGUFWriter(path, "deepseek2")
    h = dict(n_ctx_train=int(orig_ctx * yarn_factor), n_embd=n_embd, n_layer=n_layer, n_ff=n_ff, n_head=n_head,
             n_head_kv=n_head if kv_b == "unsplit" else 1, rope_base=10000.0, rms_eps=1e-6)
    common_hparams(w, "deepseek2", name, h)
    w.add_vocab_size(151936)
    w.add_leading_dense_block_count(n_dense)
    w.add_q_lora_rank(q_lora_rank)  # 0: attn_q (llama.cpp reads the key unless the layer count is V2-Lite's)
    w.add_kv_lora_rank(kv_lora_rank)
    if kv_b == "unsplit":
        w.add_key_length(qk_nope + qk_rope)
        w.add_value_length(v_head)
    else:
        w.add_key_length(kv_lora_rank + qk_rope)
        w.add_value_length(kv_lora_rank)
        w.add_key_length_mla(qk_nope + qk_rope)
        w.add_value_length_mla(v_head)
    w.add_expert_feed_forward_length(n_ff_exp)
    w.add_expert_count(n_expert)
    w.add_expert_used_count(n_expert_used)
    w.add_expert_shared_count(n_shared)
    if sigmoid:
        w.add_expert_weights_scale(2.5)
        w.add_expert_weights_norm(True)
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    else:
        w.add_expert_weights_scale(1.0)  # V2-Lite's routed_scaling_factor; no norm, softmax by default
    w.add_rope_dimension_count(qk_rope)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(yarn_factor)
    w.add_rope_scaling_orig_ctx_len(orig_ctx)
    w.add_rope_scaling_yarn_log_mul(0.1 * mscale_all_dim)  # as the converter writes it
    copy_tokenizer(w, models_dir / QWEN_VOCAB_FROM)
    n_vocab = 151936
    b = Builder(seed=seed)
    b.matrix("token_embd.weight", n_vocab, n_embd, T.Q5_0, std=0.6)
    b.norm("output_norm.weight", n_embd, spread=1.0, center=0.0)  # zero-mean: see make_qwen3
    for i in range(n_layer):
        t = DEEPSEEK2_TYPES[i % len(DEEPSEEK2_TYPES)]
        p = f"blk.{i}."
        b.norm(p + "attn_norm.weight", n_embd)
        if q_lora_rank > 0:
            b.matrix(p + "attn_q_a.weight", q_lora_rank, n_embd, t["q_a"])
            b.norm(p + "attn_q_a_norm.weight", q_lora_rank)
            b.matrix(p + "attn_q_b.weight", n_head * (qk_nope + qk_rope), q_lora_rank, t["q_b"])
        else:
            b.matrix(p + "attn_q.weight", n_head * (qk_nope + qk_rope), n_embd, t["q"])
        b.matrix(p + "attn_kv_a_mqa.weight", kv_lora_rank + qk_rope, n_embd, t["kv_a"])
        b.norm(p + "attn_kv_a_norm.weight", kv_lora_rank)
        # GGUF [qk_nope, kv_lora_rank, n_head]: per head, kv_lora_rank rows of qk_nope (k_b transposed).
        k_b = b.normal((n_head, kv_lora_rank, qk_nope), 1.0 / math.sqrt(qk_nope))
        # GGUF [kv_lora_rank, v_head, n_head]: per head, v_head rows of kv_lora_rank.
        v_b = b.normal((n_head, v_head, kv_lora_rank), 1.0 / math.sqrt(kv_lora_rank))
        if kv_b is None:
            b.add(p + "attn_k_b.weight", k_b, t["k_b"])
            b.add(p + "attn_v_b.weight", v_b, t["v_b"])
        else:
            # kv_b_proj ([n_head * (qk_nope + v_head), kv_lora_rank]): per head its key rows, then its value rows.
            kv_b_proj = np.concatenate([k_b.transpose(0, 2, 1), v_b], axis=1).reshape(-1, kv_lora_rank)
            if kv_b == "unsplit":
                b.add(p + "attn_kv_b.weight", kv_b_proj, T.F16)
            else:  # convert_hf_to_gguf.py's split (DeepseekV2Model.modify_tensors), in numpy
                per_head = kv_b_proj.reshape(n_head, qk_nope + v_head, kv_lora_rank)
                b.add(p + "attn_k_b.weight", np.ascontiguousarray(per_head[:, :qk_nope, :].transpose(0, 2, 1)), T.F16)
                b.add(p + "attn_v_b.weight", np.ascontiguousarray(per_head[:, qk_nope:, :]), T.F16)
        b.matrix(p + "attn_output.weight", n_embd, n_head * v_head, t["o"], std=1.5 / math.sqrt(n_head * v_head))
        b.norm(p + "ffn_norm.weight", n_embd)
        if i < n_dense:
            b.matrix(p + "ffn_gate.weight", n_ff, n_embd, t["gate"])
            b.matrix(p + "ffn_up.weight", n_ff, n_embd, t["up"])
            b.matrix(p + "ffn_down.weight", n_embd, n_ff, t["down"], std=1.5 / math.sqrt(n_ff))
            continue
        shared_expert_moe_block(b, p, t, n_embd, n_expert, n_ff_exp, n_shared, selection_bias=sigmoid, down_std=2.0)
    b.write(w)
    return w


# llama.cpp's BERT vocabulary (bge's, the same WordPiece vocabulary as BERT base uncased), from
# its source tree: setup_llama_cpp_python.sh unpacks it beside the build.
BERT_VOCAB = Path(os.environ.get("INFERD_LLAMA_CPP_SRC", Path.home() / ".cache/inferd/llama.cpp/src")) / \
    "models/ggml-vocab-bert-bge.gguf"


def make_bert_reranker(models_dir, path):
    """A BERT cross-encoder with llama.cpp's rank pooling: the [CLS] row through
    cls (n_embd -> n_embd, tanh) and cls.output (-> one score), as bge-reranker's
    classification head."""
    h = dict(n_ctx_train=512, n_embd=32, n_layer=2, n_ff=64, n_head=4)
    E, F = h["n_embd"], h["n_ff"]
    w = GGUFWriter(path, "bert")
    w.add_name("inferd tiny bert reranker (random)")
    w.add_description("random weights for inferd's tests (tools/reference/make_tiny_models.py); "
                      "not a trained model")
    w.add_context_length(h["n_ctx_train"])
    w.add_embedding_length(E)
    w.add_block_count(h["n_layer"])
    w.add_feed_forward_length(F)
    w.add_head_count(h["n_head"])
    w.add_layer_norm_eps(1e-12)
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType.RANK)
    copy_tokenizer(w, BERT_VOCAB)
    n_vocab = 30522
    b = Builder(seed=11)
    b.matrix("token_embd.weight", n_vocab, E, T.F16, std=1.0)
    b.add("position_embd.weight", b.normal((h["n_ctx_train"], E), 0.5), T.F32)
    b.add("token_types.weight", b.normal((2, E), 0.5), T.F32)
    b.norm("token_embd_norm.weight", E, spread=0.2)
    b.bias("token_embd_norm.bias", E, 0.1)
    for i, t in enumerate(QWEN3_TYPES[: h["n_layer"]]):
        p = f"blk.{i}."
        b.matrix(p + "attn_q.weight", E, E, t["q"], std=2.0 / math.sqrt(E))
        b.bias(p + "attn_q.bias", E, 0.2)
        b.matrix(p + "attn_k.weight", E, E, t["k"], std=2.0 / math.sqrt(E))
        b.bias(p + "attn_k.bias", E, 0.2)
        b.matrix(p + "attn_v.weight", E, E, t["v"])
        b.bias(p + "attn_v.bias", E, 0.1)
        b.matrix(p + "attn_output.weight", E, E, t["o"])
        b.bias(p + "attn_output.bias", E, 0.1)
        b.norm(p + "attn_output_norm.weight", E, spread=0.2)
        b.bias(p + "attn_output_norm.bias", E, 0.1)
        b.matrix(p + "ffn_up.weight", F, E, t["up"])
        b.bias(p + "ffn_up.bias", F, 0.2)
        b.matrix(p + "ffn_down.weight", E, F, t["down"])
        b.bias(p + "ffn_down.bias", E, 0.1)
        b.norm(p + "layer_output_norm.weight", E, spread=0.2)
        b.bias(p + "layer_output_norm.bias", E, 0.1)
    b.matrix("cls.weight", E, E, T.F32)
    b.bias("cls.bias", E, 0.1)
    b.matrix("cls.output.weight", 1, E, T.F32, std=2.0 / math.sqrt(E))
    b.bias("cls.output.bias", 1, 0.1)
    b.write(w)
    return w


def make_deepseek2_lite(models_dir, path):
    return make_deepseek2_variant(models_dir, path, "inferd tiny deepseek2 V2-Lite-shaped (random)", seed=61,
                                  n_layer=3, n_dense=1, q_lora_rank=0, kv_lora_rank=64, mscale_all_dim=0.707,
                                  n_shared=2, sigmoid=False)


def make_deepseek2(models_dir, path):
    return make_deepseek2_variant(models_dir, path, "inferd tiny deepseek2 V3-shaped (random)", seed=67,
                                  n_layer=4, n_dense=2, q_lora_rank=64, kv_lora_rank=96, mscale_all_dim=1.0,
                                  n_shared=1, sigmoid=True)


def make_deepseek2_kv_b(models_dir, path):
    return make_deepseek2_variant(models_dir, path, "inferd tiny deepseek2 V3-shaped, attn_kv_b (random)",
                                  seed=67, n_layer=4, n_dense=2, q_lora_rank=64, kv_lora_rank=96,
                                  mscale_all_dim=1.0, n_shared=1, sigmoid=True, kv_b="unsplit")


def make_deepseek2_kv_b_split(models_dir, path):
    return make_deepseek2_variant(models_dir, path, "inferd tiny deepseek2 V3-shaped, attn_kv_b split (random)",
                                  seed=67, n_layer=4, n_dense=2, q_lora_rank=64, kv_lora_rank=96,
                                  mscale_all_dim=1.0, n_shared=1, sigmoid=True, kv_b="split")


def make_deepseek2_latent128(models_dir, path):
    # llama.cpp takes a quantized latent cache only when the latent (its V view) and the whole
    # latent + RoPE row are multiples of the block (32): 96 + 32.
    return make_deepseek2_variant(models_dir, path,
                                  "inferd tiny deepseek2 V2-Lite-shaped, 128-wide latent row (random)", seed=71, n_layer=3, n_dense=1, q_lora_rank=0, kv_lora_rank=96, mscale_all_dim=0.707,
                                  n_shared=2, sigmoid=False, qk_rope=32)


QWEN35_VOCAB = Path(os.environ.get("INFERD_LLAMA_CPP_SRC", Path.home() / ".cache/inferd/llama.cpp/src")) / \
    "models/ggml-vocab-qwen35.gguf"

# Per layer, cycled: the attention layers' projections as qwen3's, the Gated DeltaNet layers'
# (qkv: attn_qkv, z: attn_gate, beta: ssm_beta, alpha: ssm_alpha, out: ssm_out) in several types,
# alpha in F32 in one of them.
QWEN35_TYPES = [
    dict(q=T.Q8_0, k=T.Q5_0, v=T.Q4_1, o=T.Q5_0, gate=T.Q8_0, up=T.Q4_1, down=T.Q5_0,
         qkv=T.Q8_0, z=T.Q5_0, beta=T.Q8_0, alpha=T.F32, out=T.Q4_1),
    dict(q=T.Q5_0, k=T.Q8_0, v=T.Q5_0, o=T.Q4_1, gate=T.Q5_0, up=T.Q8_0, down=T.Q8_0,
         qkv=T.Q5_0, z=T.Q4_1, beta=T.F32, alpha=T.Q8_0, out=T.Q8_0),
    dict(q=T.Q4_1, k=T.Q8_0, v=T.Q8_0, o=T.Q8_0, gate=T.Q4_1, up=T.Q5_0, down=T.Q4_1,
         qkv=T.Q4_1, z=T.Q8_0, beta=T.Q5_0, alpha=T.F32, out=T.Q5_0),
]


def qwen35_hparams(w, arch, name, h, dn, n_nextn):
    common_hparams(w, arch, name, h)
    w.add_rope_dimension_count(h["rope_dim"])
    w.add_rope_dimension_sections(h["rope_sections"])
    w.add_ssm_conv_kernel(dn["conv_kernel"])
    w.add_ssm_state_size(dn["head"])
    w.add_ssm_group_count(dn["k_heads"])
    w.add_ssm_time_step_rank(dn["v_heads"])
    w.add_ssm_inner_size(dn["v_heads"] * dn["head"])
    w.add_full_attention_interval(h["full_attention_interval"])
    if n_nextn:
        w.add_nextn_predict_layers(n_nextn)


def gated_attention_block(b, h, t, p):
    """A qwen35 attention layer's attention: attn_q holds each head's query then its output gate."""
    n_embd, head_dim = h["n_embd"], h["head_dim"]
    q_dim, kv_dim = h["n_head"] * head_dim, h["n_head_kv"] * head_dim
    b.norm(p + "attn_norm.weight", n_embd)
    b.matrix(p + "attn_q.weight", 2 * q_dim, n_embd, t["q"])
    b.matrix(p + "attn_k.weight", kv_dim, n_embd, t["k"])
    b.matrix(p + "attn_v.weight", kv_dim, n_embd, t["v"])
    b.norm(p + "attn_q_norm.weight", head_dim, spread=0.2)
    b.norm(p + "attn_k_norm.weight", head_dim, spread=0.2)
    b.matrix(p + "attn_output.weight", n_embd, q_dim, t["o"], std=3.0 / math.sqrt(q_dim))


def delta_net_block(b, h, dn, t, p):
    """A Gated DeltaNet layer's mixer as convert_hf_to_gguf.py writes Qwen3.5's linear attention."""
    n_embd, S = h["n_embd"], dn["head"]
    key_dim, value_dim = dn["k_heads"] * S, dn["v_heads"] * S
    conv_dim = 2 * key_dim + value_dim
    b.norm(p + "attn_norm.weight", n_embd)
    b.matrix(p + "attn_qkv.weight", conv_dim, n_embd, t["qkv"])
    b.matrix(p + "attn_gate.weight", value_dim, n_embd, t["z"])
    b.matrix(p + "ssm_beta.weight", dn["v_heads"], n_embd, t["beta"])
    b.matrix(p + "ssm_alpha.weight", dn["v_heads"], n_embd, t["alpha"])
    b.add(p + "ssm_conv1d.weight", b.normal((conv_dim, dn["conv_kernel"]), 0.5), T.F32)
    b.bias(p + "ssm_dt.bias", dn["v_heads"], 0.5)
    # a = -exp(A_log): decays from slow (a near -0.05) to fast (near -1.6) across the heads.
    b.add(p + "ssm_a", -np.exp(b.rng.uniform(-3.0, 0.5, dn["v_heads"])).astype(np.float32), T.F32)
    b.norm(p + "ssm_norm.weight", S, spread=0.2)
    b.matrix(p + "ssm_out.weight", n_embd, value_dim, t["out"], std=3.0 / math.sqrt(value_dim))


def mtp_block(b, h, t, p):
    """A Qwen3.5 multi-token-prediction block (after the trunk): llama.cpp's main graph never runs it."""
    n_embd = h["n_embd"]
    gated_attention_block(b, h, t, p)
    b.norm(p + "post_attention_norm.weight", n_embd)
    b.matrix(p + "ffn_gate.weight", h["n_ff"], n_embd, t["gate"])
    b.matrix(p + "ffn_up.weight", h["n_ff"], n_embd, t["up"])
    b.matrix(p + "ffn_down.weight", n_embd, h["n_ff"], t["down"])
    b.matrix(p + "nextn.eh_proj.weight", n_embd, 2 * n_embd, T.Q8_0)
    b.norm(p + "nextn.enorm.weight", n_embd)
    b.norm(p + "nextn.hnorm.weight", n_embd)
    b.norm(p + "nextn.shared_head_norm.weight", n_embd)


def make_qwen35(models_dir, path):
    n_trunk, n_nextn = 4, 1
    h = dict(n_ctx_train=4096, n_embd=32, n_layer=n_trunk + n_nextn, n_ff=96, n_head=4, n_head_kv=2, head_dim=32,
             rope_base=10000000.0, rms_eps=1e-6, rope_dim=8, rope_sections=[2, 1, 1, 0], full_attention_interval=4)
    dn = dict(conv_kernel=4, head=32, k_heads=2, v_heads=4)
    w = GGUFWriter(path, "qwen35")
    qwen35_hparams(w, "qwen35", "inferd tiny qwen35 (random)", h, dn, n_nextn)
    copy_tokenizer(w, QWEN35_VOCAB)
    n_vocab = 151936
    b = Builder(seed=71)
    b.matrix("token_embd.weight", n_vocab, h["n_embd"], T.Q5_0, std=0.6)
    b.norm("output_norm.weight", h["n_embd"], spread=1.0, center=0.0)  # zero-mean: see make_qwen3
    n_embd, n_ff = h["n_embd"], h["n_ff"]
    for i in range(h["n_layer"]):
        t = QWEN35_TYPES[i % len(QWEN35_TYPES)]
        p = f"blk.{i}."
        if i >= n_trunk:
            mtp_block(b, h, t, p)
            continue
        if (i + 1) % h["full_attention_interval"] != 0:
            delta_net_block(b, h, dn, t, p)
        else:
            gated_attention_block(b, h, t, p)
        b.norm(p + "post_attention_norm.weight", n_embd)
        b.matrix(p + "ffn_gate.weight", n_ff, n_embd, t["gate"])
        b.matrix(p + "ffn_up.weight", n_ff, n_embd, t["up"])
        b.matrix(p + "ffn_down.weight", n_embd, n_ff, t["down"], std=1.5 / math.sqrt(n_ff))
    b.write(w)
    return w


def qwen35moe_ffn(b, h, moe, t, p):
    """A qwen35moe layer's FFN: softmax-routed experts and one shared expert, gated per token by
    sigmoid(ffn_gate_inp_shexp . x) (a 1-D F32 tensor, as convert_hf_to_gguf.py writes it)."""
    n_embd, n_expert, n_ff_exp, n_ff_sh = h["n_embd"], moe["n_expert"], moe["n_ff_exp"], moe["n_ff_shexp"]
    b.norm(p + "post_attention_norm.weight", n_embd)
    # Router logits with a standard deviation near 2, as make_qwen3moe's.
    b.matrix(p + "ffn_gate_inp.weight", n_expert, n_embd, T.F32, std=2.0 / math.sqrt(n_embd))
    b.add(p + "ffn_gate_exps.weight", b.normal((n_expert, n_ff_exp, n_embd), 1.0 / math.sqrt(n_embd)), t["gate"])
    b.add(p + "ffn_up_exps.weight", b.normal((n_expert, n_ff_exp, n_embd), 1.0 / math.sqrt(n_embd)), t["up"])
    b.add(p + "ffn_down_exps.weight", b.normal((n_expert, n_embd, n_ff_exp), 3.0 / math.sqrt(n_ff_exp)), t["down"])
    # Gate logits with a standard deviation near 1.5: the shared expert's share differs per token.
    b.add(p + "ffn_gate_inp_shexp.weight", b.normal((n_embd,), 1.5 / math.sqrt(n_embd)), T.F32)
    b.matrix(p + "ffn_gate_shexp.weight", n_ff_sh, n_embd, t["gate"])
    b.matrix(p + "ffn_up_shexp.weight", n_ff_sh, n_embd, t["up"])
    b.matrix(p + "ffn_down_shexp.weight", n_embd, n_ff_sh, t["down"], std=1.5 / math.sqrt(n_ff_sh))


def make_qwen35moe(models_dir, path):
    n_trunk, n_nextn = 4, 1
    h = dict(n_ctx_train=4096, n_embd=32, n_layer=n_trunk + n_nextn, n_ff=96, n_head=4, n_head_kv=2, head_dim=32,
             rope_base=10000000.0, rms_eps=1e-6, rope_dim=8, rope_sections=[2, 1, 1, 0], full_attention_interval=4)
    dn = dict(conv_kernel=4, head=32, k_heads=2, v_heads=4)
    moe = dict(n_expert=8, n_expert_used=2, n_ff_exp=32, n_ff_shexp=64)
    w = GGUFWriter(path, "qwen35moe")
    qwen35_hparams(w, "qwen35moe", "inferd tiny qwen35moe (random)", h, dn, n_nextn)
    w.add_expert_count(moe["n_expert"])
    w.add_expert_used_count(moe["n_expert_used"])
    w.add_expert_feed_forward_length(moe["n_ff_exp"])
    w.add_expert_shared_feed_forward_length(moe["n_ff_shexp"])
    copy_tokenizer(w, QWEN35_VOCAB)
    n_vocab = 151936
    b = Builder(seed=73)
    b.matrix("token_embd.weight", n_vocab, h["n_embd"], T.Q5_0, std=0.6)
    b.norm("output_norm.weight", h["n_embd"], spread=1.0, center=0.0)  # zero-mean: see make_qwen3
    n_embd = h["n_embd"]
    for i in range(h["n_layer"]):
        t = QWEN35_TYPES[i % len(QWEN35_TYPES)]
        p = f"blk.{i}."
        if i >= n_trunk:  # the MTP block: a full-attention block with the MoE FFN, never run
            gated_attention_block(b, h, t, p)
            qwen35moe_ffn(b, h, moe, t, p)
            b.matrix(p + "nextn.eh_proj.weight", n_embd, 2 * n_embd, T.Q8_0)
            for norm in ("enorm", "hnorm", "shared_head_norm"):
                b.norm(p + f"nextn.{norm}.weight", n_embd)
            continue
        if (i + 1) % h["full_attention_interval"] != 0:
            delta_net_block(b, h, dn, t, p)
        else:
            gated_attention_block(b, h, t, p)
        qwen35moe_ffn(b, h, moe, t, p)
    b.write(w)
    return w


LLAMA_BPE_VOCAB = Path(os.environ.get("INFERD_LLAMA_CPP_SRC", Path.home() / ".cache/inferd/llama.cpp/src")) / \
    "models/ggml-vocab-llama-bpe.gguf"

# Per layer, cycled: the Mamba-2 layers' ssm_in and ssm_out, the attention layers' projections and
# the MLP layers' up and down in several types.
NEMOTRON_H_TYPES = [
    dict(q=T.Q8_0, k=T.Q5_0, v=T.Q4_1, o=T.Q5_0, up=T.Q8_0, down=T.Q5_0, ssm_in=T.Q8_0, ssm_out=T.Q4_1),
    dict(q=T.Q5_0, k=T.Q8_0, v=T.Q5_0, o=T.Q4_1, up=T.Q4_1, down=T.Q8_0, ssm_in=T.Q5_0, ssm_out=T.Q8_0),
    dict(q=T.Q4_1, k=T.Q8_0, v=T.Q8_0, o=T.Q8_0, up=T.Q5_0, down=T.Q4_1, ssm_in=T.Q4_1, ssm_out=T.Q5_0),
]


def mamba2_block(b, h, m, t, p):
    """A Mamba-2 layer's mixer as convert_hf_to_gguf.py writes Nemotron-H's (A = -exp(A_log), D and A
    of GGML shape [1, heads], the norm [inner / groups, groups], the conv kernel [taps, channels])."""
    n_embd, inner, heads, groups, d_state = h["n_embd"], m["inner"], m["heads"], m["groups"], m["d_state"]
    conv_dim = inner + 2 * groups * d_state
    b.norm(p + "attn_norm.weight", n_embd)
    b.matrix(p + "ssm_in.weight", 2 * inner + 2 * groups * d_state + heads, n_embd, t["ssm_in"])
    b.add(p + "ssm_conv1d.weight", b.normal((conv_dim, m["conv_kernel"]), 0.5), T.F32)
    b.bias(p + "ssm_conv1d.bias", conv_dim, 0.2)
    # Time steps near softplus's knee (some heads slow, some fast), one head's bias past its cut at 20.
    dt_bias = b.normal((heads,), 1.0)
    dt_bias[-1] = 21.0
    b.add(p + "ssm_dt.bias", dt_bias.astype(np.float32), T.F32)
    b.add(p + "ssm_a", -np.exp(b.rng.uniform(-2.0, 1.0, (heads, 1))).astype(np.float32), T.F32)
    b.add(p + "ssm_d", (1.0 + b.normal((heads, 1), 0.3)).astype(np.float32), T.F32)
    b.add(p + "ssm_norm.weight", (1.0 + b.normal((groups, inner // groups), 0.2)).astype(np.float32), T.F32)
    b.matrix(p + "ssm_out.weight", n_embd, inner, t["ssm_out"], std=3.0 / math.sqrt(inner))


def make_nemotron_h(models_dir, path):
    # M: Mamba-2, *: attention, -: MLP (Nemotron-H's hybrid_override_pattern), the last an MLP as in
    # Nemotron-H's files.
    pattern = "M-M*-M*-"
    h = dict(n_ctx_train=4096, n_embd=32, n_layer=len(pattern), n_ff=128, n_head=4, n_head_kv=2, head_dim=32,
             rms_eps=1e-5)
    # Two groups of B and C for four heads; a state of 80 (one vector step of either GGML build and
    # a tail); real Nemotron-H: 8 groups, 128 heads of 64 (Nano 9B), a state of 128.
    m = dict(conv_kernel=4, inner=64, heads=4, groups=2, d_state=80)
    w = GGUFWriter(path, "nemotron_h")
    w.add_name("inferd tiny nemotron_h (random)")
    w.add_description("random weights for inferd's tests (tools/reference/make_tiny_models.py); "
                      "not a trained model")
    w.add_context_length(h["n_ctx_train"])
    w.add_embedding_length(h["n_embd"])
    w.add_block_count(h["n_layer"])
    # Per layer, as the converter writes them: the MLP's width where the layer is an MLP, the
    # KV heads where it is attention, 0 elsewhere.
    w.add_feed_forward_length([h["n_ff"] if c == "-" else 0 for c in pattern])
    w.add_head_count(h["n_head"])
    w.add_head_count_kv([h["n_head_kv"] if c == "*" else 0 for c in pattern])
    w.add_key_length(h["head_dim"])
    w.add_value_length(h["head_dim"])
    w.add_layer_norm_eps(h["rms_eps"])
    w.add_layer_norm_rms_eps(h["rms_eps"])
    w.add_ssm_conv_kernel(m["conv_kernel"])
    w.add_ssm_state_size(m["d_state"])
    w.add_ssm_group_count(m["groups"])
    w.add_ssm_inner_size(m["inner"])
    w.add_ssm_time_step_rank(m["heads"])
    copy_tokenizer(w, LLAMA_BPE_VOCAB)
    n_vocab = 128256
    b = Builder(seed=79)
    b.matrix("token_embd.weight", n_vocab, h["n_embd"], T.Q5_0, std=0.6)
    b.norm("output_norm.weight", h["n_embd"], spread=1.0, center=0.0)  # zero-mean: see make_qwen3
    n_embd, n_ff = h["n_embd"], h["n_ff"]
    for i, kind in enumerate(pattern):
        t = NEMOTRON_H_TYPES[i % len(NEMOTRON_H_TYPES)]
        p = f"blk.{i}."
        if kind == "M":
            mamba2_block(b, h, m, t, p)
        elif kind == "*":
            attention_block(b, h, t, p)
        else:
            b.norm(p + "attn_norm.weight", n_embd)
            b.matrix(p + "ffn_up.weight", n_ff, n_embd, t["up"])
            b.matrix(p + "ffn_down.weight", n_embd, n_ff, t["down"], std=3.0 / math.sqrt(n_ff))
    b.write(w)
    return w


MODELS = {"tiny-qwen3": make_qwen3, "tiny-qwen3moe": make_qwen3moe, "tiny-llama3": make_llama3, "tiny-gemma3": make_gemma3,
          "tiny-mistral": make_mistral, "tiny-llama-mxfp4": make_llama_mxfp4, "tiny-gpt-oss": make_gpt_oss,
          "tiny-glm4moe": make_glm4moe, "tiny-deepseek2-lite": make_deepseek2_lite, "tiny-deepseek2": make_deepseek2,
          "tiny-deepseek2-kv-b": make_deepseek2_kv_b, "tiny-deepseek2-kv-b-split": make_deepseek2_kv_b_split,
          "tiny-deepseek2-latent128": make_deepseek2_latent128,
          "tiny-bert-reranker": make_bert_reranker, "tiny-qwen3-embed-last": make_qwen3_embed_last,
          "tiny-llama-embed-mean": make_llama_embed_mean,
          "tiny-qwen35": make_qwen35, "tiny-qwen35moe": make_qwen35moe, "tiny-nemotron-h": make_nemotron_h}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models-dir", type=Path, default=DEFAULT_MODEL_DIR,
                    help="where the tokenizers are copied from (the real GGUFs)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--only", choices=sorted(MODELS))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name, make in MODELS.items():
        if args.only and name != args.only:
            continue
        path = args.out / f"{name}.gguf"
        w = make(args.models_dir, path)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB)", file=sys.stderr)


if __name__ == "__main__":
    main()
