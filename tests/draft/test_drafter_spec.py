"""The drafter spelling is parsed in one place (DrafterSpec) and read back the same way."""

from __future__ import annotations

import pytest

from localspec import _core
from localspec.drafter_spec import DrafterSpec
from localspec.errors import InvalidParameterError
from localspec.runtime.convert import AUTO_DRAFT_MAX
from localspec.runtime.loading import LoadOptions
from localspec.types import GenerationParams, parse_draft_max


@pytest.mark.parametrize("text,kind,path", [
    ("ngram", "ngram", None),
    ("NGRAM", "ngram", None),
    (" none ", "none", None),
    ("models/draft.gguf", "model", "models/draft.gguf"),
    ("hybrid:models/draft.gguf", "hybrid", "models/draft.gguf"),
    ("eagle3:heads/h.gguf", "eagle3", "heads/h.gguf"),
    ("qwen2.5-0.5b", "model", "qwen2.5-0.5b"),
])
def test_parse_and_spell(text: str, kind: str, path: str | None) -> None:
    spec = DrafterSpec.parse(text)
    assert (spec.kind, spec.path) == (kind, path)
    assert DrafterSpec.parse(str(spec)) == spec
    assert spec.uses_model == (path is not None)


def test_mtp_and_auto_are_keywords() -> None:
    """mtp runs the target's own MTP layers (a model, without a file); auto is resolved when
    loading (localspec.runtime.loading.resolved_drafter)."""
    mtp, auto = DrafterSpec.parse(" MTP "), DrafterSpec.parse("auto")
    assert (mtp.kind, mtp.path, str(mtp), mtp.uses_model) == ("mtp", None, "mtp", True)
    assert (auto.kind, auto.path, str(auto), auto.uses_model) == ("auto", None, "auto", False)
    assert auto.drafts and mtp.drafts


@pytest.mark.parametrize("text", ["", "hybrid:"])
def test_parse_refuses_empty_models(text: str) -> None:
    with pytest.raises(InvalidParameterError, match="drafter"):
        DrafterSpec.parse(text)


def test_kind_and_path_agree() -> None:
    with pytest.raises(InvalidParameterError, match="needs a model path"):
        DrafterSpec("hybrid")
    with pytest.raises(InvalidParameterError, match="takes no model path"):
        DrafterSpec("ngram", "x.gguf")


def test_with_path_maps_only_the_model() -> None:
    assert DrafterSpec.parse("ngram").with_path(str.upper) == DrafterSpec("ngram")
    assert str(DrafterSpec.parse("hybrid:d").with_path(str.upper)) == "hybrid:D"


def test_load_options_take_a_spelling_or_a_spec() -> None:
    assert LoadOptions("t.gguf", draft="hybrid:d.gguf").draft == DrafterSpec("hybrid", "d.gguf")  # type: ignore[arg-type]
    assert LoadOptions("t.gguf").draft == DrafterSpec("auto")  # mtp where the target has it
    with pytest.raises(InvalidParameterError, match="n_ctx=8 is invalid"):
        LoadOptions("t.gguf", n_ctx=8).validate()


def test_draft_max_has_one_rule() -> None:
    assert parse_draft_max(" Auto ") == "auto" and parse_draft_max("7") == 7
    for text in ("65", "-1", "lots"):
        with pytest.raises(InvalidParameterError, match="draft length"):
            parse_draft_max(text)
    with pytest.raises(InvalidParameterError, match="between 0 and 64"):
        GenerationParams(draft_max=65).validate()


def test_auto_draft_length_comes_from_the_core() -> None:
    assert AUTO_DRAFT_MAX == _core.AUTO_DRAFT_MAX == _core.EngineOptions().controller_k_max
