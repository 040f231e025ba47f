"""One owner per load default: LoadOptions sets every field of the core's EngineOptions except
the few the core owns (localspec.runtime.loading.CORE_OWNED_OPTIONS), so no C++ initializer is a
second default that a user could meet."""

from __future__ import annotations

from typing import Any

import pytest

from localspec import _core
from localspec.drafter_spec import NGRAM
from localspec.errors import InvalidParameterError
from localspec.runtime import loading
from localspec.runtime.loading import CORE_OWNED_OPTIONS, LoadOptions


def engine_option_fields() -> set[str]:
    """The fields the binding gives EngineOptions (its read-write properties)."""
    return {name for name, value in vars(_core.EngineOptions).items()
            if isinstance(value, property) and not name.startswith("_")}


class Recorder:
    """Stands in for _core.EngineOptions and records which fields were set."""

    def __init__(self) -> None:
        object.__setattr__(self, "set_fields", set())

    def __setattr__(self, name: str, value: Any) -> None:
        self.set_fields.add(name)


def test_load_options_set_every_field_the_core_does_not_own(
        monkeypatch: pytest.MonkeyPatch) -> None:
    fields = engine_option_fields()
    assert "draft_p_min" in fields and "n_seq" in fields  # the introspection sees the fields
    assert CORE_OWNED_OPTIONS <= fields
    monkeypatch.setattr(loading._core, "EngineOptions", Recorder)
    recorded = loading.engine_options(LoadOptions(target="target.gguf", draft=NGRAM))
    assert isinstance(recorded, Recorder)
    assert sorted(fields - CORE_OWNED_OPTIONS - recorded.set_fields) == []
    assert sorted(recorded.set_fields & CORE_OWNED_OPTIONS) == []


def test_the_values_are_load_options(monkeypatch: pytest.MonkeyPatch) -> None:
    options = LoadOptions(target="t.gguf", draft=NGRAM, draft_p_min=0.25, parallel=3,
                          n_gpu_layers=7, draft_vocab=32768)
    core_options = loading.engine_options(options)
    assert (core_options.draft_p_min, core_options.n_seq) == (0.25, 3)
    assert core_options.draft_vocab == 32768
    assert core_options.n_gpu_layers_draft == 7  # None: the target's
    assert (core_options.drafter_kind, core_options.drafter_path) == ("ngram", "")


@pytest.mark.parametrize("value", [-1, 1, 255, True, 1.5, 1 << 25])
def test_a_draft_vocabulary_out_of_range_is_one_sentence(value: object) -> None:
    with pytest.raises(InvalidParameterError, match="draft_vocab"):
        LoadOptions(target="t.gguf", draft=NGRAM, draft_vocab=value).validate()  # type: ignore[arg-type]  # noqa: E501
