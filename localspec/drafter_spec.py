"""The drafter a user asks for, as a typed value: the one place its spelling is parsed.

Spellings (``--draft``, models.toml's ``drafter``, ``Engine.load(draft=...)``):

- ``none``: no drafter (plain decoding);
- ``ngram``: prompt lookup over the prompt and the generated tokens (no extra model);
- ``PATH``: a draft model (a GGUF file, or before resolution a models.toml name or source), or
  an EAGLE-3 head alone;
- ``hybrid:PATH``: n-gram when the context has a match, else the draft model at PATH;
- ``eagle3:PATH``: n-gram when the context has a match, else the EAGLE-3 head at PATH (the same
  as ``hybrid:`` with a head);
- ``mtp``: n-gram when the context has a match, else the target's own MTP (NextN) layers;
- ``auto`` (the default): ``mtp`` when the target carries MTP layers localspec can run, else
  ``ngram`` (resolved when loading: localspec.runtime.loading.resolve_auto).

A new kind is one more entry: a keyword in ``KEYWORD_KINDS`` or a prefix in ``PREFIX_KINDS``,
its translation into the core's drafter kind (localspec.runtime.loading.core_drafter, which
also decides whether a model path is a draft model or an EAGLE-3 head) and the matching case of
the core's drafter factory (csrc/engine/engine.cpp, parse_drafter, which only checks).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from localspec.errors import InvalidParameterError

DrafterKind = Literal["none", "ngram", "model", "hybrid", "eagle3", "mtp", "auto"]
KEYWORD_KINDS: tuple[DrafterKind, ...] = ("none", "ngram", "mtp", "auto")  # kinds without a file
PREFIX_KINDS: tuple[DrafterKind, ...] = ("hybrid", "eagle3")  # kinds spelled "KIND:PATH"


@dataclass(frozen=True)
class DrafterSpec:
    """What drafts: ``kind``, and for kinds with a model file its ``path``."""

    kind: DrafterKind = "ngram"
    path: str | None = None

    def __post_init__(self) -> None:
        if (self.kind in KEYWORD_KINDS) != (self.path is None) or self.path == "":
            raise InvalidParameterError(
                f"A {self.kind} drafter {'takes no' if self.path else 'needs a'} model path."
            )

    @classmethod
    def parse(cls, text: str | DrafterSpec) -> DrafterSpec:
        """``"none"``, ``"ngram"``, ``"mtp"``, ``"auto"`` (any case), ``"KIND:PATH"`` or a model
        ``PATH``."""
        if isinstance(text, DrafterSpec):
            return text
        text = str(text)
        if text.strip().lower() in KEYWORD_KINDS:
            return cls(text.strip().lower())  # type: ignore[arg-type]
        for kind in PREFIX_KINDS:
            if text.startswith(kind + ":"):
                path = text[len(kind) + 1 :]
                if not path:
                    raise InvalidParameterError(
                        f"The drafter {text!r} names no model: write {kind}:PATH."
                    )
                return cls(kind, path)
        if not text:
            raise InvalidParameterError(
                "The drafter is empty: use 'auto', 'ngram', 'mtp', 'none', a draft model or "
                "hybrid:MODEL."
            )
        return cls("model", text)

    def __str__(self) -> str:
        """The spelling ``parse`` reads back (and the C++ core's drafter string)."""
        if self.path is None:
            return self.kind
        return self.path if self.kind == "model" else f"{self.kind}:{self.path}"

    @property
    def uses_model(self) -> bool:
        """Whether drafting runs a model (a draft model file, a head, the target's MTP layers)."""
        return self.path is not None or self.kind == "mtp"

    @property
    def drafts(self) -> bool:
        return self.kind != "none"

    def with_path(self, resolve: Callable[[str], str]) -> DrafterSpec:
        """The same kind with its model path mapped by ``resolve`` (a name to a local file)."""
        return self if self.path is None else DrafterSpec(self.kind, resolve(self.path))


AUTO = DrafterSpec("auto")
NGRAM = DrafterSpec("ngram")
MTP = DrafterSpec("mtp")
NO_DRAFTER = DrafterSpec("none")
