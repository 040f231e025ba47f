"""A tiny target with MTP (NextN) layers, for tests and benchmarks of MTP drafting: one layer in
llama.cpp's ``glm4moe`` layout (GLM-4.5), or several in its ``hy_v3`` layout (Hunyuan V3, whose
MTP graph selects its layer with ``llama_set_nextn_layer_offset``: draft position i, layer i).

    target = write_mtp_model(tmp / "tiny-mtp.gguf", MtpSpec(divergence=0.3))
    chained = write_mtp_model(tmp / "tiny-mtp2.gguf", MtpSpec(arch="hy_v3", n_nextn=2))

The trunk is ``n_layer`` dense blocks whose outputs are scaled by ``divergence``, so the final
hidden state of position q stays close to the embedding of token q. The NextN layer (block
``n_layer``, an MoE block as in GLM-4.5) passes its token's normalised embedding through its
``eh_proj`` (identity on the embedding half, ``mtp_noise`` on the hidden-state half) and adds
its own attention and experts scaled by ``mtp_noise``: it predicts what the trunk will say
next, wrong more often the larger the two knobs. ``useless=True`` gives it random weights
everywhere and a peaked output (its drafts are almost never accepted); ``useless_layers``
does that to the NextN layers it names only. The ``hy_v3`` blocks are dense (its MoE keys are
optional) with the q/k norms that architecture has; every NextN layer is built like the first,
from its own random draw. Same vocabulary and chat template as ``localspec.testing.synthetic``;
random
weights otherwise.

Written with the ``gguf`` package, a base dependency (convert-head uses it too).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

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

if TYPE_CHECKING:
    import gguf

ARCHS = ("glm4moe", "hy_v3")
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
    arch: str = "glm4moe"  # or "hy_v3" (several NextN layers)
    n_nextn: int = 1  # NextN layers (llama.cpp's glm4moe graph runs 1 only)
    useless_layers: tuple[int, ...] = ()  # NextN layers (0-based) given random weights

    def __post_init__(self) -> None:
        if self.arch not in ARCHS or self.n_nextn < 1:
            raise ValueError(f"no tiny {self.arch} target with {self.n_nextn} NextN layers")

    def layer_useless(self, i: int) -> bool:
        return self.useless or i in self.useless_layers


def _attention(w: dict[str, np.ndarray], p: str, mat: Matrices, spec: MtpSpec,
               out_scale: float) -> None:
    cfg = spec.config
    head_dim = cfg.n_embd // cfg.n_head
    ones = np.ones(cfg.n_embd, dtype=np.float32)
    w[p + "attn_norm.weight"] = ones
    w[p + "attn_q.weight"] = mat(cfg.n_head * head_dim, cfg.n_embd)
    w[p + "attn_k.weight"] = mat(cfg.n_head_kv * head_dim, cfg.n_embd)
    w[p + "attn_v.weight"] = mat(cfg.n_head_kv * head_dim, cfg.n_embd)
    w[p + "attn_output.weight"] = mat(cfg.n_embd, cfg.n_head * head_dim, out_scale)
    if spec.arch == "hy_v3":
        w[p + "attn_q_norm.weight"] = np.ones(head_dim, dtype=np.float32)
        w[p + "attn_k_norm.weight"] = np.ones(head_dim, dtype=np.float32)
        w[p + "ffn_norm.weight"] = ones
    else:
        w[p + "post_attention_norm.weight"] = ones


def _dense_ffn(w: dict[str, np.ndarray], p: str, mat: Matrices, cfg: TinyConfig,
               out_scale: float) -> None:
    w[p + "ffn_gate.weight"] = mat(cfg.n_ff, cfg.n_embd)
    w[p + "ffn_up.weight"] = mat(cfg.n_ff, cfg.n_embd)
    w[p + "ffn_down.weight"] = mat(cfg.n_embd, cfg.n_ff, out_scale)


def _experts(w: dict[str, np.ndarray], p: str, mat: Matrices, n: int, scale: float) -> None:
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


def _nextn_layer(w: dict[str, np.ndarray], mat: Matrices, spec: MtpSpec, i: int) -> None:
    cfg = spec.config
    n = cfg.n_embd
    useless = spec.layer_useless(i)
    scale = 1.0 if useless else spec.mtp_noise
    p = f"blk.{cfg.n_layer + i}."
    _attention(w, p, mat, spec, scale)
    if spec.arch == "hy_v3":
        _dense_ffn(w, p, mat, cfg, scale)
    else:
        _experts(w, p, mat, n, scale)
    # eh_proj maps [enorm(embedding), hnorm(h)] to the block's input.
    if useless:
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
        _attention(w, p, mat, spec, spec.divergence)
        _dense_ffn(w, p, mat, cfg, spec.divergence)
    for i in range(spec.n_nextn if spec.with_mtp else 0):
        _nextn_layer(w, random_matrices(cfg.seed + 1 + i), spec, i)
    return w


def _arch_keys(writer: gguf.GGUFWriter, spec: MtpSpec) -> None:
    arch = spec.arch
    if arch == "hy_v3":  # dense blocks: the expert width is read but unused
        writer.add_uint32(f"{arch}.expert_feed_forward_length", N_FF_EXPERT)
    else:  # GLM-4.5's MoE keys; every trunk block is dense, the NextN block is an MoE block.
        writer.add_uint32(f"{arch}.leading_dense_block_count", spec.config.n_layer)
        writer.add_uint32(f"{arch}.expert_count", N_EXPERT)
        writer.add_uint32(f"{arch}.expert_used_count", N_EXPERT_USED)
        writer.add_uint32(f"{arch}.expert_shared_count", 1)
        writer.add_uint32(f"{arch}.expert_feed_forward_length", N_FF_EXPERT)
        writer.add_float32(f"{arch}.expert_weights_scale", 1.0)
        writer.add_bool(f"{arch}.expert_weights_norm", True)
    if spec.with_mtp:
        writer.add_uint32(f"{arch}.nextn_predict_layers", spec.n_nextn)


def write_mtp_model(path: str | Path, spec: MtpSpec | None = None, *,
                    name: str = "tiny-mtp") -> Path:
    """Write the tiny target (with its NextN layers unless ``spec.with_mtp`` is False); returns
    its path."""
    import gguf  # test/bench dependency only

    path, spec = Path(path), spec or MtpSpec()
    cfg = spec.config
    n_vocab = len(vocab_tokens(cfg))
    writer = gguf.GGUFWriter(str(path), spec.arch)
    writer.add_name(name)
    writer.add_context_length(cfg.context_length)
    writer.add_embedding_length(cfg.n_embd)
    writer.add_block_count(cfg.n_layer + (spec.n_nextn if spec.with_mtp else 0))
    writer.add_feed_forward_length(cfg.n_ff)
    writer.add_head_count(cfg.n_head)
    writer.add_head_count_kv(cfg.n_head_kv)
    writer.add_rope_dimension_count(cfg.n_embd // cfg.n_head)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n_vocab)
    _arch_keys(writer, spec)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    add_tokenizer(writer, cfg)
    write_gguf(writer, _weights(spec, n_vocab))
    return path
