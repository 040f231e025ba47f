"""--kv-type reaches llama.cpp: the KV cache of both models takes the asked-for type."""

from __future__ import annotations

from pathlib import Path

import pytest

from localspec.errors import InvalidParameterError, ModelLoadError
from localspec.runtime.engine import Engine


def test_another_kv_type_generates(tiny_pair: tuple[Path, Path]) -> None:
    target, draft = tiny_pair
    with Engine.load(target, draft=draft, n_ctx=256, n_threads=1, kv_type="bf16") as engine:
        result = engine.generate("the quick brown fox", max_tokens=12, temperature=0)
    assert engine.options.kv_type == "bf16" and len(result.tokens) == 12


def test_llama_cpp_checks_the_type_against_the_model(tiny_model_path: Path) -> None:
    # The tiny model's attention heads have 16 values: too few for q8_0's blocks of 32. That
    # this is refused shows the type reached llama.cpp.
    with pytest.raises(ModelLoadError, match="K cache type q8_0"):
        Engine.load(tiny_model_path, draft="none", n_ctx=256, n_threads=1, kv_type="q8_0")


def test_an_unknown_kv_type_is_refused_before_loading(tiny_model_path: Path) -> None:
    with pytest.raises(InvalidParameterError, match="kv_type='q3' is invalid: use one of"):
        Engine.load(tiny_model_path, draft="none", kv_type="q3")
