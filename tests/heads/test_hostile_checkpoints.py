"""convert-head on malformed or malicious checkpoints: one sentence and exit code 2, nothing
read from outside the checkpoint folder, the user's files never overwritten."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from localspec.errors import InvalidParameterError
from localspec.heads.convert import convert_head, read_safetensors
from tests.fixtures.helpers import run_localspec as localspec
from tests.fixtures.hf_checkpoints import Eagle3Spec
from tests.heads.test_convert_head import checkpoint_for


@pytest.fixture
def checkpoint(tmp_path: Path, tiny_model_path: Path) -> Path:
    return checkpoint_for(tmp_path / "head", tiny_model_path, Eagle3Spec())


def safetensors_file(path: Path, header: object, data: bytes = b"", length: int | None = None
                     ) -> Path:
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text) if length is None else length) + text + data)
    return path


def edit_config(change: Callable[[dict], object]) -> Callable[[Path], None]:
    def apply(ckpt: Path) -> None:
        config = json.loads((ckpt / "config.json").read_text())
        (ckpt / "config.json").write_text(json.dumps(change(config)))
    return apply


def index_naming(part: str) -> Callable[[Path], None]:
    def apply(ckpt: Path) -> None:
        index = {"weight_map": {"fc.weight": part}}
        (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))
    return apply


CASES: list[tuple[str, Callable[[Path], None], str]] = [
    ("config a list", lambda c: (c / "config.json").write_text("[1, 2]"), "JSON object"),
    ("config not JSON", lambda c: (c / "config.json").write_text("{"), "not valid JSON"),
    ("hidden_size a string", edit_config(lambda c: {**c, "hidden_size": "big"}),
     "wrong type"),
    ("no hidden_size", edit_config(lambda c: {k: v for k, v in c.items()
                                              if k != "hidden_size"}), "'hidden_size' is missing"),
    ("layer config a string",
     edit_config(lambda c: {**c, "transformer_layer_config": "x"}), "must be an object"),
    ("index outside the folder", index_naming("../outside.safetensors"), "not a file in"),
    ("index naming /dev/zero", index_naming("/dev/zero"), "not a file in"),
    ("index not an object", lambda c: (c / "model.safetensors.index.json").write_text("[]"),
     "no weight_map"),
    ("header length past the end",
     lambda c: safetensors_file(c / "model.safetensors", {}, length=2**62), "runs past"),
    ("header not JSON", lambda c: (c / "model.safetensors").write_bytes(
        struct.pack("<Q", 3) + b"{{{"), "header is not JSON"),
    ("header a list", lambda c: safetensors_file(c / "model.safetensors", [1]),
     "not an object"),
    ("offsets past the end", lambda c: safetensors_file(
        c / "model.safetensors",
        {"fc.weight": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8),
     "do not hold its shape"),
    ("offsets that disagree with the shape", lambda c: safetensors_file(
        c / "model.safetensors",
        {"fc.weight": {"dtype": "F32", "shape": [1000000, 1000000], "data_offsets": [0, 8]}},
        b"\0" * 8), "do not hold its shape"),
    ("a malformed shape", lambda c: safetensors_file(
        c / "model.safetensors",
        {"fc.weight": {"dtype": "F32", "shape": "big", "data_offsets": [0, 8]}}, b"\0" * 8),
     "malformed shape"),
    ("an unknown dtype", lambda c: safetensors_file(
        c / "model.safetensors", {"fc.weight": {"dtype": "F99", "shape": [1],
                                                "data_offsets": [0, 4]}}, b"\0" * 4),
     "cannot read"),
]


@pytest.mark.parametrize(("name", "corrupt", "fragment"), CASES, ids=[c[0] for c in CASES])
def test_a_malformed_checkpoint_is_one_sentence(checkpoint: Path, tiny_model_path: Path,
                                                tmp_path: Path, name: str,
                                                corrupt: Callable[[Path], None],
                                                fragment: str) -> None:
    (tmp_path / "outside.safetensors").write_bytes(b"\0" * 64)
    corrupt(checkpoint)
    with pytest.raises(InvalidParameterError, match=fragment):
        convert_head(checkpoint, tiny_model_path, tmp_path / "out.gguf")


def test_the_cli_says_it_in_one_line(checkpoint: Path, tiny_model_path: Path,
                                     tmp_path: Path) -> None:
    index_naming("/dev/zero")(checkpoint)
    proc = localspec("convert-head", str(checkpoint), "--target", str(tiny_model_path),
                     "-o", str(tmp_path / "out.gguf"))
    assert proc.returncode == 2 and "not a file in" in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    proc = localspec("convert-head", str(checkpoint), "--target", str(tiny_model_path),
                     "-o", str(tmp_path))
    assert proc.returncode == 2 and "a directory" in proc.stderr


def test_a_good_part_still_reads(checkpoint: Path) -> None:
    names = [name for name, _, _ in read_safetensors(checkpoint / "model.safetensors")]
    assert "fc.weight" in names or "midlayer.input_layernorm.weight" in names
