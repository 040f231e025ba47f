"""Tiny recurrent and hybrid GGUFs for tests: llama.cpp's ``mamba`` and ``lfm2``.

A recurrent model keeps one state per sequence instead of a KV entry per position, so its
memory cannot simply drop a suffix. llama.cpp can take back the last few positions of the
architectures whose graphs keep a snapshot of the state per position (``n_rs_seq``: LFM2,
Qwen3.5, Nemotron-H, ...); localspec speculates on those (docs/design.md, "The speculative
step": recurrent and hybrid targets). Mamba keeps no snapshots, so localspec decodes it
plainly. Same vocabulary and chat template as ``localspec.testing.synthetic``; random weights.

Written with the ``gguf`` package, a base dependency (convert-head uses it too).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from localspec.testing.synthetic import (
    TinyConfig,
    add_tokenizer,
    embedding_and_head,
    random_matrices,
    vocab_tokens,
    write_gguf,
)

SSM_STATE_SIZE = 16
SSM_CONV_KERNEL = 4
SHORTCONV_L_CACHE = 3  # LFM2's convolution width (its real models use 3)


def _mamba_weights(cfg: TinyConfig, n_vocab: int) -> dict[str, np.ndarray]:
    mat = random_matrices(cfg.seed)
    d_inner = 2 * cfg.n_embd  # llama.cpp supports an expansion factor of 2 only
    dt_rank = math.ceil(cfg.n_embd / 16)
    w = embedding_and_head(mat, cfg, n_vocab)
    # A = -exp(A_log) as Mamba stores it: negative, so the state decays.
    a = -np.tile(np.arange(1, SSM_STATE_SIZE + 1, dtype=np.float32), (d_inner, 1))
    for i in range(cfg.n_layer):
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = np.ones(cfg.n_embd, dtype=np.float32)
        w[p + "ssm_in.weight"] = mat(2 * d_inner, cfg.n_embd)
        w[p + "ssm_conv1d.weight"] = mat(d_inner, SSM_CONV_KERNEL)
        w[p + "ssm_conv1d.bias"] = np.zeros(d_inner, dtype=np.float32)
        w[p + "ssm_x.weight"] = mat(dt_rank + 2 * SSM_STATE_SIZE, d_inner)
        w[p + "ssm_dt.weight"] = mat(d_inner, dt_rank)
        w[p + "ssm_dt.bias"] = np.full(d_inner, -2.0, dtype=np.float32)
        w[p + "ssm_a"] = a
        w[p + "ssm_d"] = np.ones(d_inner, dtype=np.float32)
        w[p + "ssm_out.weight"] = mat(cfg.n_embd, d_inner)
    return w


def write_mamba_model(
    path: str | Path, cfg: TinyConfig | None = None, *, name: str = "tiny-mamba"
) -> Path:
    """Write a tiny ``mamba`` GGUF (cfg's n_embd, n_layer, vocabulary, seed); returns its path."""
    import gguf  # test/bench dependency only

    path, cfg = Path(path), cfg or TinyConfig()
    n_vocab = len(vocab_tokens(cfg))
    writer = gguf.GGUFWriter(str(path), "mamba")
    writer.add_name(name)
    writer.add_context_length(cfg.context_length)
    writer.add_embedding_length(cfg.n_embd)
    writer.add_feed_forward_length(0)
    writer.add_head_count(0)
    writer.add_block_count(cfg.n_layer)
    writer.add_ssm_conv_kernel(SSM_CONV_KERNEL)
    writer.add_ssm_inner_size(2 * cfg.n_embd)
    writer.add_ssm_state_size(SSM_STATE_SIZE)
    writer.add_ssm_time_step_rank(math.ceil(cfg.n_embd / 16))
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    add_tokenizer(writer, cfg)
    write_gguf(writer, _mamba_weights(cfg, n_vocab))
    return path


def _lfm2_weights(cfg: TinyConfig, n_vocab: int, attention: list[bool]) -> dict[str, np.ndarray]:
    mat = random_matrices(cfg.seed)
    head_dim = cfg.n_embd // cfg.n_head
    w = embedding_and_head(mat, cfg, n_vocab)
    w["token_embd_norm.weight"] = w.pop("output_norm.weight")  # LFM2's name for the final norm
    for i, is_attention in enumerate(attention):
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = np.ones(cfg.n_embd, dtype=np.float32)
        if is_attention:
            w[p + "attn_q.weight"] = mat(cfg.n_head * head_dim, cfg.n_embd)
            w[p + "attn_k.weight"] = mat(cfg.n_head_kv * head_dim, cfg.n_embd)
            w[p + "attn_v.weight"] = mat(cfg.n_head_kv * head_dim, cfg.n_embd)
            w[p + "attn_q_norm.weight"] = np.ones(head_dim, dtype=np.float32)
            w[p + "attn_k_norm.weight"] = np.ones(head_dim, dtype=np.float32)
            w[p + "attn_output.weight"] = mat(cfg.n_embd, cfg.n_head * head_dim)
        else:  # a gated short convolution: its state is the last L_CACHE - 1 inputs
            w[p + "shortconv.conv.weight"] = mat(cfg.n_embd, SHORTCONV_L_CACHE)
            w[p + "shortconv.in_proj.weight"] = mat(3 * cfg.n_embd, cfg.n_embd)
            w[p + "shortconv.out_proj.weight"] = mat(cfg.n_embd, cfg.n_embd)
        w[p + "ffn_norm.weight"] = np.ones(cfg.n_embd, dtype=np.float32)
        w[p + "ffn_gate.weight"] = mat(cfg.n_ff, cfg.n_embd)
        w[p + "ffn_up.weight"] = mat(cfg.n_ff, cfg.n_embd)
        w[p + "ffn_down.weight"] = mat(cfg.n_embd, cfg.n_ff)
    return w


def write_lfm2_model(
    path: str | Path, cfg: TinyConfig | None = None, *, name: str = "tiny-lfm2"
) -> Path:
    """Write a tiny hybrid ``lfm2`` GGUF: convolution blocks with attention blocks between them
    (every second block, as LFM2 interleaves them); returns its path."""
    import gguf  # test/bench dependency only

    path, cfg = Path(path), cfg or TinyConfig(n_layer=4)
    n_vocab = len(vocab_tokens(cfg))
    attention = [i % 2 == 1 for i in range(cfg.n_layer)]
    writer = gguf.GGUFWriter(str(path), "lfm2")
    writer.add_name(name)
    writer.add_context_length(cfg.context_length)
    writer.add_embedding_length(cfg.n_embd)
    writer.add_feed_forward_length(cfg.n_ff)
    writer.add_block_count(cfg.n_layer)
    writer.add_head_count(cfg.n_head)
    writer.add_head_count_kv([cfg.n_head_kv if a else 0 for a in attention])
    writer.add_rope_dimension_count(cfg.n_embd // cfg.n_head)
    writer.add_shortconv_l_cache(SHORTCONV_L_CACHE)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    add_tokenizer(writer, cfg)
    write_gguf(writer, _lfm2_weights(cfg, n_vocab, attention))
    return path
