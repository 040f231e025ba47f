"""A tiny hybrid target in llama.cpp's ``qwen35`` layout (Qwen3.5), with or without its MTP
(NextN) layer, for tests of hybrid targets and of MTP drafting on them.

    target = write_qwen35_model(tmp / "tiny-qwen35.gguf", Qwen35Spec(with_mtp=True))

The trunk interleaves gated delta-net blocks (a recurrent state per sequence) with gated
attention blocks (every ``full_attention_interval``-th block), as Qwen3.5 does. Each block's
outputs are scaled by ``divergence``, so the final hidden state of position q stays close to
the embedding of token q; the NextN block (block ``n_layer``, a gated attention block) passes
its token's normalised embedding through ``eh_proj`` (identity on the embedding half,
``mtp_noise`` on the hidden-state half) and adds its own attention and feed-forward scaled by
``mtp_noise``: it predicts what the trunk will say next (the same construction as
``localspec.testing.mtp``). Same vocabulary and chat template as ``localspec.testing.synthetic``.

Written with the ``gguf`` package, a base dependency (convert-head uses it too).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from localspec.testing.synthetic import (
    Matrices,
    TinyConfig,
    add_tokenizer,
    embedding_and_head,
    random_matrices,
    vocab_tokens,
    write_gguf,
)

ARCH = "qwen35"
SSM_CONV_KERNEL = 4
SSM_STATE = 16  # the delta net's key and value head width
SSM_K_HEADS = 2
SSM_V_HEADS = 4


@dataclass(frozen=True)
class Qwen35Spec:
    config: TinyConfig = TinyConfig(n_layer=4)
    full_attention_interval: int = 2  # blocks 1, 3, ... are attention blocks
    divergence: float = 0.3  # scale of the trunk blocks' outputs
    mtp_noise: float = 0.2  # scale of what the NextN block adds to its token's embedding
    with_mtp: bool = False


def _gated_attention(w: dict[str, np.ndarray], p: str, mat: Matrices, cfg: TinyConfig,
                     out_scale: float) -> None:
    """Qwen3.5's attention: one projection gives the query and its output gate."""
    head_dim = cfg.n_embd // cfg.n_head
    w[p + "attn_q.weight"] = mat(2 * cfg.n_head * head_dim, cfg.n_embd)
    w[p + "attn_k.weight"] = mat(cfg.n_head_kv * head_dim, cfg.n_embd)
    w[p + "attn_v.weight"] = mat(cfg.n_head_kv * head_dim, cfg.n_embd)
    w[p + "attn_q_norm.weight"] = np.ones(head_dim, dtype=np.float32)
    w[p + "attn_k_norm.weight"] = np.ones(head_dim, dtype=np.float32)
    w[p + "attn_output.weight"] = mat(cfg.n_embd, cfg.n_head * head_dim, out_scale)


def _delta_net(w: dict[str, np.ndarray], p: str, mat: Matrices, cfg: TinyConfig,
               out_scale: float) -> None:
    key_dim, value_dim = SSM_STATE * SSM_K_HEADS, SSM_STATE * SSM_V_HEADS
    conv_dim = 2 * key_dim + value_dim
    w[p + "attn_qkv.weight"] = mat(conv_dim, cfg.n_embd)
    w[p + "attn_gate.weight"] = mat(value_dim, cfg.n_embd)
    w[p + "ssm_conv1d.weight"] = mat(conv_dim, SSM_CONV_KERNEL)
    w[p + "ssm_dt.bias"] = np.zeros(SSM_V_HEADS, dtype=np.float32)
    w[p + "ssm_a"] = -np.arange(1, SSM_V_HEADS + 1, dtype=np.float32)  # decaying state
    w[p + "ssm_beta.weight"] = mat(SSM_V_HEADS, cfg.n_embd)
    w[p + "ssm_alpha.weight"] = mat(SSM_V_HEADS, cfg.n_embd)
    w[p + "ssm_norm.weight"] = np.ones(SSM_STATE, dtype=np.float32)
    w[p + "ssm_out.weight"] = mat(cfg.n_embd, value_dim, out_scale)


def _block(w: dict[str, np.ndarray], i: int, mat: Matrices, cfg: TinyConfig, attention: bool,
           out_scale: float) -> None:
    p = f"blk.{i}."
    w[p + "attn_norm.weight"] = np.ones(cfg.n_embd, dtype=np.float32)
    w[p + "post_attention_norm.weight"] = np.ones(cfg.n_embd, dtype=np.float32)
    (_gated_attention if attention else _delta_net)(w, p, mat, cfg, out_scale)
    w[p + "ffn_gate.weight"] = mat(cfg.n_ff, cfg.n_embd)
    w[p + "ffn_up.weight"] = mat(cfg.n_ff, cfg.n_embd)
    w[p + "ffn_down.weight"] = mat(cfg.n_embd, cfg.n_ff, out_scale)


def _weights(spec: Qwen35Spec, n_vocab: int) -> dict[str, np.ndarray]:
    cfg = spec.config
    mat = random_matrices(cfg.seed)
    w = embedding_and_head(mat, cfg, n_vocab)
    for i in range(cfg.n_layer):
        attention = (i + 1) % spec.full_attention_interval == 0
        _block(w, i, mat, cfg, attention, spec.divergence)
    if spec.with_mtp:
        n, mtp = cfg.n_embd, random_matrices(cfg.seed + 1)
        _block(w, cfg.n_layer, mtp, cfg, True, spec.mtp_noise)
        p = f"blk.{cfg.n_layer}.nextn."
        eh = np.concatenate([np.eye(n, dtype=np.float32), mtp(n, n, spec.mtp_noise)], axis=1)
        w[p + "eh_proj.weight"] = eh.astype(np.float32)
        w[p + "enorm.weight"] = np.ones(n, dtype=np.float32)
        w[p + "hnorm.weight"] = np.ones(n, dtype=np.float32)
    return w


def write_qwen35_model(path: str | Path, spec: Qwen35Spec | None = None, *,
                       name: str = "tiny-qwen35") -> Path:
    """Write the tiny qwen35 target (with its NextN block when ``spec.with_mtp``); returns its
    path."""
    import gguf  # test/bench dependency only

    path, spec = Path(path), spec or Qwen35Spec()
    cfg = spec.config
    head_dim = cfg.n_embd // cfg.n_head
    writer = gguf.GGUFWriter(str(path), ARCH)
    writer.add_name(name)
    writer.add_context_length(cfg.context_length)
    writer.add_embedding_length(cfg.n_embd)
    writer.add_block_count(cfg.n_layer + (1 if spec.with_mtp else 0))
    writer.add_feed_forward_length(cfg.n_ff)
    writer.add_head_count(cfg.n_head)
    writer.add_head_count_kv(cfg.n_head_kv)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    # Text-only M-RoPE: all rotary pairs in the first (temporal) section.
    writer.add_rope_dimension_sections([head_dim // 2, 0, 0, 0])
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_ssm_conv_kernel(SSM_CONV_KERNEL)
    writer.add_ssm_inner_size(SSM_STATE * SSM_V_HEADS)
    writer.add_ssm_state_size(SSM_STATE)
    writer.add_ssm_time_step_rank(SSM_V_HEADS)
    writer.add_ssm_group_count(SSM_K_HEADS)
    writer.add_uint32(f"{ARCH}.full_attention_interval", spec.full_attention_interval)
    if spec.with_mtp:
        writer.add_uint32(f"{ARCH}.nextn_predict_layers", 1)
    writer.add_vocab_size(len(vocab_tokens(cfg)))
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    add_tokenizer(writer, cfg)
    write_gguf(writer, _weights(spec, len(vocab_tokens(cfg))))
    return path
