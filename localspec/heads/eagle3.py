"""The eagle3 GGUF layout that the pinned llama.cpp loads (docs/design.md, "Hidden-state
drafting"), written with the ``gguf`` package. The registry's ``gguf`` predates the eagle3
constants: keys go by name.

An EAGLE-3 head is one Llama decoder layer fed by the target's hidden states at three layers
(fused by ``fc``), with its own output layer over a draft vocabulary and a ``d2t`` table of
absolute target token ids. Metadata, in the order llama.cpp's converter writes it: the
target keys right after ``general.architecture``, then ``general.*``, the layer's
hyper-parameters, ``general.quantization_version`` and the target's ``tokenizer.*`` keys.

Used by ``localspec convert-head`` (localspec/heads/convert.py), ``localspec train-head``
(localspec/train/write.py) and by the tiny random heads of the tests
(localspec/testing/heads.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import gguf

ARCH = "eagle3"
# Tensors a head may have (llama.cpp's MODEL_TENSORS for eagle3); blk.0.* is the one layer.
LAYER_TENSORS = ("attn_norm", "attn_norm_2", "attn_q", "attn_k", "attn_v", "attn_output",
                 "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")
TOP_TENSORS = ("fc", "output_norm", "output", "token_embd", "rope_freqs", "enc.output_norm")


@dataclass(frozen=True)
class RopeScaling:
    """RoPE scaling keys (llama.cpp writes them for "linear" and "yarn" only)."""

    kind: str  # "linear" or "yarn"
    factor: float
    original_context: int | None = None
    extra: Mapping[str, float] = field(default_factory=dict)  # yarn: ext/attn/beta factors


@dataclass(frozen=True)
class Eagle3Params:
    """The head's hyper-parameters, as they go into the GGUF."""

    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    context_length: int
    rms_eps: float
    rope_freq_base: float | None
    rope_dim: int
    vocab_size: int  # the target's vocabulary
    target_layers: tuple[int, ...]
    target_hidden_size: int
    head_dim: int | None = None  # written as key/value length when given
    norm_before_residual: bool = False
    norm_before_fc: bool = False
    rope_scaling: RopeScaling | None = None


def start_writer(path: str | Path, params: Eagle3Params) -> gguf.GGUFWriter:
    """A writer holding general.architecture and the target keys (llama.cpp's order)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), ARCH)
    writer.add_array(f"{ARCH}.target_layers", [int(i) for i in params.target_layers])
    writer.add_uint32(f"{ARCH}.target_hidden_size", params.target_hidden_size)
    writer.add_bool(f"{ARCH}.norm_before_residual", params.norm_before_residual)
    writer.add_bool(f"{ARCH}.norm_before_fc", params.norm_before_fc)
    return writer


def add_hparams(writer: gguf.GGUFWriter, params: Eagle3Params, file_type: int) -> None:
    """The layer's hyper-parameters, file type, vocabulary size and RoPE dimensions."""
    writer.add_block_count(1)
    writer.add_context_length(params.context_length)
    writer.add_embedding_length(params.n_embd)
    writer.add_feed_forward_length(params.n_ff)
    writer.add_head_count(params.n_head)
    writer.add_head_count_kv(params.n_head_kv)
    _add_rope_scaling(writer, params.rope_scaling)
    if params.rope_freq_base is not None:
        writer.add_rope_freq_base(params.rope_freq_base)
    writer.add_layer_norm_rms_eps(params.rms_eps)
    if params.head_dim is not None:
        writer.add_key_length(params.head_dim)
        writer.add_value_length(params.head_dim)
    writer.add_file_type(file_type)
    writer.add_vocab_size(params.vocab_size)
    writer.add_rope_dimension_count(params.rope_dim)


def _add_rope_scaling(writer: gguf.GGUFWriter, scaling: RopeScaling | None) -> None:
    import gguf

    if scaling is None:
        return
    if scaling.kind == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(scaling.factor)
        return
    writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    writer.add_rope_scaling_factor(scaling.factor)
    writer.add_rope_scaling_orig_ctx_len(scaling.original_context or 0)
    for key, value in scaling.extra.items():
        writer.add_float32(f"{ARCH}.rope.scaling.yarn_{key}", value)


def copy_tokenizer(writer: gguf.GGUFWriter, target: str | Path) -> None:
    """The target GGUF's ``tokenizer.*`` keys, same order, values and types."""
    import gguf

    reader = gguf.GGUFReader(str(target))
    for key, kv in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        value_type = kv.types[0]
        sub_type = kv.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, kv.contents(), value_type, sub_type=sub_type)


def add_d2t(writer: gguf.GGUFWriter, target_ids: np.ndarray) -> None:
    import gguf

    writer.add_tensor("d2t", target_ids.astype(np.int64), raw_dtype=gguf.GGMLQuantizationType.I64)


def check_d2t(target_ids: np.ndarray, n_target_vocab: int) -> None:
    """Absolute target ids must be in the vocabulary and distinct (as llama.cpp checks)."""
    from localspec.errors import InvalidParameterError

    if target_ids.size and (target_ids.min() < 0 or target_ids.max() >= n_target_vocab):
        raise InvalidParameterError(
            f"The head's d2t table maps to target ids up to {int(target_ids.max())}, outside the "
            f"target's vocabulary of {n_target_vocab} tokens; use the head with the target it "
            "was trained for."
        )
    if np.unique(target_ids).size != target_ids.size:
        raise InvalidParameterError(
            "The head's d2t table maps two draft tokens to the same target token; the "
            "checkpoint is damaged."
        )


def add_weight(writer: gguf.GGUFWriter, gguf_name: str, array: np.ndarray, outtype: str) -> None:
    """One tensor as llama.cpp's converter stores it: norms and other vectors in F32, matrices
    in ``outtype`` (f32, f16, bf16 or q8_0), falling back to F16 where the type cannot hold the
    row length, as llama.cpp does."""
    import gguf

    q = gguf.GGMLQuantizationType
    matrix_types = {"f32": q.F32, "f16": q.F16, "bf16": q.BF16, "q8_0": q.Q8_0}
    vector = (array.ndim <= 1 or gguf_name.endswith("_norm.weight")
              or not gguf_name.endswith(".weight"))
    qtype = q.F32 if vector else matrix_types[outtype]
    try:
        blob = gguf.quants.quantize(array, qtype)
    except gguf.QuantError:
        qtype = q.F16
        blob = gguf.quants.quantize(array, qtype)
    writer.add_tensor(gguf_name, blob, raw_dtype=qtype)


def finish(writer: gguf.GGUFWriter) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def unknown_tensors(arrays: Mapping[str, Any]) -> list[str]:
    """Names in `arrays` that the eagle3 loader does not know (the loader rejects extras)."""
    known = {f"{n}.weight" for n in TOP_TENSORS} | {f"blk.0.{n}.weight" for n in LAYER_TENSORS}
    return [name for name in arrays if name not in known and name != "d2t"]
