"""Every file a user names goes through one opener (localspec.files): a FIFO, a directory or a
device is refused at once with one sentence (a FIFO used to block `run --grammar` forever),
and an output never overwrites an input (convert-head -o naming the target overwrote the
user's model)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from localspec.errors import InvalidParameterError
from localspec.files import check_output_path, read_input_text
from tests.fixtures.helpers import run_localspec as localspec


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "pipe"
    os.mkfifo(path)
    return path


def test_a_fifo_is_refused_not_waited_on(fifo: Path) -> None:
    with pytest.raises(InvalidParameterError, match="not a regular file \\(a FIFO\\)"):
        read_input_text(fifo, "--grammar")


@pytest.mark.parametrize(("make", "fragment"), [
    (lambda p: p.mkdir(), "a directory"),
    (lambda p: None, "No such file"),
    (lambda p: p.write_bytes(b"\xff\xfe"), "not UTF-8"),
])
def test_other_bad_inputs(tmp_path: Path, make, fragment: str) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "input"
    make(path)
    with pytest.raises(InvalidParameterError, match=fragment):
        read_input_text(path, "--json-schema")
    with pytest.raises(InvalidParameterError, match="not a regular file"):
        read_input_text("/dev/null", "--grammar")


def test_a_large_input_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "big"
    path.write_text("x" * 1000)
    assert read_input_text(path, "--grammar", limit=1000) == "x" * 1000
    with pytest.raises(InvalidParameterError, match="more than 999"):
        read_input_text(path, "--grammar", limit=999)


def test_outputs(tmp_path: Path, fifo: Path) -> None:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    link = tmp_path / "link.gguf"
    link.symlink_to(model)
    assert check_output_path(tmp_path / "new.gguf", "-o", [model]) == tmp_path / "new.gguf"
    for out, fragment in [(model, "is the input"), (link, "is the input"),
                          (tmp_path, "a directory"), (fifo, "a FIFO"),
                          (tmp_path / "no" / "x.gguf", "does not exist")]:
        with pytest.raises(InvalidParameterError, match=fragment):
            check_output_path(out, "-o", [model])


def test_run_refuses_a_fifo_grammar_at_once(tiny_model_path: Path, fifo: Path) -> None:
    proc = localspec("run", "hi", "--target", str(tiny_model_path), "--grammar", str(fifo),
                     timeout=120)
    assert proc.returncode == 2 and "FIFO" in proc.stderr and "Traceback" not in proc.stderr


def test_convert_head_never_overwrites_the_target(tiny_model_path: Path, tmp_path: Path) -> None:
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")
    before = tiny_model_path.read_bytes()
    proc = localspec("convert-head", str(checkpoint), "--target", str(tiny_model_path),
                     "-o", str(tiny_model_path))
    assert proc.returncode == 2 and "is the input" in proc.stderr, proc.stderr
    assert tiny_model_path.read_bytes() == before
