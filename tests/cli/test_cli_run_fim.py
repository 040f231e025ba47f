"""`localspec run --fim-prefix/--fim-suffix/--fim-extra`: fill in the middle from files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localspec.runtime.engine import Engine
from localspec.testing.synthetic import TinyConfig, write_model
from localspec.text.fim import ExtraChunk, FimInput, model_fim_prompt
from tests.cli.test_cli_run import expect_user_error
from tests.fixtures.helpers import run_localspec as localspec


@pytest.fixture(scope="module")
def fim_model(model_dir: Path) -> Path:
    return write_model(model_dir / "tiny-fim-cli.gguf", TinyConfig(fim=True), name="tiny-fim")


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    texts = {"prefix": "def main():\n    the quick", "suffix": "\n    return 42\n",
             "extra": "the cat sat on the mat"}
    out = {}
    for name, text in texts.items():
        out[name] = tmp_path / f"{name}.py"
        out[name].write_text(text)
    return out


def test_fim_files_complete_the_middle_with_the_fim_prompt(
        fim_model: Path, files: dict[str, Path]) -> None:
    proc = localspec("run", " brown", "--target", str(fim_model), "--draft", "ngram",
                     "--threads", "1", "--temperature", "0", "--max-tokens", "12", "--json",
                     "--fim-prefix", str(files["prefix"]), "--fim-suffix", str(files["suffix"]),
                     "--fim-extra", str(files["extra"]))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    fill = FimInput(files["prefix"].read_text(), files["suffix"].read_text(), " brown",
                    (ExtraChunk(str(files["extra"]), files["extra"].read_text()),))
    with Engine.load(fim_model, draft="none", n_ctx=4096, n_threads=1) as engine:
        tokens = model_fim_prompt(engine, fill, 12).tokens
        assert engine.token_text(tokens[-1]) == "<|fim_middle|>"
        expected = engine.generate(tokens, temperature=0, max_tokens=12, speculative=False)
    assert out["tokens"] == expected.tokens and out["text"] == expected.text


def test_fim_mistakes_are_user_errors(fim_model: Path, tiny_model_path: Path,
                                      files: dict[str, Path], tmp_path: Path) -> None:
    target = ["--target", str(fim_model)]
    expect_user_error(localspec("run", *target), "Give a PROMPT")
    expect_user_error(localspec("run", "x", *target, "--fim-extra", str(files["extra"])),
                      "--fim-extra")
    expect_user_error(localspec("run", *target, "--chat", "--fim-prefix", str(files["prefix"])),
                      "--chat")
    expect_user_error(localspec("run", *target, "--fim-prefix", str(tmp_path / "absent.py")),
                      "--fim-prefix", "cannot read it")
    expect_user_error(localspec("run", "--target", str(tiny_model_path), "--fim-suffix",
                                str(files["suffix"])), "fill-in-the-middle tokens")
