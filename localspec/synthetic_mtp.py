"""A tiny target with an MTP (NextN) layer, in llama.cpp's ``glm4moe`` layout (GLM-4.5), for
tests and benchmarks of MTP drafting.

    target = write_mtp_model(tmp / "tiny-mtp.gguf", MtpSpec(divergence=0.3))

The trunk is ``n_layer`` dense blocks whose outputs are scaled by ``divergence``, so the final
hidden state of position q stays close to the embedding of token q. The NextN layer (block
``n_layer``, an MoE block as in GLM-4.5) passes its token's normalised embedding through its
``eh_proj`` (identity on the embedding half, ``mtp_noise`` on the hidden-state half) and adds
its own attention and experts scaled by ``mtp_noise``: it predicts what the trunk will say
next, wrong more often the larger the two knobs. ``useless=True`` gives it random weights
everywhere and a peaked output (its drafts are almost never accepted). Same vocabulary and
chat template as ``localspec.synthetic``; random weights otherwise.

Needs the ``gguf`` package (``pip install 'localspec[test]'``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from localspec.synthetic import (
    Matrices,
    TinyConfig,
    add_tokenizer,
    embedding_and_head,
    random_matrices,
    vocab_tokens,
)

ARCH = "glm4moe"
N_EXPERT = 2
N_EXPERT_USED = 1
N_FF_EXPERT = 32


@dataclass(frozen=True)
class MtpSpec:
    config: TinyConfig = TinyConfig()
    divergence: float = 0.3  # scale of the trunk blocks' outputs
    mtp_noise: float = 0.2  # scale of what the NextN layer adds to its token's embedding
    useless: bool = False  # random NextN weights: drafts the target rarely accepts
    with_mtp: bool = True  # False: the same trunk without the NextN layer (no MTP)


def _attention(w: dict[str, np.ndarray], p: str, mat: Matrices, cfg: TinyConfig,
               out_scale: float) -> None:
    head_dim = cfg.n_embd // cfg.n_head
    ones = np.ones(cfg.n_embd, dtype=np.float32)
    w[p + "attn_norm.weight"] = ones
    w[p + "attn_q.weight"] = mat(cfg.n_head * head_dim, cfg.n_embd)
    w[p + "attn_k.weight"] = mat(cfg.n_head_kv * head_dim, cfg.n_embd)
    w[p + "attn_v.weight"] = mat(cfg.n_head_kv * head_dim, cfg.n_embd)
    w[p + "attn_output.weight"] = mat(cfg.n_embd, cfg.n_head * head_dim, out_scale)
    w[p + "post_attention_norm.weight"] = ones


def _nextn_layer(w: dict[str, np.ndarray], mat: Matrices, spec: MtpSpec) -> None:
    cfg = spec.config
    n = cfg.n_embd
    scale = 1.0 if spec.useless else spec.mtp_noise
    p = f"blk.{cfg.n_layer}."
    _attention(w, p, mat, cfg, scale)
    w[p + "ffn_gate_inp.weight"] = mat(N_EXPERT, n)
    w[p + "exp_probs_b.bias"] = np.zeros(N_EXPERT, dtype=np.float32)
    experts = [(mat(N_FF_EXPERT, n), mat(N_FF_EXPERT, n), mat(n, N_FF_EXPERT, scale))
               for _ in range(N_EXPERT)]
    w[p + "ffn_gate_exps.weight"] = np.stack([e[0] for e in experts])
    w[p + "ffn_up_exps.weight"] = np.stack([e[1] for e in experts])
    w[p + "ffn_down_exps.weight"] = np.stack([e[2] for e in experts])
    w[p + "ffn_gate_shexp.weight"] = mat(N_FF_EXPERT, n)
    w[p + "ffn_up_shexp.weight"] = mat(N_FF_EXPERT, n)
    w[p + "ffn_down_shexp.weight"] = mat(n, N_FF_EXPERT, scale)
    # eh_proj maps [enorm(embedding), hnorm(h)] to the block's input.
    if spec.useless:
        eh = mat(n, 2 * n)
        # Its own final norm, scaled up: peaked draft distributions on unrelated tokens.
        w[p + "nextn.shared_head_norm.weight"] = np.full(n, 4.0, dtype=np.float32)
    else:
        eh = np.concatenate([np.eye(n, dtype=np.float32), mat(n, n, spec.mtp_noise)], axis=1)
    w[p + "nextn.eh_proj.weight"] = eh.astype(np.float32)
    w[p + "nextn.enorm.weight"] = np.ones(n, dtype=np.float32)
    w[p + "nextn.hnorm.weight"] = np.ones(n, dtype=np.float32)


def _weights(spec: MtpSpec, n_vocab: int) -> dict[str, np.ndarray]:
    cfg = spec.config
    mat = random_matrices(cfg.seed)
    w = embedding_and_head(mat, cfg, n_vocab)
    for i in range(cfg.n_layer):
        p = f"blk.{i}."
        _attention(w, p, mat, cfg, spec.divergence)
        w[p + "ffn_gate.weight"] = mat(cfg.n_ff, cfg.n_embd)
        w[p + "ffn_up.weight"] = mat(cfg.n_ff, cfg.n_embd)
        w[p + "ffn_down.weight"] = mat(cfg.n_embd, cfg.n_ff, spec.divergence)
    if spec.with_mtp:
        _nextn_layer(w, random_matrices(cfg.seed + 1), spec)
    return w


def write_mtp_model(path: str | Path, spec: MtpSpec | None = None, *,
                    name: str = "tiny-mtp") -> Path:
    """Write the tiny glm4moe target (with its NextN layer unless ``spec.with_mtp`` is False);
    returns its path."""
    import gguf  # test/bench dependency only

    path, spec = Path(path), spec or MtpSpec()
    cfg = spec.config
    n_vocab = len(vocab_tokens(cfg))
    writer = gguf.GGUFWriter(str(path), ARCH)
    writer.add_name(name)
    writer.add_context_length(cfg.context_length)
    writer.add_embedding_length(cfg.n_embd)
    writer.add_block_count(cfg.n_layer + (1 if spec.with_mtp else 0))
    writer.add_feed_forward_length(cfg.n_ff)
    writer.add_head_count(cfg.n_head)
    writer.add_head_count_kv(cfg.n_head_kv)
    writer.add_rope_dimension_count(cfg.n_embd // cfg.n_head)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n_vocab)
    # GLM-4.5's MoE keys; every trunk block is dense, the NextN block is an MoE block.
    writer.add_uint32(f"{ARCH}.leading_dense_block_count", cfg.n_layer)
    writer.add_uint32(f"{ARCH}.expert_count", N_EXPERT)
    writer.add_uint32(f"{ARCH}.expert_used_count", N_EXPERT_USED)
    writer.add_uint32(f"{ARCH}.expert_shared_count", 1)
    writer.add_uint32(f"{ARCH}.expert_feed_forward_length", N_FF_EXPERT)
    writer.add_float32(f"{ARCH}.expert_weights_scale", 1.0)
    writer.add_bool(f"{ARCH}.expert_weights_norm", True)
    if spec.with_mtp:
        writer.add_uint32(f"{ARCH}.nextn_predict_layers", 1)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    add_tokenizer(writer, cfg)
    for tensor_name, array in _weights(spec, n_vocab).items():
        writer.add_tensor(tensor_name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
