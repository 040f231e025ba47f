"""Tiny random EAGLE-3 heads for a given target GGUF, in the layout the pinned llama.cpp loads
(localspec/heads/eagle3.py), for tests and benchmarks of hidden-state drafting.

    head = write_eagle3_head(tmp / "head.gguf", target_path, HeadSpec(draft_vocab=128))

The head reads the target's layers (2, n/2, n-3) by default (clamped into a small target), has
its own output layer over ``draft_vocab`` target tokens (a random subset, or the whole
vocabulary when ``draft_vocab`` is 0: then no ``d2t``), and copies the target's tokenizer.

Written with the ``gguf`` package, a base dependency (convert-head uses it too).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from localspec.heads import eagle3
from localspec.models.gguf_reader import read_gguf
from localspec.testing.synthetic import random_matrices


@dataclass(frozen=True)
class HeadSpec:
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 128
    draft_vocab: int = 128  # 0: the target's whole vocabulary, no d2t
    target_layers: tuple[int, int, int] | None = None  # None: low / mid / high
    scale: float = 1.0  # of the output layer: larger gives peakier draft distributions
    seed: int = 0
    f16: bool = False  # matrices in F16, as published heads are (norms stay F32)


def default_target_layers(n_layer: int) -> tuple[int, int, int]:
    """llama.cpp's default (2, n/2, n-3), kept inside a target of any size."""
    def clamp(i: int) -> int:
        return min(max(i, 0), n_layer - 1)

    return clamp(2), clamp(n_layer // 2), clamp(n_layer - 3)


def _tensors(spec: HeadSpec, n_embd_tgt: int, n_out: int) -> dict[str, np.ndarray]:
    mat = random_matrices(spec.seed)
    head_dim = spec.n_embd // spec.n_head

    ones = np.ones(spec.n_embd, dtype=np.float32)
    p = "blk.0."
    return {
        "fc.weight": mat(spec.n_embd, 3 * n_embd_tgt),
        p + "attn_norm.weight": ones,
        p + "attn_norm_2.weight": ones,
        p + "attn_q.weight": mat(spec.n_head * head_dim, 2 * spec.n_embd),
        p + "attn_k.weight": mat(spec.n_head_kv * head_dim, 2 * spec.n_embd),
        p + "attn_v.weight": mat(spec.n_head_kv * head_dim, 2 * spec.n_embd),
        p + "attn_output.weight": mat(spec.n_embd, spec.n_head * head_dim),
        p + "ffn_norm.weight": ones,
        p + "ffn_gate.weight": mat(spec.n_ff, spec.n_embd),
        p + "ffn_up.weight": mat(spec.n_ff, spec.n_embd),
        p + "ffn_down.weight": mat(spec.n_embd, spec.n_ff),
        "output_norm.weight": ones,
        "output.weight": mat(n_out, spec.n_embd, spec.scale * 3.0),
    }


def write_eagle3_head(
    path: str | Path, target: str | Path, spec: HeadSpec | None = None
) -> Path:
    """Write a random eagle3 head for the `target` GGUF; returns its path."""
    spec = spec or HeadSpec()
    path, info = Path(path), read_gguf(target)
    n_vocab = info.vocab_size
    layers = spec.target_layers or default_target_layers(info.n_layer)
    params = eagle3.Eagle3Params(
        n_embd=spec.n_embd, n_ff=spec.n_ff, n_head=spec.n_head, n_head_kv=spec.n_head_kv,
        context_length=info.n_ctx_train or 4096, rms_eps=1e-5, rope_freq_base=10000.0,
        rope_dim=spec.n_embd // spec.n_head, vocab_size=n_vocab, target_layers=layers,
        target_hidden_size=info.n_embd, head_dim=spec.n_embd // spec.n_head,
    )
    writer = eagle3.start_writer(path, params)
    n_out = spec.draft_vocab or n_vocab
    for name, array in _tensors(spec, info.n_embd, n_out).items():
        writer.add_tensor(name, array.astype(np.float16) if spec.f16 and array.ndim == 2 else array)
    if spec.draft_vocab:
        rng = np.random.default_rng(spec.seed + 1)
        target_ids = np.sort(rng.choice(n_vocab, size=spec.draft_vocab, replace=False))
        eagle3.check_d2t(target_ids, n_vocab)
        eagle3.add_d2t(writer, target_ids)
    writer.add_name("tiny-eagle3-head")
    eagle3.add_hparams(writer, params, file_type=0)
    eagle3.copy_tokenizer(writer, target)
    eagle3.finish(writer)
    return path
