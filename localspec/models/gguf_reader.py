"""A small, dependency-free reader for GGUF headers: metadata and tensor layout.

The planner and the registry need a model's shape (layers, heads, vocabulary) and the bytes of
every tensor *before* anything is loaded, so they cannot go through llama.cpp. This module
reads only the header (the file is memory-mapped; tensor data is never touched) and checks
that the tensor data the header promises is really in the file, so a half-downloaded model
is reported as truncated instead of crashing llama.cpp later.

    info = read_gguf("model.gguf")
    info.architecture, info.n_layer, info.vocab_size, info.tensors[0].nbytes
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localspec.errors import ModelLoadError

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
# Arrays longer than this are summarised (SkippedArray) when read_arrays=False. Per-layer
# arrays (head counts of a few hundred layers) stay below it and are always read.
SKIP_ARRAY_THRESHOLD = 1024

# ggml type id -> (name, elements per block, bytes per block). Source: ggml's type traits.
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18),
    21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
    40: ("NVFP4", 64, 36),
    41: ("Q1_0", 128, 18),
}

# GGUF metadata value types -> struct format of one scalar (strings/arrays handled apart).
_SCALAR_FORMATS: dict[int, str] = {
    0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d",
}
_TYPE_STRING = 8
_TYPE_ARRAY = 9


def ggml_type_name(ggml_type: int) -> str:
    """Name of a ggml tensor type ("Q4_K"), or "TYPE_<id>" for one this table lacks."""
    entry = GGML_TYPES.get(ggml_type)
    return entry[0] if entry else f"TYPE_{ggml_type}"


def tensor_nbytes(ggml_type: int, shape: tuple[int, ...]) -> int | None:
    """Bytes of a tensor of this type and shape, or None when the type is unknown."""
    entry = GGML_TYPES.get(ggml_type)
    if entry is None:
        return None
    _, block, size = entry
    n = 1
    for dim in shape:
        n *= dim
    return (n // block) * size if n % block == 0 else -(-n // block) * size


@dataclass(frozen=True)
class SkippedArray:
    """A long metadata array that was not decoded (read_arrays=False); only its length is kept."""

    elem_type: int
    count: int

    def __len__(self) -> int:
        return self.count


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # ggml order: shape[0] is the contiguous (row) dimension
    ggml_type: int
    offset: int  # absolute file offset of the tensor data
    nbytes: int

    @property
    def type_name(self) -> str:
        return ggml_type_name(self.ggml_type)


@dataclass(frozen=True)
class GGUFInfo:
    """Everything in a GGUF header. Model hyper-parameters are exposed as properties."""

    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: list[TensorInfo]
    data_offset: int
    file_size: int

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def arch_get(self, suffix: str, default: Any = None) -> Any:
        """Metadata under the architecture prefix, e.g. arch_get("block_count")."""
        return self.metadata.get(f"{self.architecture}.{suffix}", default)

    def arch_int(self, suffix: str, default: int = 0) -> int:
        """An integer hyper-parameter under the architecture prefix; ModelLoadError (one
        sentence) when the file holds another type there."""
        return _integer(self, f"{self.architecture}.{suffix}", self.arch_get(suffix, default))

    def arch_max(self, suffix: str) -> int:
        """The largest of a hyper-parameter that may be one integer or one per layer."""
        value = self.arch_get(suffix, 0)
        key = f"{self.architecture}.{suffix}"
        if isinstance(value, list):
            return max((_integer(self, key, v) for v in value), default=0)
        return _integer(self, key, value)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", "unknown"))

    @property
    def name(self) -> str:
        return str(self.metadata.get("general.name") or self.path.stem)

    @property
    def n_layer(self) -> int:
        return self.arch_int("block_count")

    @property
    def n_ctx_train(self) -> int:
        return self.arch_int("context_length")

    @property
    def n_embd(self) -> int:
        return self.arch_int("embedding_length")

    @property
    def n_ff(self) -> int:
        return self.arch_max("feed_forward_length")

    @property
    def n_head(self) -> int:
        return self.arch_max("attention.head_count")

    def n_head_kv_per_layer(self) -> list[int]:
        """KV heads of each layer (GGUF stores either one number or one per layer)."""
        suffix = "attention.head_count_kv"
        value = self.arch_get(suffix)
        if value is None:
            suffix = "attention.head_count"
            value = self.arch_get(suffix, 0)
        key = f"{self.architecture}.{suffix}"
        if isinstance(value, list):
            return [_integer(self, key, v) for v in value]
        return [_integer(self, key, value)] * self.n_layer

    @property
    def head_dim_k(self) -> int:
        if self.arch_get("attention.key_length") is not None:
            return self.arch_int("attention.key_length")
        return self.n_embd // self.n_head if self.n_head else 0

    @property
    def head_dim_v(self) -> int:
        if self.arch_get("attention.value_length") is not None:
            return self.arch_int("attention.value_length")
        return self.head_dim_k

    @property
    def vocab_size(self) -> int:
        tokens = self.metadata.get("tokenizer.ggml.tokens")
        if isinstance(tokens, (list, SkippedArray)):
            return len(tokens)
        if tokens is not None:
            raise ModelLoadError(f"{self.path} is not a valid GGUF model: its metadata "
                                 "'tokenizer.ggml.tokens' is not a list of tokens.")
        if self.arch_get("vocab_size") is not None:
            return self.arch_int("vocab_size")
        embd = self.tensor("token_embd.weight")
        return embd.shape[1] if embd is not None and len(embd.shape) > 1 else 0

    @property
    def tensor_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    def tensor(self, name: str) -> TensorInfo | None:
        return next((t for t in self.tensors if t.name == name), None)


def _integer(info: GGUFInfo, key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        kind = "a list" if isinstance(value, (list, SkippedArray)) else type(value).__name__
        raise ModelLoadError(f"{info.path} is not a valid GGUF model: its metadata '{key[:80]}' "
                             f"should be an integer, not {kind}.")
    return value


MAX_ARRAY_NESTING = 4  # arrays of arrays in metadata; real files nest one level at most


class _Cursor:
    """Sequential reads from a memory-mapped file; running past the end means truncation."""

    def __init__(self, buf: mmap.mmap | bytes, path: Path) -> None:
        self.buf = buf
        self.pos = 0
        self.size = len(buf)
        self.path = path

    def need(self, n: int) -> None:
        if n < 0 or self.pos + n > self.size:
            raise ModelLoadError(
                f"{self.path} is truncated: its GGUF header ends early (at byte {self.size}); "
                "download it again."
            )

    def unpack_all(self, fmt: str) -> tuple[Any, ...]:
        size = struct.calcsize("<" + fmt)
        self.need(size)
        values = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += size
        return values

    def unpack(self, fmt: str) -> Any:
        values = self.unpack_all(fmt)
        return values[0] if len(values) == 1 else values

    def string(self) -> str:
        length = self.unpack("Q")
        self.need(length)
        raw = self.buf[self.pos : self.pos + length]
        self.pos += length
        return bytes(raw).decode("utf-8", errors="replace")

    def skip_strings(self, count: int) -> None:
        for _ in range(count):
            length = self.unpack("Q")
            self.need(length)
            self.pos += length


def _read_value(cur: _Cursor, vtype: int, key: str, read_arrays: bool) -> Any:
    if vtype in _SCALAR_FORMATS:
        return cur.unpack(_SCALAR_FORMATS[vtype])
    if vtype == _TYPE_STRING:
        return cur.string()
    if vtype == _TYPE_ARRAY:
        return _read_array(cur, key, read_arrays)
    raise ModelLoadError(
        f"{cur.path} is corrupt: metadata key {key!r} has unknown value type {vtype}; "
        "download it again."
    )


def _read_array(cur: _Cursor, key: str, read_arrays: bool, depth: int = 1) -> Any:
    if depth > MAX_ARRAY_NESTING:
        raise ModelLoadError(
            f"{cur.path} is corrupt: metadata array {key[:80]!r} nests arrays more than "
            f"{MAX_ARRAY_NESTING} deep; download it again.")
    elem_type, count = cur.unpack("IQ")
    skip = not read_arrays and count > SKIP_ARRAY_THRESHOLD
    if elem_type in _SCALAR_FORMATS:
        fmt = _SCALAR_FORMATS[elem_type]
        nbytes = struct.calcsize("<" + fmt) * count
        cur.need(nbytes)
        if skip:
            cur.pos += nbytes
            return SkippedArray(elem_type, count)
        values = list(struct.unpack_from(f"<{count}{fmt}", cur.buf, cur.pos))
        cur.pos += nbytes
        return values
    if elem_type == _TYPE_STRING:
        if skip:
            cur.skip_strings(count)
            return SkippedArray(elem_type, count)
        return [cur.string() for _ in range(count)]
    if elem_type == _TYPE_ARRAY:
        return [_read_array(cur, key, read_arrays, depth + 1) for _ in range(count)]
    raise ModelLoadError(
        f"{cur.path} is corrupt: metadata array {key!r} has unknown element type {elem_type}; "
        "download it again."
    )


def _check_path(path: Path) -> int:
    """Return the file size, or raise one clear sentence for a path that is not a file."""
    if not path.exists():
        raise ModelLoadError(f"{path} does not exist: check the path, or run `localspec models`.")
    if path.is_dir():
        raise ModelLoadError(f"{path} is a directory: pass the path of a .gguf file instead.")
    return path.stat().st_size


def _read_preamble(cur: _Cursor) -> tuple[int, int, int]:
    if cur.size < 4 or bytes(cur.buf[:4]) != GGUF_MAGIC:
        raise ModelLoadError(
            f"{cur.path} is not a GGUF file (it lacks the GGUF magic bytes): "
            "pass a .gguf model file."
        )
    cur.pos = 4
    version = cur.unpack("I")
    if version not in SUPPORTED_VERSIONS:
        hint = " (it looks big-endian)" if version >= 1 << 16 else ""
        raise ModelLoadError(
            f"{cur.path} uses GGUF version {version}{hint}, which localspec cannot read: "
            "convert it again with a current llama.cpp."
        )
    n_tensors, n_kv = cur.unpack("QQ")
    return version, n_tensors, n_kv


def _read_tensor_infos(cur: _Cursor, n_tensors: int) -> list[tuple[str, tuple[int, ...], int, int]]:
    raw = []
    for _ in range(n_tensors):
        name = cur.string()
        n_dims = cur.unpack("I")
        if n_dims > 8:
            raise ModelLoadError(
                f"{cur.path} is corrupt: tensor {name!r} claims {n_dims} dimensions; "
                "download it again."
            )
        shape = tuple(int(d) for d in cur.unpack_all(f"{n_dims}Q"))
        ggml_type, offset = cur.unpack("IQ")
        raw.append((name, shape, ggml_type, offset))
    return raw


def _build_tensors(
    raw: list[tuple[str, tuple[int, ...], int, int]], data_offset: int, file_size: int, path: Path
) -> list[TensorInfo]:
    """Turn raw tensor records into TensorInfo, sizing unknown types from the next offset."""
    order = sorted(range(len(raw)), key=lambda i: raw[i][3])
    next_start = {}
    for pos, i in enumerate(order):
        following = order[pos + 1] if pos + 1 < len(order) else None
        next_start[i] = raw[following][3] if following is not None else file_size - data_offset
    tensors = []
    for i, (name, shape, ggml_type, offset) in enumerate(raw):
        nbytes = tensor_nbytes(ggml_type, shape)
        if nbytes is None:
            nbytes = max(next_start[i] - offset, 0)
        end = data_offset + offset + nbytes
        if end > file_size:
            raise ModelLoadError(
                f"{path} is truncated: tensor {name} ends at byte {end} but the file has only "
                f"{file_size} bytes; download it again."
            )
        tensors.append(TensorInfo(name, shape, ggml_type, data_offset + offset, nbytes))
    return tensors


def _parse(cur: _Cursor, path: Path, file_size: int, read_arrays: bool) -> GGUFInfo:
    version, n_tensors, n_kv = _read_preamble(cur)
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        vtype = cur.unpack("I")
        metadata[key] = _read_value(cur, vtype, key, read_arrays)
    raw = _read_tensor_infos(cur, n_tensors)
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if isinstance(alignment, bool) or not isinstance(alignment, int) or not (
            0 < alignment <= 1 << 20 and alignment & (alignment - 1) == 0):
        raise ModelLoadError(f"{path} is corrupt: its general.alignment {str(alignment)[:40]!r} "
                             "is not a power of two; download it again.")
    data_offset = -(-cur.pos // alignment) * alignment
    if raw and data_offset > file_size:
        cur.need(data_offset - cur.pos)
    tensors = _build_tensors(raw, data_offset, file_size, path)
    return GGUFInfo(path, version, metadata, tensors, data_offset, file_size)


def read_gguf(path: str | os.PathLike[str], *, read_arrays: bool = True) -> GGUFInfo:
    """Read a GGUF file's header (metadata and tensor table) without reading tensor data.

    With ``read_arrays=False`` long arrays (the tokenizer's 262k token strings, scores, merges)
    are skipped and kept as ``SkippedArray`` (their length stays available): use it when only
    shapes and sizes matter. Raises ModelLoadError with one sentence for anything that is not
    a complete GGUF file.
    """
    path = Path(path).expanduser()
    file_size = _check_path(path)
    if file_size == 0:
        raise ModelLoadError(f"{path} is empty, so it is not a GGUF file: download it again.")
    try:
        with open(path, "rb") as handle, mmap.mmap(
            handle.fileno(), 0, access=mmap.ACCESS_READ
        ) as buf:
            return _parse(_Cursor(buf, path), path, file_size, read_arrays)
    except PermissionError as error:
        raise ModelLoadError(
            f"{path} cannot be read ({error.strerror}): check its permissions."
        ) from None
