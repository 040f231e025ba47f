"""Public value types of the Python API: parameters in, chunks and results out.

Vocabulary (docs/design.md, "The speculative step"): a *drafted* token was proposed by the
drafter; an *accepted* one passed verification; a *rejected* one did not. Every emitted token is
either an accepted draft token (provenance ``"draft"``) or a token the target produced itself: a
*correction* after a rejection or a *bonus* after a fully accepted draft (provenance
``"target"``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Union

Provenance = Literal["draft", "target"]
FinishReason = Literal["stop", "length", "cancelled"]
DraftMax = Union[int, Literal["auto"]]  # noqa: UP007 - a runtime alias on Python 3.10


@dataclass(frozen=True)
class GenerationParams:
    """How to generate. Defaults follow llama.cpp's; ``temperature=0`` is greedy."""

    max_tokens: int = 256
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    seed: int | None = None  # None: a fresh random seed per request
    stop: tuple[str, ...] = ()
    draft_max: DraftMax = "auto"  # longest draft per step ("auto": the controller picks); 0: none
    speculative: bool = True  # False: plain target-only decoding
    ignore_eos: bool = False  # benchmarks generate a fixed number of tokens
    reuse_cache: bool = True  # reuse the KV of a prefix shared with the previous request
    # Penalties (llama.cpp's): over the last penalty_last_n tokens (prompt included; -1: the
    # whole context; 0: off), a token seen c times has its logit divided by repeat_penalty
    # (multiplied if <= 0), then lowered by c * frequency_penalty + presence_penalty.
    repeat_penalty: float = 1.0  # 1: off
    frequency_penalty: float = 0.0  # 0: off
    presence_penalty: float = 0.0  # 0: off
    penalty_last_n: int = 64
    # The output follows this GBNF grammar (root rule "root"); None: unconstrained.
    # localspec.grammar.json_schema_to_gbnf turns a JSON Schema into one.
    grammar: str | None = None
    # Report each token's log probability (and the top_logprobs most likely alternatives).
    logprobs: bool = False
    top_logprobs: int = 0

    def validate(self) -> None:
        """Raise InvalidParameterError with one sentence naming the bad value."""
        from localspec.errors import InvalidParameterError

        def bad(name: str, value: object, rule: str) -> InvalidParameterError:
            return InvalidParameterError(f"{name}={value!r} is invalid: {rule}.")

        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise bad("max_tokens", self.max_tokens, "it must be an integer >= 1")
        if not 0.0 <= self.temperature <= 100.0:
            raise bad("temperature", self.temperature, "it must be between 0 and 100")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise bad("top_k", self.top_k, "it must be an integer >= 0 (0 disables it)")
        if not 0.0 < self.top_p <= 1.0:
            raise bad("top_p", self.top_p, "it must be in (0, 1]")
        if not 0.0 <= self.min_p <= 1.0:
            raise bad("min_p", self.min_p, "it must be in [0, 1]")
        if self.seed is not None and not 0 <= self.seed < 2**64:
            raise bad("seed", self.seed, "it must be an integer in [0, 2^64)")
        if self.draft_max != "auto" and (
            not isinstance(self.draft_max, int) or not 0 <= self.draft_max <= 64
        ):
            raise bad("draft_max", self.draft_max, "it must be 'auto' or an integer in [0, 64]")
        if any(not isinstance(s, str) or s == "" for s in self.stop):
            raise bad("stop", self.stop, "stop strings must be non-empty strings")
        self._validate_shaping(bad)

    def _validate_shaping(self, bad: Callable[[str, object, str], Exception]) -> None:
        if not 0.0 < self.repeat_penalty <= 10.0:
            raise bad("repeat_penalty", self.repeat_penalty, "it must be in (0, 10] (1: off)")
        for name in ("frequency_penalty", "presence_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise bad(name, getattr(self, name), "it must be between -2 and 2 (0 disables it)")
        if not isinstance(self.penalty_last_n, int) or self.penalty_last_n < -1:
            raise bad(
                "penalty_last_n", self.penalty_last_n,
                "it must be an integer >= -1 (-1: the whole context, 0: off)",
            )
        if self.grammar is not None and not self.grammar.strip():
            raise bad("grammar", self.grammar, "it must be a non-empty GBNF grammar or None")
        if not isinstance(self.top_logprobs, int) or not 0 <= self.top_logprobs <= 20:
            raise bad("top_logprobs", self.top_logprobs, "it must be an integer in [0, 20]")


@dataclass
class GenerationStats:
    """Statistics of one generation (definitions: docs/design.md, "The speculative step" and
    "Benchmarks")."""

    prompt_tokens: int = 0
    n_tokens: int = 0  # emitted (generated) tokens
    drafted: int = 0
    accepted: int = 0
    rejected: int = 0
    target_passes: int = 0  # target verification passes during generation
    acceptance_rate: float = 0.0  # accepted / drafted
    mean_accepted_length: float = 0.0  # tokens emitted per target pass (1.0 = plain)
    accepted_length_histogram: list[int] = field(
        default_factory=list
    )  # [n] = steps that accepted n
    drafted_by_position: list[int] = field(default_factory=list)
    accepted_by_position: list[int] = field(default_factory=list)
    prefill_seconds: float = 0.0
    draft_seconds: float = 0.0
    model_drafted: int = 0  # drafted tokens that ran a model (draft model or head), not a lookup
    model_draft_seconds: float = 0.0  # their drafting seconds
    verify_seconds: float = 0.0
    other_seconds: float = 0.0
    generation_seconds: float = 0.0  # excludes prefill
    time_to_first_token: float = 0.0
    tokens_per_second: float = 0.0  # n_tokens / generation_seconds
    prefill_tokens_per_second: float = 0.0
    draft_max: int = 0  # draft length used by the last step

    @property
    def acceptance_by_position(self) -> list[float]:
        pairs = zip(self.accepted_by_position, self.drafted_by_position, strict=True)
        return [a / d if d else 0.0 for a, d in pairs]

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["acceptance_by_position"] = self.acceptance_by_position
        return out


@dataclass(frozen=True)
class TokenLogprob:
    """A token's log probability under the target's raw distribution (before penalties, a
    grammar and sampling settings), with the most likely alternatives there, best first."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass
class Chunk:
    """Tokens emitted by one speculative step (at least one token)."""

    text: str  # may be "" while a UTF-8 sequence or a possible stop string is held back
    tokens: list[int]
    provenance: list[Provenance]
    stats: GenerationStats  # running totals after this step
    logprobs: list[TokenLogprob] | None = None  # one per token when params.logprobs


@dataclass
class GenerationResult:
    text: str
    tokens: list[int]
    provenance: list[Provenance]
    finish_reason: FinishReason
    stats: GenerationStats
    # Per target pass: rows verified (k + 1) and tokens emitted (accepted + 1).
    pass_rows: list[int] = field(default_factory=list)
    pass_emitted: list[int] = field(default_factory=list)
    # Tokens whose text is in ``text`` (OpenAI's completion_tokens): ``len(tokens)`` unless a
    # stop string cut the tail of the last step; None: not counted (then all of them).
    text_tokens: int | None = None
    logprobs: list[TokenLogprob] | None = None  # one per token when params.logprobs

    @property
    def completion_tokens(self) -> int:
        return len(self.tokens) if self.text_tokens is None else self.text_tokens

    def to_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "tokens": self.tokens,
            "provenance": self.provenance,
            "finish_reason": self.finish_reason,
            "stats": self.stats.to_dict(),
        }


@dataclass(frozen=True)
class EngineInfo:
    """What an engine has loaded."""

    target_path: str
    drafter: str  # "ngram", "none" or the draft GGUF's path
    n_ctx: int
    n_vocab: int
    target_name: str
    chat_template: str | None
    bos_text: str
    eos_text: str
    # Which head computes the target's logits (verification and plain decoding alike):
    # "localspec-q8_0", "localspec-q6_k" or "llama.cpp".
    verify_head: str = "llama.cpp"
    # The same for a draft model's logits; "" for drafters without a model (n-gram, none).
    draft_head: str = ""
    # How the target remembers a sequence: "attention", "recurrent" or "hybrid" (the last two
    # cannot take back draft tokens: their n-gram drafter is turned off).
    memory: str = "attention"
    # Something the user should know about what was loaded ("" when nothing), e.g. why
    # speculation is off.
    notice: str = ""
