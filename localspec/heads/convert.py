"""Hugging Face EAGLE-3 checkpoint -> eagle3 GGUF, with numpy and the ``gguf`` package only.

The output is the file llama.cpp's own ``convert_hf_to_gguf.py --target-model-dir`` writes
(the test suite compares them byte for byte when torch, transformers and llama.cpp's script
are available): the same tensor names, order, types and q/k permutation, ``d2t`` as absolute
target ids (offset + index), ``t2d`` dropped, the same metadata. The tokenizer comes from the
target GGUF instead of the target's Hugging Face directory.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeGuard

import numpy as np

from localspec.errors import InvalidParameterError
from localspec.files import read_input_bytes, read_input_text
from localspec.heads import eagle3
from localspec.heads.config import head_params, llama3_rope_factors, read_config
from localspec.models.gguf_reader import GGUFInfo, read_gguf

OUTTYPES = ("auto", "f32", "f16", "bf16", "q8_0")
_FILE_TYPES = {"f32": 0, "f16": 1, "q8_0": 7, "bf16": 32}  # llama_ftype
_ST_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I64": np.int64,
              "I32": np.int32, "BOOL": np.bool_, "F64": np.float64}
_LAYER_NAMES = {
    "input_layernorm": "attn_norm", "hidden_norm": "attn_norm_2",
    "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}
_TOP_NAMES = {"fc.weight": "fc.weight", "norm.weight": "output_norm.weight",
              "lm_head.weight": "output.weight", "embed_tokens.weight": "token_embd.weight",
              "model.embed_tokens.weight": "token_embd.weight",
              "input_norm.weight": "enc.output_norm.weight",
              "model.norm.weight": "output_norm.weight"}


def _part_names(checkpoint: Path) -> list[str]:
    index = checkpoint / "model.safetensors.index.json"
    if index.is_file():
        try:
            data = json.loads(read_input_text(index, "the checkpoint's index", limit=64 << 20))
        except ValueError as error:
            raise InvalidParameterError(f"'{index}' is not valid JSON ({error}).") from None
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not all(
                isinstance(part, str) for part in weight_map.values()):
            raise InvalidParameterError(
                f"'{index}' has no weight_map of tensor names to file names.")
        parts = sorted(dict.fromkeys(weight_map.values()))
        for part in parts:  # a part is a file of this folder, never a path out of it
            if Path(part).name != part or part in ("", ".", "..") or not (
                    checkpoint / part).is_file():
                raise InvalidParameterError(
                    f"'{index}' names the part '{part[:80]}', which is not a file in "
                    f"'{checkpoint}'.")
        return parts
    parts = sorted(p.name for p in checkpoint.iterdir()
                   if p.name.startswith("model") and p.name.endswith(".safetensors"))
    if not parts:
        raise InvalidParameterError(
            f"'{checkpoint}' has no model*.safetensors; convert-head reads safetensors "
            "checkpoints only (for pytorch_model.bin use llama.cpp's convert_hf_to_gguf.py)."
        )
    return parts


def read_safetensors(path: Path) -> Iterator[tuple[str, np.ndarray, str]]:
    """(name, array, safetensors dtype) sorted by name, as safetensors and llama.cpp list
    them; BF16 arrives widened to float32 (exactly)."""
    raw = read_input_bytes(path, "the checkpoint", limit=MAX_PART_BYTES)
    n = int.from_bytes(raw[:8], "little")
    if len(raw) < 8 or n > len(raw) - 8:
        raise InvalidParameterError(f"'{path}' is not a safetensors file: its header length "
                                    f"{n} runs past its {len(raw)} bytes.")
    try:
        header = json.loads(raw[8 : 8 + n])
    except ValueError:
        raise InvalidParameterError(f"'{path}' is not a safetensors file: its header is not "
                                    "JSON.") from None
    if not isinstance(header, dict):
        raise InvalidParameterError(f"'{path}' is not a safetensors file: its header is not "
                                    "an object.")
    header.pop("__metadata__", None)
    data_bytes = len(raw) - 8 - n
    for name, info in sorted(header.items()):
        dtype = info.get("dtype") if isinstance(info, dict) else None
        if dtype not in _ST_DTYPES:
            raise InvalidParameterError(f"Tensor '{name[:80]}' in '{path}' has dtype "
                                        f"{str(dtype)[:20]}, which convert-head cannot read.")
        start, end = _checked_offsets(path, name, info, np.dtype(_ST_DTYPES[dtype]), data_bytes)
        np_dtype = np.dtype(_ST_DTYPES[dtype])
        array = np.frombuffer(raw, np_dtype, offset=8 + n + start,
                              count=(end - start) // np_dtype.itemsize).reshape(info["shape"])
        if dtype == "BF16":
            array = (array.astype(np.uint32) << 16).view(np.float32)
        yield name, array, dtype


MAX_PART_BYTES = 16 << 30  # one safetensors part; a head is well under 1 GiB


def _counts(value: Any) -> TypeGuard[list[int]]:
    return isinstance(value, list) and all(
        isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in value)


def _checked_offsets(path: Path, name: str, info: dict[str, Any], dtype: np.dtype[Any],
                     data_bytes: int) -> tuple[int, int]:
    """A tensor's [start, end) in the data, which its shape and dtype fill exactly."""
    shape, offsets = info.get("shape"), info.get("data_offsets")
    if not (_counts(shape) and _counts(offsets) and len(offsets) == 2):
        raise InvalidParameterError(f"Tensor '{name[:80]}' in '{path}' has a malformed shape or "
                                    "data_offsets.")
    start, end = offsets
    size = math.prod(shape) * dtype.itemsize  # exact: no overflow on absurd shapes
    if not start <= end <= data_bytes or end - start != size:
        raise InvalidParameterError(
            f"Tensor '{name[:80]}' in '{path}' has data_offsets {offsets} that do not hold its "
            f"shape {shape} within the file's {data_bytes} data bytes.")
    return start, end


def _gguf_name(name: str) -> str | None:
    """The GGUF name of a checkpoint tensor (both layouts); None to drop it (t2d)."""
    if name == "t2d":
        return None
    for prefix in ("midlayer.", "layers.0.", "model.layers.0."):
        if name.startswith(prefix) and name.endswith(".weight"):
            ours = _LAYER_NAMES.get(name[len(prefix) : -len(".weight")])
            if ours is not None:
                return f"blk.0.{ours}.weight"
    if name in _TOP_NAMES or name == "d2t":
        return _TOP_NAMES.get(name, name)
    raise InvalidParameterError(
        f"The checkpoint has a tensor '{name}' that an EAGLE-3 head does not have; is this an "
        "EAGLE-3 checkpoint?"
    )


def _permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k row order for its RoPE (LlamaModel.permute)."""
    rows = weights.shape[0]
    return (weights.reshape(n_head, 2, rows // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def _guess_outtype(tensors: list[tuple[str, np.ndarray, str]]) -> str:
    """llama.cpp's "auto": the first 16-bit matrix decides; F16 otherwise."""
    for _name, array, st_dtype in tensors:
        if array.ndim >= 2 and st_dtype in ("BF16", "F16"):
            return st_dtype.lower()
    return "f16"


def _load(checkpoint: Path) -> list[tuple[str, np.ndarray, str]]:
    """(name, array, safetensors dtype) over every part, in llama.cpp's order."""
    parts = _part_names(checkpoint)
    return [item for part in parts for item in read_safetensors(checkpoint / part)]


def convert_head(checkpoint: str | Path, target: str | Path, out: str | Path,
                 outtype: str = "auto") -> Path:
    """Write the eagle3 GGUF for `checkpoint` (a directory), made for the `target` GGUF."""
    import gguf

    checkpoint, out = Path(checkpoint), Path(out)
    if outtype not in OUTTYPES:
        raise InvalidParameterError(
            f"--outtype {outtype!r} is invalid: use one of {', '.join(OUTTYPES)}."
        )
    raw, hparams = read_config(checkpoint)
    info = read_gguf(target)
    params = head_params(raw, hparams, info.n_layer, info.n_embd, info.vocab_size)
    _check_matches(params, info)
    tensors = _load(checkpoint)
    outtype = _guess_outtype(tensors) if outtype == "auto" else outtype
    writer = eagle3.start_writer(out, params)
    d2t = _add_tensors(writer, tensors, hparams, outtype)
    if d2t is None:
        raise InvalidParameterError(f"'{checkpoint}' has no d2t tensor; it is not an EAGLE-3 head.")
    target_ids = d2t.reshape(-1).astype(np.int64) + np.arange(d2t.size, dtype=np.int64)
    eagle3.check_d2t(target_ids, info.vocab_size)
    eagle3.add_d2t(writer, target_ids)
    total, shared, expert, n_expert = writer.get_total_parameter_count()
    writer.add_type(gguf.GGUFType.MODEL)
    metadata = gguf.Metadata.load(None, checkpoint, None, total)
    if metadata.name is None:
        metadata.name = checkpoint.name
    if metadata.size_label is None and total > 0:
        metadata.size_label = gguf.size_label(total, shared, expert, n_expert)
    metadata.set_gguf_meta_model(writer)
    eagle3.add_hparams(writer, params, _FILE_TYPES[outtype])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    eagle3.copy_tokenizer(writer, target)
    eagle3.finish(writer)
    return out


def _add_tensors(writer: Any, tensors: list[tuple[str, np.ndarray, str]],
                 hparams: dict[str, Any], outtype: str) -> np.ndarray | None:
    import gguf

    n_head = int(hparams["num_attention_heads"])
    n_head_kv = int(hparams.get("num_key_value_heads", n_head))
    rope_freqs = llama3_rope_factors(hparams)
    if rope_freqs is not None:
        writer.add_tensor("rope_freqs.weight", rope_freqs, raw_dtype=gguf.GGMLQuantizationType.F32)
    d2t = None
    for name, array, _dtype in tensors:
        gguf_name = _gguf_name(name)
        if gguf_name == "d2t":
            d2t = array
        if gguf_name is None or gguf_name == "d2t":
            continue
        data = array if array.dtype in (np.float16, np.float32) else array.astype(np.float32)
        if gguf_name.endswith(("attn_q.weight", "attn_k.weight")):
            data = _permute(data, n_head if "attn_q" in gguf_name else n_head_kv)
        eagle3.add_weight(writer, gguf_name, data, outtype)
    return d2t


def _check_matches(params: eagle3.Eagle3Params, target: GGUFInfo) -> None:
    """A head made for another target is refused with the first difference."""
    if params.vocab_size != target.vocab_size:
        raise InvalidParameterError(
            f"The head was made for a vocabulary of {params.vocab_size} tokens but the target "
            f"'{target.path}' has {target.vocab_size}; give the target the head was trained for."
        )
    if params.target_hidden_size != target.n_embd:
        raise InvalidParameterError(
            f"The head reads hidden states of size {params.target_hidden_size} but the target "
            f"'{target.path}' has {target.n_embd}; give the target the head was trained for."
        )
    bad = [i for i in params.target_layers if not 0 <= i < target.n_layer]
    if len(params.target_layers) != 3 or bad:
        raise InvalidParameterError(
            f"The head reads target layers {list(params.target_layers)} but the target "
            f"'{target.path}' has {target.n_layer} layers (0..{target.n_layer - 1}); give the "
            "target the head was trained for."
        )
