#!/usr/bin/env python3
"""Random-weight mixture-of-experts GGUFs with the real models' shapes, for speed benchmarks.

Speed does not depend on weight values, only on shapes, types and (for a mixture of experts)
on how the router spreads tokens over the experts; so these files have the real models'
hyperparameters, tensor names, shapes and GGML types, truncated to fewer layers, and random
weights at scales that keep the residual stream near unit RMS (no overflow, so routing stays
spread out as a real model's does: every router is a true random F32 matrix).

  qwen3moe  Qwen3-30B-A3B: n_embd 2048, 32 query / 4 KV heads of 128, per-head q/k RMS norms,
            NeoX RoPE base 1e6, 128 experts of width 768, 8 chosen (softmax, renormalized),
            vocabulary 151,936 (Qwen2.5's tokenizer, copied from the Qwen2.5-Coder-0.5B GGUF),
            untied output; 48 layers in the real model. Written as a Q8_0 source (F32 norms and
            router), then quantized to Q4_K_M by llama.cpp's `llama-quantize`, as the common
            download is (its per-tensor mix: Q6_K head, Q6_K for attn_v and ffn_down_exps in
            some layers, Q4_K elsewhere).
  gpt-oss   gpt-oss-20b: n_embd 2880, 64 query / 8 KV heads of 64, 32 experts of width 2880,
            4 chosen (softmax over the chosen), a 128-token window on even layers, YaRN
            (factor 32, original context 4,096), RoPE base 150,000, biases on Q/K/V/O, the
            router and the experts, attn_sinks, post_attention_norm as the FFN norm, untied
            output; 24 layers in the real model; gpt-oss's tokenizer (o200k_harmony, from
            tests/data/vocab/gpt-oss-vocab.gguf). Types as llama-quantize's MXFP4_MOE gives
            them (src/llama-quant.cpp), which is what the ggml-org release holds: 3-D expert
            tensors MXFP4, every other matrix (token_embd and output included) Q8_0, the router
            and 1-D tensors F32. Written directly in those types.
  deepseek2 DeepSeek-V2-Lite (HF deepseek-ai/DeepSeek-V2-Lite config.json; llama.cpp
            src/models/deepseek2.cpp reads the same keys, and treats 27 layers as V2-Lite): n_embd
            2048, 16 heads, multi-head latent attention with no query compression (q_lora_rank 0:
            attn_q from the norm), kv_lora_rank 512 plus a 64-wide RoPE key (attn_kv_a_mqa to 576,
            attn_kv_a_norm), per head 128 nope + 64 rope query dims and a 128-wide value, kv_b_proj
            split into attn_k_b / attn_v_b as convert_hf_to_gguf.py writes it; layer 0 dense (width
            10,944, first_k_dense_replace 1), the rest 64 routed experts of width 1,408, 6 chosen by
            softmax (not renormalized, routed_scaling_factor 1) plus 2 shared experts (one MLP of
            width 2,816); YaRN (factor 40, original context 4,096, mscale_all_dim 0.707), RoPE base
            10,000, RMS eps 1e-6, untied output; 27 layers in the real model. DeepSeek LLM's
            vocabulary (102,400 tokens, llama.cpp's models/ggml-vocab-deepseek-llm.gguf), its
            pre-tokenizer marked "default" because inferd lacks deepseek-llm's regexes (tokenization
            does not change speed). Q8_0 source, then `llama-quantize` Q4_K_M as qwen3moe: the
            1,408- and 10,944-wide inputs (ffn_down) and the 128-wide attn_k_b rows are not
            multiples of Q4_K's 256, so llama-quantize falls back for them as it does for the real
            model's Q4_K_M.
  qwen35    Qwen3.5-4B (dense hybrid; not a mixture of experts, but its speed benchmarks share these
            pools): n_embd 2560, 32 layers, every 4th full attention (full_attention_interval 4, so
            24 Gated DeltaNet layers and 8 attention layers), FFN width 9216; attention: 16 query /
            4 KV heads of 256, attn_q holding each head's query then its output gate, per-head q/k
            norms, interleaved multi-section RoPE over 64 of 256 dims (partial_rotary_factor 0.25),
            sections [11, 11, 10, 0], base 1e7; Gated DeltaNet: 16 key heads and 32 value heads of
            128 (ssm.group_count 16, ssm.time_step_rank 32, ssm.state_size 128, ssm.inner_size
            4096), a 4-tap causal convolution over q, k and v (8192 channels); RMS eps 1e-6;
            vocabulary 248,320, tied output (no output.weight). Sources: the Hugging Face config of
            Qwen/Qwen3.5-4B (hidden_size 2560, num_hidden_layers 32, intermediate_size 9216,
            num_attention_heads 16, num_key_value_heads 4, head_dim 256, linear_num_key_heads 16,
            linear_num_value_heads 32, linear_key/value_head_dim 128, linear_conv_kernel_dim 4,
            mrope_section [11, 11, 10], rope_theta 1e7, vocab_size 248320), mapped to GGUF keys as
            llama.cpp's conversion/qwen.py (Qwen3NextModel, Qwen3_5TextModel) writes them and
            src/models/qwen35.cpp reads them; tied output and no multi-token-prediction block as in
            the common Q4_K_M/Q6_K downloads (426 tensors). Tokenizer: llama.cpp's vendored
            models/ggml-vocab-qwen35.gguf (151,936 tokens, pre-tokenizer "qwen35") padded with
            unused "[PADn]" tokens to 248,320, as convert_hf_to_gguf.py pads a vocabulary, so the
            embedding table and the output head have the real model's size; chat template
            models/templates/Qwen3.5-4B.jinja. Q8_0 source (F32 norms, convolution, dt bias and A),
            then `llama-quantize` to Q4_K_M. All 32 layers: 2.52 GiB.

Tensors are streamed to disk one at a time. Quantizing billions of random values in numpy
would take hours, so each (type, row width, scale) gets a pool of a few thousand random rows,
quantized once, and every matrix is a window of that pool's rows at a random start (expert
tensors: a window per expert). Deterministic for a given seed.

Usage: bench/make_synthetic_moe.py qwen3moe --layers 16 [--out DIR] [--no-quantize]
       bench/make_synthetic_moe.py gpt-oss --layers 12 [--out DIR]
       bench/make_synthetic_moe.py deepseek2 --layers 14 [--out DIR] [--no-quantize]
       bench/make_synthetic_moe.py qwen35 --layers 32 [--out DIR] [--no-quantize]
Default DIR: ~/.cache/inferd/synthetic. Files: qwen3moe-30b-a3b-L16-q4_k_m.gguf (the Q8_0 source
is deleted after quantizing unless --keep-source), gpt-oss-20b-L12-mxfp4.gguf,
deepseek-v2-lite-L14-q4_k_m.gguf, qwen35-4b-L32-q4_k_m.gguf.
"""

import argparse
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T, GGUFReader, GGUFValueType, GGUFWriter, LlamaFileType, quants

REPO_ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("INFERD_CACHE", Path.home() / ".cache/inferd"))
MODEL_DIR = Path(os.environ.get("INFERD_MODEL_DIR", CACHE / "models"))
QWEN_VOCAB_FROM = MODEL_DIR / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
GPT_OSS_VOCAB = REPO_ROOT / "tests/data/vocab/gpt-oss-vocab.gguf"
GPT_OSS_TEMPLATE = REPO_ROOT / "tests/data/chat/gpt_oss.jinja"
DEEPSEEK_VOCAB = CACHE / "llama.cpp/src/models/ggml-vocab-deepseek-llm.gguf"
LLAMA_QUANTIZE = CACHE / "llama.cpp/build/bin/llama-quantize"
LLAMA_SRC = Path(os.environ.get("INFERD_LLAMA_CPP_SRC", CACHE / "llama.cpp/src"))
QWEN35_VOCAB = LLAMA_SRC / "models/ggml-vocab-qwen35.gguf"
QWEN35_TEMPLATE = LLAMA_SRC / "models/templates/Qwen3.5-4B.jinja"

sys.path.insert(0, str(REPO_ROOT / "tools/reference"))
from make_tiny_models import copy_tokenizer  # noqa: E402


class Pools:
    """Quantized random rows, one pool per (type, columns, std)."""

    def __init__(self, seed, pool_rows=4096):
        self.rng = np.random.default_rng(seed)
        self.pool_rows = pool_rows
        self.pools = {}

    def pool(self, qtype, cols, std):
        key = (qtype, cols, round(std, 9))
        if key not in self.pools:
            x = (self.rng.standard_normal((self.pool_rows, cols)) * std).astype(np.float32)
            self.pools[key] = quants.quantize(x, qtype) if qtype not in (T.F32, T.F16) else x.astype(
                np.float16 if qtype == T.F16 else np.float32)
        return self.pools[key]

    def rows(self, qtype, n_rows, cols, std):
        """n_rows quantized rows: a window of the pool at a random start, wrapping around."""
        p = self.pool(qtype, cols, std)
        start = int(self.rng.integers(0, p.shape[0]))
        idx = (start + np.arange(n_rows)) % p.shape[0]
        return p[idx]


class Model:
    """Tensor specs in file order; data is made when the tensor is written."""

    def __init__(self, path, arch, seed):
        self.writer = GGUFWriter(path, arch)
        self.pools = Pools(seed)
        self.rng = np.random.default_rng(seed + 1)
        self.specs = []  # (name, make() -> ndarray)

    def matrix(self, name, n_out, n_in, qtype, std=None, n_expert=0):
        """GGUF shape [n_in, n_out] (numpy [n_out, n_in]); [n_in, n_out, n_expert] for experts."""
        std = std if std is not None else 1.0 / math.sqrt(n_in)
        if qtype == T.F32:  # the router: true random values
            make = lambda: (self.rng.standard_normal((n_out, n_in)) * std).astype(np.float32)
            shape, nbytes, dtype = (n_out, n_in), n_out * n_in * 4, np.float32
        else:
            block, type_size = gguf.GGML_QUANT_SIZES[qtype]
            row_bytes = n_in // block * type_size
            e = max(n_expert, 1)
            if n_expert:
                make = lambda: np.stack([self.pools.rows(qtype, n_out, n_in, std) for _ in range(e)])
                shape = (e, n_out, row_bytes)
            else:
                make = lambda: self.pools.rows(qtype, n_out, n_in, std)
                shape = (n_out, row_bytes)
            nbytes, dtype = e * n_out * row_bytes, np.uint8
        self.writer.add_tensor_info(name, shape, np.dtype(dtype), nbytes, raw_dtype=None if qtype == T.F32 else qtype)
        self.specs.append((name, make))

    def vector(self, name, shape, std, center=0.0):
        shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
        make = lambda: (center + self.rng.standard_normal(shape) * std).astype(np.float32)
        self.writer.add_tensor_info(name, shape, np.dtype(np.float32), int(np.prod(shape)) * 4)
        self.specs.append((name, make))

    def write(self):
        w = self.writer
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        t0, done = time.time(), 0
        for i, (name, make) in enumerate(self.specs):
            data = make()
            w.write_tensor_data(data)
            done += data.nbytes
            if i % 20 == 0:
                print(f"  {name}: {done / 2**30:.2f} GiB written, {time.time() - t0:.0f} s", file=sys.stderr)
        w.close()


def common(w, name, n_ctx, n_embd, n_layer, n_ff, n_head, n_head_kv, head_dim, rope_base, eps,
           n_expert, n_expert_used, n_ff_exp, ftype):
    w.add_name(name)
    w.add_description("random weights with the real model's shapes, for speed benchmarks "
                      "(bench/make_synthetic_moe.py); not a trained model")
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(rope_base)
    w.add_layer_norm_rms_eps(eps)
    w.add_expert_count(n_expert)
    w.add_expert_used_count(n_expert_used)
    w.add_expert_feed_forward_length(n_ff_exp)
    w.add_file_type(ftype)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)


def qk_norm_attention(m, p, n_embd, n_head, n_head_kv, hd, q, query_rows_per_head=1):
    """Layer p's attention with per-head q/k RMS norms (Qwen3, Qwen3.5): Q, K, V, the norms and the
    output projection. query_rows_per_head 2: attn_q holds each head's query then its output gate
    (Qwen3.5's gated attention)."""
    m.matrix(p + "attn_q.weight", query_rows_per_head * n_head * hd, n_embd, q)
    m.matrix(p + "attn_k.weight", n_head_kv * hd, n_embd, q)
    m.matrix(p + "attn_v.weight", n_head_kv * hd, n_embd, q)
    m.vector(p + "attn_q_norm.weight", hd, 0.2, 1.0)
    m.vector(p + "attn_k_norm.weight", hd, 0.2, 1.0)
    m.matrix(p + "attn_output.weight", n_embd, n_head * hd, q, std=1.0 / math.sqrt(n_head * hd))


def make_qwen3moe(path, n_layer, seed=300):
    n_embd, n_head, n_head_kv, hd, n_vocab = 2048, 32, 4, 128, 151936
    n_expert, n_used, n_ff_exp = 128, 8, 768
    m = Model(path, "qwen3moe", seed)
    common(m.writer, f"synthetic Qwen3-30B-A3B ({n_layer} of 48 layers, random)", 40960, n_embd, n_layer, 6144,
           n_head, n_head_kv, hd, 1e6, 1e-6, n_expert, n_used, n_ff_exp, LlamaFileType.MOSTLY_Q8_0)
    copy_tokenizer(m.writer, QWEN_VOCAB_FROM)
    q = T.Q8_0
    m.matrix("token_embd.weight", n_vocab, n_embd, q, std=1.0)
    for i in range(n_layer):
        p = f"blk.{i}."
        m.vector(p + "attn_norm.weight", n_embd, 0.1, 1.0)
        qk_norm_attention(m, p, n_embd, n_head, n_head_kv, hd, q)
        m.vector(p + "ffn_norm.weight", n_embd, 0.1, 1.0)
        # Router logits with a standard deviation near 2: each token has favourites, the top-8
        # weights are not one-hot, and tokens spread over all 128 experts.
        m.matrix(p + "ffn_gate_inp.weight", n_expert, n_embd, T.F32, std=2.0 / math.sqrt(n_embd))
        m.matrix(p + "ffn_gate_exps.weight", n_ff_exp, n_embd, q, n_expert=n_expert)
        m.matrix(p + "ffn_up_exps.weight", n_ff_exp, n_embd, q, n_expert=n_expert)
        m.matrix(p + "ffn_down_exps.weight", n_embd, n_ff_exp, q, std=1.0 / math.sqrt(n_ff_exp), n_expert=n_expert)
    m.vector("output_norm.weight", n_embd, 0.1, 1.0)
    m.matrix("output.weight", n_vocab, n_embd, q, std=0.5 / math.sqrt(n_embd))
    m.write()


def make_gpt_oss(path, n_layer, seed=400):
    n_embd, n_head, n_head_kv, hd, n_vocab = 2880, 64, 8, 64, 201088
    n_expert, n_used, n_ff_exp = 32, 4, 2880
    m = Model(path, "gpt-oss", seed)
    w = m.writer
    common(w, f"synthetic gpt-oss-20b ({n_layer} of 24 layers, random)", 131072, n_embd, n_layer, n_ff_exp,
           n_head, n_head_kv, hd, 150000.0, 1e-5, n_expert, n_used, n_ff_exp, LlamaFileType.MOSTLY_MXFP4_MOE)
    w.add_sliding_window(128)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(32.0)
    w.add_rope_scaling_orig_ctx_len(4096)
    copy_tokenizer(w, GPT_OSS_VOCAB, {"tokenizer.chat_template": (GPT_OSS_TEMPLATE.read_text(), GGUFValueType.STRING)})
    if not any(k == "tokenizer.chat_template" for k in GGUFReader(GPT_OSS_VOCAB).fields):
        w.add_chat_template(GPT_OSS_TEMPLATE.read_text())
    q, qd = T.Q8_0, n_head * hd
    m.matrix("token_embd.weight", n_vocab, n_embd, q, std=1.0)
    for i in range(n_layer):
        p = f"blk.{i}."
        m.vector(p + "attn_norm.weight", n_embd, 0.1, 1.0)
        m.matrix(p + "attn_q.weight", qd, n_embd, q)
        m.vector(p + "attn_q.bias", qd, 0.5)
        m.matrix(p + "attn_k.weight", n_head_kv * hd, n_embd, q)
        m.vector(p + "attn_k.bias", n_head_kv * hd, 0.5)
        m.matrix(p + "attn_v.weight", n_head_kv * hd, n_embd, q)
        m.vector(p + "attn_v.bias", n_head_kv * hd, 0.1)
        m.matrix(p + "attn_output.weight", n_embd, qd, q, std=1.0 / math.sqrt(qd))
        m.vector(p + "attn_output.bias", n_embd, 0.1)
        m.vector(p + "attn_sinks.weight", n_head, 1.0)
        m.vector(p + "post_attention_norm.weight", n_embd, 0.1, 1.0)
        m.matrix(p + "ffn_gate_inp.weight", n_expert, n_embd, T.F32, std=2.0 / math.sqrt(n_embd))
        m.vector(p + "ffn_gate_inp.bias", n_expert, 0.5)
        m.matrix(p + "ffn_gate_exps.weight", n_ff_exp, n_embd, T.MXFP4, n_expert=n_expert)
        m.vector(p + "ffn_gate_exps.bias", (n_expert, n_ff_exp), 0.5)
        m.matrix(p + "ffn_up_exps.weight", n_ff_exp, n_embd, T.MXFP4, n_expert=n_expert)
        m.vector(p + "ffn_up_exps.bias", (n_expert, n_ff_exp), 0.5)
        m.matrix(p + "ffn_down_exps.weight", n_embd, n_ff_exp, T.MXFP4, std=1.0 / math.sqrt(n_ff_exp),
                 n_expert=n_expert)
        m.vector(p + "ffn_down_exps.bias", (n_expert, n_embd), 0.1)
    m.vector("output_norm.weight", n_embd, 0.1, 1.0)
    m.matrix("output.weight", n_vocab, n_embd, q, std=0.5 / math.sqrt(n_embd))
    m.write()


def make_deepseek2(path, n_layer, seed=500):
    n_embd, n_head, n_vocab, n_ff = 2048, 16, 102400, 10944
    kv_lora, qk_nope, qk_rope, v_head = 512, 128, 64, 128
    n_expert, n_used, n_ff_exp, n_shared = 64, 6, 1408, 2
    yarn_factor, orig_ctx = 40.0, 4096
    m = Model(path, "deepseek2", seed)
    w = m.writer
    # Latent attention is written MQA-shaped, as the converter writes it: one KV head whose key is
    # the latent plus the RoPE key and whose value is the latent; the per-head sizes in *_mla.
    w.add_name(f"synthetic DeepSeek-V2-Lite ({n_layer} of 27 layers, random)")
    w.add_description("random weights with the real model's shapes, for speed benchmarks "
                      "(bench/make_synthetic_moe.py); not a trained model")
    w.add_context_length(int(orig_ctx * yarn_factor))
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(1)
    w.add_key_length(kv_lora + qk_rope)
    w.add_value_length(kv_lora)
    w.add_key_length_mla(qk_nope + qk_rope)
    w.add_value_length_mla(v_head)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(n_vocab)
    w.add_leading_dense_block_count(1)
    w.add_q_lora_rank(0)  # llama.cpp reads it unless the layer count is V2-Lite's 27
    w.add_kv_lora_rank(kv_lora)
    w.add_expert_count(n_expert)
    w.add_expert_used_count(n_used)
    w.add_expert_feed_forward_length(n_ff_exp)
    w.add_expert_shared_count(n_shared)
    w.add_expert_weights_scale(1.0)
    w.add_rope_dimension_count(qk_rope)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(yarn_factor)
    w.add_rope_scaling_orig_ctx_len(orig_ctx)
    w.add_rope_scaling_yarn_log_mul(0.1 * 0.707)  # as the converter writes mscale_all_dim
    w.add_file_type(LlamaFileType.MOSTLY_Q8_0)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    copy_tokenizer(w, DEEPSEEK_VOCAB, {"tokenizer.ggml.pre": ("default", GGUFValueType.STRING)})
    q = T.Q8_0
    m.matrix("token_embd.weight", n_vocab, n_embd, q, std=1.0)
    for i in range(n_layer):
        p = f"blk.{i}."
        m.vector(p + "attn_norm.weight", n_embd, 0.1, 1.0)
        m.matrix(p + "attn_q.weight", n_head * (qk_nope + qk_rope), n_embd, q)
        m.matrix(p + "attn_kv_a_mqa.weight", kv_lora + qk_rope, n_embd, q)
        m.vector(p + "attn_kv_a_norm.weight", kv_lora, 0.1, 1.0)
        # GGUF [qk_nope, kv_lora, n_head] (k_b transposed) and [kv_lora, v_head, n_head].
        m.matrix(p + "attn_k_b.weight", kv_lora, qk_nope, q, n_expert=n_head)
        m.matrix(p + "attn_v_b.weight", v_head, kv_lora, q, n_expert=n_head)
        m.matrix(p + "attn_output.weight", n_embd, n_head * v_head, q)
        m.vector(p + "ffn_norm.weight", n_embd, 0.1, 1.0)
        if i < 1:
            m.matrix(p + "ffn_gate.weight", n_ff, n_embd, q)
            m.matrix(p + "ffn_up.weight", n_ff, n_embd, q)
            m.matrix(p + "ffn_down.weight", n_embd, n_ff, q)
            continue
        m.matrix(p + "ffn_gate_inp.weight", n_expert, n_embd, T.F32, std=2.0 / math.sqrt(n_embd))
        m.matrix(p + "ffn_gate_exps.weight", n_ff_exp, n_embd, q, n_expert=n_expert)
        m.matrix(p + "ffn_up_exps.weight", n_ff_exp, n_embd, q, n_expert=n_expert)
        m.matrix(p + "ffn_down_exps.weight", n_embd, n_ff_exp, q, n_expert=n_expert)
        n_ff_sh = n_ff_exp * n_shared
        m.matrix(p + "ffn_gate_shexp.weight", n_ff_sh, n_embd, q)
        m.matrix(p + "ffn_up_shexp.weight", n_ff_sh, n_embd, q)
        m.matrix(p + "ffn_down_shexp.weight", n_embd, n_ff_sh, q)
    m.vector("output_norm.weight", n_embd, 0.1, 1.0)
    m.matrix("output.weight", n_vocab, n_embd, q, std=0.5 / math.sqrt(n_embd))
    m.write()


def make_qwen35(path, n_layer, seed=500):
    n_embd, n_ff, n_head, n_head_kv, hd, n_vocab = 2560, 9216, 16, 4, 256, 248320
    k_heads, v_heads, head, conv_kernel = 16, 32, 128, 4
    key_dim, value_dim = k_heads * head, v_heads * head
    conv_dim = 2 * key_dim + value_dim
    m = Model(path, "qwen35", seed)
    w = m.writer
    w.add_name(f"synthetic Qwen3.5-4B ({n_layer} of 32 layers, random)")
    w.add_description("random weights with the real model's shapes, for speed benchmarks "
                      "(bench/make_synthetic_moe.py); not a trained model")
    w.add_context_length(262144)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_freq_base(1e7)
    w.add_rope_dimension_count(hd // 4)
    w.add_rope_dimension_sections([11, 11, 10, 0])
    w.add_layer_norm_rms_eps(1e-6)
    w.add_ssm_conv_kernel(conv_kernel)
    w.add_ssm_state_size(head)
    w.add_ssm_group_count(k_heads)
    w.add_ssm_time_step_rank(v_heads)
    w.add_ssm_inner_size(value_dim)
    w.add_full_attention_interval(4)
    w.add_file_type(LlamaFileType.MOSTLY_Q8_0)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    # The vendored test vocabulary is Qwen2's 151,936 tokens; pad it with unused tokens to the real
    # 248,320 so that the embedding table and the (tied) output head read as many bytes as Qwen3.5-4B's.
    src = GGUFReader(QWEN35_VOCAB)
    tokens = [bytes(src.fields["tokenizer.ggml.tokens"].parts[i]).decode("utf-8")
              for i in src.fields["tokenizer.ggml.tokens"].data]
    types = [int(src.fields["tokenizer.ggml.token_type"].parts[i][0]) for i in src.fields["tokenizer.ggml.token_type"].data]
    n_pad = n_vocab - len(tokens)
    tokens += [f"[PAD{i}]" for i in range(n_pad)]
    types += [int(gguf.TokenType.UNUSED)] * n_pad
    copy_tokenizer(w, QWEN35_VOCAB, {
        "tokenizer.ggml.tokens": (tokens, GGUFValueType.ARRAY),
        "tokenizer.ggml.token_type": (types, GGUFValueType.ARRAY),
        "tokenizer.chat_template": (QWEN35_TEMPLATE.read_text(), GGUFValueType.STRING)})
    q = T.Q8_0
    m.matrix("token_embd.weight", n_vocab, n_embd, q, std=1.0)
    for i in range(n_layer):
        p = f"blk.{i}."
        m.vector(p + "attn_norm.weight", n_embd, 0.1, 1.0)
        if (i + 1) % 4 != 0:  # Gated DeltaNet (llama.cpp: is_recr when (il + 1) % interval != 0)
            m.matrix(p + "attn_qkv.weight", conv_dim, n_embd, q)
            m.matrix(p + "attn_gate.weight", value_dim, n_embd, q)
            m.matrix(p + "ssm_beta.weight", v_heads, n_embd, q)
            m.matrix(p + "ssm_alpha.weight", v_heads, n_embd, q)
            m.vector(p + "ssm_conv1d.weight", (conv_dim, conv_kernel), 0.5)
            m.vector(p + "ssm_dt.bias", v_heads, 0.5)
            # A = -exp(A_log): per-head decay from slow to fast, never growth.
            name_a = p + "ssm_a"
            m.writer.add_tensor_info(name_a, (v_heads,), np.dtype(np.float32), v_heads * 4)
            m.specs.append((name_a, lambda: -np.exp(m.rng.uniform(-3.0, 0.5, v_heads)).astype(np.float32)))
            m.vector(p + "ssm_norm.weight", head, 0.2, 1.0)
            m.matrix(p + "ssm_out.weight", n_embd, value_dim, q, std=1.0 / math.sqrt(value_dim))
        else:  # gated full attention: attn_q holds each head's query then its output gate
            qk_norm_attention(m, p, n_embd, n_head, n_head_kv, hd, q, query_rows_per_head=2)
        m.vector(p + "post_attention_norm.weight", n_embd, 0.1, 1.0)
        m.matrix(p + "ffn_gate.weight", n_ff, n_embd, q)
        m.matrix(p + "ffn_up.weight", n_ff, n_embd, q)
        m.matrix(p + "ffn_down.weight", n_embd, n_ff, q, std=1.0 / math.sqrt(n_ff))
    m.vector("output_norm.weight", n_embd, 0.1, 1.0)
    m.write()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("arch", choices=["qwen3moe", "gpt-oss", "deepseek2", "qwen35"])
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--out", type=Path, default=CACHE / "synthetic")
    ap.add_argument("--no-quantize", action="store_true", help="qwen3moe, deepseek2, qwen35: stop at the Q8_0 source")
    ap.add_argument("--keep-source", action="store_true")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    if args.arch == "gpt-oss":
        path = args.out / f"gpt-oss-20b-L{args.layers}-mxfp4.gguf"
        make_gpt_oss(path, args.layers)
    else:
        stem, make = {"qwen3moe": ("qwen3moe-30b-a3b", make_qwen3moe),
                      "deepseek2": ("deepseek-v2-lite", make_deepseek2),
                      "qwen35": ("qwen35-4b", make_qwen35)}[args.arch]
        src = args.out / f"{stem}-L{args.layers}-q8_0-source.gguf"
        make(src, args.layers)
        path = src
        if not args.no_quantize:
            path = args.out / f"{stem}-L{args.layers}-q4_k_m.gguf"
            subprocess.run([str(LLAMA_QUANTIZE), "--allow-requantize", str(src), str(path), "Q4_K_M",
                            str(args.threads)], check=True)
            if not args.keep_source:
                src.unlink()
    print(f"wrote {path} ({path.stat().st_size / 2**30:.2f} GiB) in {time.time() - t0:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
