"""Step 4: the trained head as the eagle3 GGUF that the core and llama.cpp's eagle3 loader read
(localspec/heads/eagle3.py writes the layout). Matrices in F16 (as published heads are), Q8_0 (about
half the size: the shipped head) or F32; norms stay F32; d2t holds absolute target ids. Takes
numpy arrays named as localspec/train/model.py names its parameters: no torch here."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import numpy.typing as npt

from localspec.heads import eagle3
from localspec.models.gguf_reader import read_gguf
from localspec.train.params import HeadShape

# model.py's parameter names -> the GGUF's tensor names.
TENSOR_NAMES = {
    "fc.weight": "fc.weight",
    "attn_norm.weight": "blk.0.attn_norm.weight",
    "hidden_norm.weight": "blk.0.attn_norm_2.weight",
    "q.weight": "blk.0.attn_q.weight",
    "k.weight": "blk.0.attn_k.weight",
    "v.weight": "blk.0.attn_v.weight",
    "o.weight": "blk.0.attn_output.weight",
    "ffn_norm.weight": "blk.0.ffn_norm.weight",
    "gate.weight": "blk.0.ffn_gate.weight",
    "up.weight": "blk.0.ffn_up.weight",
    "down.weight": "blk.0.ffn_down.weight",
    "output_norm.weight": "output_norm.weight",
    "output.weight": "output.weight",
}
FILE_TYPES = {"f32": 0, "f16": 1, "q8_0": 7}  # llama.cpp's LLAMA_FTYPE_*


def head_params(shape: HeadShape, target: str | Path) -> eagle3.Eagle3Params:
    info = read_gguf(target)
    return eagle3.Eagle3Params(
        n_embd=shape.n_embd, n_ff=shape.n_ff, n_head=shape.n_head, n_head_kv=shape.n_head_kv,
        context_length=info.n_ctx_train or shape.context_length, rms_eps=shape.rms_eps,
        rope_freq_base=shape.rope_base, rope_dim=shape.head_dim, vocab_size=info.vocab_size,
        target_layers=shape.target_layers, target_hidden_size=shape.target_width,
        head_dim=shape.head_dim,
    )


def write_head(path: str | Path, arrays: Mapping[str, npt.NDArray[np.float32]], shape: HeadShape,
               target: str | Path, outtype: str = "f16") -> Path:
    """Write the head; `arrays` holds model.py's parameters (torch layout: [out, in])."""
    path = Path(path)
    params = head_params(shape, target)
    d2t = np.asarray(shape.d2t, dtype=np.int64)
    eagle3.check_d2t(d2t, params.vocab_size)
    tmp = path.with_name(path.name + ".tmp")
    writer = eagle3.start_writer(tmp, params)
    for ours, theirs in TENSOR_NAMES.items():
        eagle3.add_weight(writer, theirs, np.asarray(arrays[ours], dtype=np.float32), outtype)
    eagle3.add_d2t(writer, d2t)
    writer.add_name(f"localspec EAGLE-3 head for {Path(target).name}")
    eagle3.add_hparams(writer, params, file_type=FILE_TYPES[outtype])
    eagle3.copy_tokenizer(writer, target)
    eagle3.finish(writer)
    tmp.replace(path)
    return path
