"""The user's live generation settings and the slash commands that change them."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from localspec.text.grammar import JSON_OBJECT_GBNF
from localspec.types import DraftMax, GenerationParams, generation_rule_violation
from localspec.types import parse_draft_max as parse_draft_max  # "auto" or 0-64, for /k

DRAFT_CYCLE: tuple[DraftMax, ...] = ("auto", 1, 2, 3, 4, 5, 6, 8)  # F3; /k takes any 0-64
DRAFT_CYCLE_TEXT = ", ".join(str(k) for k in DRAFT_CYCLE)  # the help and the README say this
TEMPERATURE_CYCLE: tuple[float, ...] = (0.0, 0.2, 0.5, 0.8, 1.0)


@dataclass
class ChatSettings:
    """What the next reply is generated with; every field can change between replies."""

    speculative: bool = True
    draft_max: DraftMax = GenerationParams.draft_max
    temperature: float = GenerationParams.temperature
    max_tokens: int = 512
    seed: int | None = None
    system_prompt: str | None = None
    json_mode: bool = False  # /json: replies constrained to one JSON object
    base: GenerationParams = field(default_factory=GenerationParams)  # top-k, top-p, min-p, ...

    def params(self) -> GenerationParams:
        """Generation parameters for the next reply (``base`` supplies the other fields)."""
        params = replace(
            self.base,
            speculative=self.speculative,
            draft_max=self.draft_max,
            temperature=self.temperature,
            max_tokens=self.max_tokens,
            seed=self.seed,
        )
        if self.json_mode:
            params = replace(params, grammar=JSON_OBJECT_GBNF)
        params.validate()
        return params

    def next_draft_max(self) -> DraftMax:
        return _next_in(DRAFT_CYCLE, self.draft_max)

    def next_temperature(self) -> float:
        return float(_next_in(TEMPERATURE_CYCLE, self.temperature))

    def draft_label(self) -> str:
        return "auto" if self.draft_max == "auto" else str(self.draft_max)


def _next_in(cycle: tuple[DraftMax, ...] | tuple[float, ...], value: object) -> DraftMax:
    values = list(cycle)
    if value in values:
        return values[(values.index(value) + 1) % len(values)]  # type: ignore[return-value]
    return values[0]  # type: ignore[return-value]


def parse_temperature(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"temperature must be a number, not {text!r}") from None
    rule = generation_rule_violation("temperature", value)
    if rule is not None:
        raise ValueError(f"temperature {value:g} is invalid: {rule}")
    return value
