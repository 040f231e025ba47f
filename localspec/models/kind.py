"""Base or instruct: whether a model continues text or follows instructions, and what to pull
for an instruct model when it is a base one.

models.toml says so for the models it names (``kind``, ``instruct``); for other files the
GGUF's chat template is the hint (a model without one is most likely a base model).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["base", "instruct", "unknown"]


@dataclass(frozen=True)
class ModelKind:
    kind: Kind = "unknown"
    instruct: str = ""  # for a base model: the pair (or model) to pull for an instruct one
    guessed: bool = False  # from the GGUF's chat template, not from models.toml

    def with_template_hint(self, has_chat_template: bool) -> ModelKind:
        """The kind, guessed from the GGUF's chat template when models.toml does not say."""
        if self.kind != "unknown":
            return self
        return ModelKind("instruct" if has_chat_template else "base", guessed=True)

    @property
    def label(self) -> str:
        """``base model`` or ``instruct model``, saying what it is guessed from when models.toml
        does not say; "" when unknown."""
        if self.kind == "unknown":
            return ""
        if not self.guessed:
            return f"{self.kind} model"
        return ("instruct model, by its chat template" if self.kind == "instruct"
                else "base model, no chat template")

    def advice(self) -> str:
        """For a base model: what it does and what to pull instead (to follow "X is "); else ""."""
        if self.kind != "base":
            return ""
        what = ("probably a base model (no chat template in the GGUF)" if self.guessed
                else "a base model")
        if self.instruct:
            instead = (f"for an instruct one, run `localspec pull {self.instruct}` and use the "
                       f"pair {self.instruct}")
        else:
            instead = "for chat, pick an instruct model (`localspec models` lists some)"
        return f"{what}: it continues text rather than following instructions; {instead}"
