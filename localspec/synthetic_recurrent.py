"""A tiny recurrent GGUF (llama.cpp's ``mamba`` architecture) for tests.

A recurrent model keeps one state per sequence instead of a KV entry per position, so its
memory cannot drop a suffix: llama.cpp refuses ``llama_memory_seq_rm`` from a position inside
the sequence, and a rejected draft token could not be taken back. localspec decodes such a
target plainly (see docs/models.md). Same vocabulary and chat template as
``localspec.synthetic``; random weights.

Needs the ``gguf`` package (``pip install 'localspec[test]'``).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from localspec.synthetic import (
    TinyConfig,
    add_tokenizer,
    embedding_and_head,
    random_matrices,
    vocab_tokens,
)

SSM_STATE_SIZE = 16
SSM_CONV_KERNEL = 4


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
    for tensor_name, array in _mamba_weights(cfg, n_vocab).items():
        writer.add_tensor(tensor_name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
