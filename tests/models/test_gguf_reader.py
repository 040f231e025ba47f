"""The pure-Python GGUF header reader, checked against files written by the `gguf` package."""

from __future__ import annotations

import struct
from pathlib import Path

import gguf
import numpy as np
import pytest

from localspec.errors import ModelLoadError
from localspec.models.gguf_reader import GGML_TYPES, SkippedArray, read_gguf, tensor_nbytes

Q = gguf.GGMLQuantizationType


def write_gguf(path: Path, *, n_vocab: int = 40, head_count_kv: int | list[int] = 2,
               tied: bool = False, key_length: int | None = None) -> Path:
    """A small llama-style GGUF with F32/F16 tensors and a few quantized ones (random bytes)."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("reader-test")
    writer.add_block_count(2)
    writer.add_context_length(256)
    writer.add_embedding_length(64)
    writer.add_feed_forward_length(128)
    writer.add_head_count(4)
    writer.add_head_count_kv(head_count_kv)  # type: ignore[arg-type]
    if key_length is not None:
        writer.add_key_length(key_length)
        writer.add_value_length(key_length)
    writer.add_token_list([f"t{i}" for i in range(n_vocab)])
    writer.add_token_scores([float(i) for i in range(n_vocab)])
    writer.add_uint8("test.u8", 7)
    writer.add_int16("test.i16", -3)
    writer.add_uint64("test.u64", 2**40)
    writer.add_float64("test.f64", 0.5)
    writer.add_bool("test.bool", True)
    writer.add_array("test.strings", ["a", "bé", ""])
    rng = np.random.default_rng(0)
    writer.add_tensor("token_embd.weight", rng.random((n_vocab, 64), dtype=np.float32))
    for layer in range(2):
        writer.add_tensor(f"blk.{layer}.attn_norm.weight", np.ones(64, dtype=np.float32))
        writer.add_tensor(f"blk.{layer}.attn_q.weight",
                          rng.integers(0, 255, (64, 2 * 34), dtype=np.uint8), raw_dtype=Q.Q8_0)
        writer.add_tensor(f"blk.{layer}.ffn_up.weight",
                          rng.integers(0, 255, (128, 144), dtype=np.uint8), raw_dtype=Q.Q4_K)
        writer.add_tensor(f"blk.{layer}.ffn_down.weight",
                          rng.random((64, 128)).astype(np.float16))
    writer.add_tensor("output_norm.weight", np.ones(64, dtype=np.float32))
    if not tied:
        writer.add_tensor("output.weight",
                          rng.integers(0, 255, (n_vocab, 2 * 22), dtype=np.uint8), raw_dtype=Q.Q5_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def raw_gguf(path: Path, tensors: list[tuple[str, tuple[int, ...], int, int]], data_len: int,
             version: int = 3) -> Path:
    """A GGUF written by hand (for types and layouts the gguf package refuses to write)."""
    def string(text: str) -> bytes:
        return struct.pack("<Q", len(text)) + text.encode()

    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), 1)
    out += string("general.architecture") + struct.pack("<I", 8) + string("llama")
    for name, shape, ggml_type, offset in tensors:
        out += string(name) + struct.pack(f"<I{len(shape)}QIQ", len(shape), *shape, ggml_type,
                                          offset)
    out += b"\0" * (-len(out) % 32) + b"\1" * data_len
    path.write_bytes(out)
    return path


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return write_gguf(tmp_path / "m.gguf")


def test_metadata_values_round_trip(model: Path) -> None:
    info = read_gguf(model)
    assert info.version == 3
    assert info.architecture == "llama"
    assert info.name == "reader-test"
    meta = info.metadata
    assert (meta["test.u8"], meta["test.i16"], meta["test.u64"]) == (7, -3, 2**40)
    assert meta["test.f64"] == 0.5 and meta["test.bool"] is True
    assert meta["test.strings"] == ["a", "bé", ""]
    assert meta["tokenizer.ggml.tokens"][:3] == ["t0", "t1", "t2"]
    assert meta["tokenizer.ggml.scores"][5] == pytest.approx(5.0)


def test_tensors_match_the_gguf_package(model: Path) -> None:
    info = read_gguf(model)
    reference = gguf.GGUFReader(str(model))
    assert info.data_offset == reference.data_offset
    assert info.file_size == model.stat().st_size
    ours = {t.name: t for t in info.tensors}
    assert len(ours) == len(reference.tensors)
    for ref in reference.tensors:
        mine = ours[ref.name]
        assert mine.shape == tuple(int(d) for d in ref.shape)
        assert mine.ggml_type == int(ref.tensor_type)
        assert mine.offset == ref.data_offset
        assert mine.nbytes == ref.n_bytes
    assert ours["blk.0.attn_q.weight"].type_name == "Q8_0"
    assert ours["blk.0.ffn_up.weight"].shape == (256, 128)
    assert info.tensor_bytes == sum(t.n_bytes for t in reference.tensors)


def test_hyperparameter_helpers(model: Path) -> None:
    info = read_gguf(model)
    assert (info.n_layer, info.n_ctx_train, info.n_embd, info.n_ff) == (2, 256, 64, 128)
    assert info.n_head == 4
    assert info.n_head_kv_per_layer() == [2, 2]
    assert info.head_dim_k == info.head_dim_v == 16  # n_embd / n_head without key_length
    assert info.vocab_size == 40
    assert info.tensor("output.weight") is not None
    assert info.tensor("nope") is None


def test_per_layer_head_counts_and_key_length(tmp_path: Path) -> None:
    info = read_gguf(write_gguf(tmp_path / "m.gguf", head_count_kv=[1, 0], key_length=32),
                     read_arrays=False)
    assert info.n_head_kv_per_layer() == [1, 0]  # short per-layer arrays are always read
    assert info.head_dim_k == info.head_dim_v == 32


def test_read_arrays_false_keeps_lengths_of_long_arrays(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "big.gguf", n_vocab=5000)
    info = read_gguf(path, read_arrays=False)
    tokens = info.metadata["tokenizer.ggml.tokens"]
    assert isinstance(tokens, SkippedArray) and len(tokens) == 5000
    assert isinstance(info.metadata["tokenizer.ggml.scores"], SkippedArray)
    assert info.metadata["test.strings"] == ["a", "bé", ""]
    assert info.vocab_size == 5000
    full = read_gguf(path)
    assert full.tensors == info.tensors and full.data_offset == info.data_offset


def test_ggml_type_table_matches_the_gguf_package() -> None:
    for ggml_type, (block, size) in gguf.constants.GGML_QUANT_SIZES.items():
        if ggml_type.name == "Q8_1":  # gguf-py still lists the old f32 scale layout
            continue
        assert GGML_TYPES[int(ggml_type)][1:] == (block, size), ggml_type.name
    assert tensor_nbytes(12, (256, 10)) == 1440  # Q4_K: 144 bytes per 256 weights
    assert tensor_nbytes(1000, (4,)) is None


def test_unknown_tensor_type_is_sized_from_the_layout(tmp_path: Path) -> None:
    path = raw_gguf(tmp_path / "odd.gguf", [("a", (4,), 0, 0), ("b", (8,), 200, 32)], data_len=96)
    info = read_gguf(path)
    sizes = {t.name: t.nbytes for t in info.tensors}
    assert sizes == {"a": 16, "b": 64}  # "b" runs from its offset to the end of the file
    assert info.tensors[1].type_name == "TYPE_200"


def test_synthetic_test_model_reads_like_the_gguf_package(tiny_model_path: Path) -> None:
    info = read_gguf(tiny_model_path)
    reference = gguf.GGUFReader(str(tiny_model_path))
    assert [t.nbytes for t in info.tensors] == [int(t.n_bytes) for t in reference.tensors]
    assert info.vocab_size == len(reference.fields["tokenizer.ggml.tokens"].data)


# ---- files that are not (complete) GGUF files ----------------------------------------------

def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="does not exist"):
        read_gguf(tmp_path / "absent.gguf")


def test_directory(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="is a directory"):
        read_gguf(tmp_path)


@pytest.mark.parametrize("content", [b"", b"GG", b"PK\x03\x04 this is a zip" * 10])
def test_not_a_gguf_file(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "x.gguf"
    path.write_bytes(content)
    with pytest.raises(ModelLoadError, match="empty|is not a GGUF file"):
        read_gguf(path)


def test_text_file_is_not_gguf(tmp_path: Path) -> None:
    path = tmp_path / "README.md"
    path.write_text("# hello\n" * 20)
    with pytest.raises(ModelLoadError, match=r"README\.md is not a GGUF file"):
        read_gguf(path)


@pytest.mark.parametrize("version", [1, 4, 0x03000000])
def test_unsupported_version(tmp_path: Path, model: Path, version: int) -> None:
    data = bytearray(model.read_bytes())
    data[4:8] = struct.pack("<I", version)
    path = tmp_path / "v.gguf"
    path.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match=f"version {version}"):
        read_gguf(path)


@pytest.mark.parametrize("keep", [10, 30, 200, 1000])
def test_truncated_header(tmp_path: Path, model: Path, keep: int) -> None:
    path = tmp_path / "cut.gguf"
    path.write_bytes(model.read_bytes()[:keep])
    with pytest.raises(ModelLoadError, match="is truncated.*download it again"):
        read_gguf(path)


def test_truncated_tensor_data(tmp_path: Path, model: Path) -> None:
    data = model.read_bytes()
    path = tmp_path / "partial.gguf"
    path.write_bytes(data[: len(data) - 100])
    with pytest.raises(ModelLoadError, match=r"is truncated: tensor .* download it again"):
        read_gguf(path)


def test_error_is_one_sentence(tmp_path: Path, model: Path) -> None:
    path = tmp_path / "partial.gguf"
    path.write_bytes(model.read_bytes()[:-1])
    with pytest.raises(ModelLoadError) as excinfo:
        read_gguf(path)
    message = str(excinfo.value)
    assert message.endswith(".") and "\n" not in message


# ---- metadata of the wrong type or shape: one sentence, never a traceback (hostile files)


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def metadata_gguf(path: Path, kvs: list[tuple[str, int, bytes]]) -> Path:
    """A GGUF v3 header with these (key, value type, value bytes) and no tensors."""
    body = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs))
    for key, vtype, value in kvs:
        body += _string(key) + struct.pack("<I", vtype) + value
    path.write_bytes(body)
    return path


STRING, UINT32, ARRAY = 8, 4, 9


def test_a_hyper_parameter_of_the_wrong_type_is_one_sentence(tmp_path: Path) -> None:
    path = metadata_gguf(tmp_path / "bad.gguf", [
        ("general.architecture", STRING, _string("llama")),
        ("llama.block_count", STRING, _string("twelve")),
    ])
    info = read_gguf(path)
    with pytest.raises(ModelLoadError, match="'llama.block_count' should be an integer, not str"):
        _ = info.n_layer


def test_alignment_of_the_wrong_type_is_refused(tmp_path: Path) -> None:
    for value in (_string("64"), struct.pack("<I", 3)):
        vtype = STRING if value[:1] != b"\x03" else UINT32
        path = metadata_gguf(tmp_path / "align.gguf", [("general.alignment", vtype, value)])
        with pytest.raises(ModelLoadError, match="general.alignment .* is not a power of two"):
            read_gguf(path)


def test_arrays_nested_thousands_deep_are_refused(tmp_path: Path) -> None:
    nested = b""
    for _ in range(5000):  # an array holding one array holding one array ...
        nested = struct.pack("<IQ", ARRAY, 1) + nested
    nested = nested[:-12] + struct.pack("<IQ", UINT32, 0)  # the innermost holds no values
    path = metadata_gguf(tmp_path / "deep.gguf", [("x.deep", ARRAY, nested)])
    with pytest.raises(ModelLoadError, match="nests arrays more than 4 deep"):
        read_gguf(path)


def test_plan_on_a_bad_file_exits_2_with_one_line(tmp_path: Path) -> None:
    from tests.fixtures.helpers import run_localspec

    path = metadata_gguf(tmp_path / "bad.gguf", [
        ("general.architecture", STRING, _string("llama")),
        ("llama.block_count", STRING, _string("twelve")),
    ])
    proc = run_localspec("plan", "--target", str(path), "--draft", "none")
    assert proc.returncode == 2, proc.stderr
    assert "should be an integer" in proc.stderr and "Traceback" not in proc.stderr
