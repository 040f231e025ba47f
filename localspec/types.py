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

from localspec.drafter_spec import DrafterSpec

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
    # localspec.text.grammar.json_schema_to_gbnf turns a JSON Schema into one.
    grammar: str | None = None
    # Report each token's log probability (and the top_logprobs most likely alternatives).
    logprobs: bool = False
    top_logprobs: int = 0
    # Require exact mode (docs/exact.md: speculative output bit-identical to plain decoding).
    # The mode is chosen when the engine loads; an engine loaded without it refuses the request.
    exact: bool = False
    # Predicted Outputs: the caller's own draft of the output (the file before an edit), as text
    # or token ids. The prediction drafter proposes from it; the output is the target's
    # whatever it says. Ignored when nothing drafts (speculative=False, draft_max=0, the
    # drafter "none").
    prediction: str | tuple[int, ...] | None = None

    def validate(self) -> None:
        """Raise InvalidParameterError with one sentence naming the bad value."""
        for name in _GENERATION_RULES:
            value = getattr(self, name)
            rule = generation_rule_violation(name, value)
            if rule is not None:
                raise _invalid(name, value, rule)


def _invalid(name: str, value: object, rule: str) -> Exception:
    from localspec.errors import InvalidParameterError

    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return InvalidParameterError(f"{name}={shown} is invalid: {rule}.")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_draft_max(value: object) -> bool:
    return value == "auto" or (_is_int(value) and 0 <= value <= DRAFT_MAX_LIMIT)  # type: ignore[operator]


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


DRAFT_MAX_LIMIT = 64  # the longest fixed draft a request may ask for
INT32_MAX = 2**31 - 1  # the core's int fields (max_tokens, top_k, penalty_last_n) hold no more
# GenerationParams' rules, the only place they are written: field -> (check, rule when it fails).
_GENERATION_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "max_tokens": (lambda v: _is_int(v) and 1 <= v <= INT32_MAX,
                   f"it must be an integer between 1 and {INT32_MAX}"),
    "temperature": (lambda v: _is_number(v) and 0.0 <= v <= 100.0,
                    "it must be between 0 and 100"),
    "top_k": (lambda v: _is_int(v) and 0 <= v <= INT32_MAX,
              f"it must be an integer between 0 and {INT32_MAX} (0 disables it)"),
    "top_p": (lambda v: _is_number(v) and 0.0 < v <= 1.0, "it must be in (0, 1]"),
    "min_p": (lambda v: _is_number(v) and 0.0 <= v <= 1.0, "it must be in [0, 1]"),
    "seed": (lambda v: v is None or (_is_int(v) and 0 <= v < 2**64),
             "it must be an integer in [0, 2^64)"),
    "draft_max": (_is_draft_max,
                  f"it must be 'auto' or an integer between 0 and {DRAFT_MAX_LIMIT}"),
    "stop": (lambda v: all(isinstance(s, str) and s != "" for s in v),
             "stop strings must be non-empty strings"),
    "repeat_penalty": (lambda v: _is_number(v) and 0.0 < v <= 10.0,
                       "it must be in (0, 10] (1: off)"),
    "frequency_penalty": (lambda v: _is_number(v) and -2.0 <= v <= 2.0,
                          "it must be between -2 and 2 (0 disables it)"),
    "presence_penalty": (lambda v: _is_number(v) and -2.0 <= v <= 2.0,
                         "it must be between -2 and 2 (0 disables it)"),
    "exact": (lambda v: isinstance(v, bool), "it must be true or false"),
    "penalty_last_n": (lambda v: _is_int(v) and -1 <= v <= INT32_MAX,
                       f"it must be an integer between -1 and {INT32_MAX} (-1: the whole "
                       "context, 0: off)"),
    "grammar": (lambda v: v is None or (isinstance(v, str) and v.strip() != ""),
                "it must be a non-empty GBNF grammar or None"),
    "top_logprobs": (lambda v: _is_int(v) and 0 <= v <= 20, "it must be an integer in [0, 20]"),
    "prediction": (lambda v: v is None or isinstance(v, str)
                   or (isinstance(v, tuple) and all(_is_int(t) and 0 <= t <= INT32_MAX for t in v)),
                   "it must be text, a tuple of token ids or None"),
}


def generation_rule_violation(name: str, value: object) -> str | None:
    """The rule ``value`` breaks as GenerationParams' field ``name``, or None when it is valid
    (models.toml and the chat settings check single fields with it)."""
    check, rule = _GENERATION_RULES[name]
    return None if check(value) else rule


def parse_draft_max(text: str) -> DraftMax:
    """``"auto"`` or an integer in [0, 64], from text (command line, chat commands); raises
    InvalidParameterError with one sentence."""
    from localspec.errors import InvalidParameterError

    text = text.strip().lower()
    if text == "auto":
        return "auto"
    try:
        value: DraftMax = int(text)
    except ValueError:
        raise InvalidParameterError(
            f"The draft length must be 'auto' or an integer, not {text!r}."
        ) from None
    rule = generation_rule_violation("draft_max", value)
    if rule is not None:
        raise InvalidParameterError(f"The draft length {value} is invalid: {rule}.")
    return value


def mean_accepted_length(accepted: int, target_passes: int) -> float:
    """tau, the one definition: tokens each target pass yields, its accepted drafts plus the
    one token the target samples itself, so (accepted + passes) / passes; exactly 1.0 for plain
    decoding (0.0 before the first pass). The yielded tokens include the end-of-generation token
    that ends a generation and tokens past max_tokens, which are not emitted, so tau is not
    n_tokens / passes (that is below 1.0 for a plain answer that ends itself)."""
    return (accepted + target_passes) / target_passes if target_passes else 0.0


@dataclass
class GenerationStats:
    """Statistics of one generation (definitions: docs/design.md, "The speculative step" and
    "Benchmarks")."""

    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # of those, reused from the slot's cache (not prefilled)
    n_tokens: int = 0  # emitted (generated) tokens
    drafted: int = 0
    accepted: int = 0
    rejected: int = 0
    # Target verification passes during generation: every pass counts, the one whose token was
    # the end-of-generation token (not emitted) included, so n_tokens <= accepted + passes.
    target_passes: int = 0
    acceptance_rate: float = 0.0  # accepted / drafted
    # tau = mean_accepted_length(accepted, target_passes): 1.0 for plain decoding, always.
    mean_accepted_length: float = 0.0
    accepted_length_histogram: list[int] = field(
        default_factory=list
    )  # [n] = steps that accepted n
    drafted_by_position: list[int] = field(default_factory=list)
    accepted_by_position: list[int] = field(default_factory=list)
    prefill_seconds: float = 0.0
    draft_seconds: float = 0.0
    # By who drafted ("ngram", "model", "eagle3", "mtp", "forced": text the request's grammar
    # forces, "prediction": the request's prediction; the core's draft sources, all present).
    drafted_by_kind: dict[str, int] = field(default_factory=dict)
    accepted_by_kind: dict[str, int] = field(default_factory=dict)
    model_drafted: int = 0  # drafted tokens that ran a model (draft model or head), not a lookup
    model_draft_seconds: float = 0.0  # their drafting seconds
    # Verification rows computed at the few tokens a grammar-forced text allows there only.
    candidate_rows: int = 0
    verify_seconds: float = 0.0
    other_seconds: float = 0.0
    generation_seconds: float = 0.0  # excludes prefill
    time_to_first_token: float = 0.0
    tokens_per_second: float = 0.0  # n_tokens / generation_seconds
    prefill_tokens_per_second: float = 0.0
    last_drafted: int = 0  # tokens drafted in the last step

    @property
    def forced_drafted(self) -> int:
        """Drafted tokens that were text the request's grammar forces (free to propose)."""
        return self.drafted_by_kind.get("forced", 0)

    @property
    def forced_accepted(self) -> int:
        return self.accepted_by_kind.get("forced", 0)

    @property
    def accepted_prediction_tokens(self) -> int:
        """Prediction tokens drafted and accepted (OpenAI's usage field of that name)."""
        return self.accepted_by_kind.get("prediction", 0)

    @property
    def rejected_prediction_tokens(self) -> int:
        """Prediction tokens drafted and rejected by verification (OpenAI's field): the tokens
        the prediction got wrong where they were tried. Prediction tokens never drafted (after
        the output stopped following them) count in neither."""
        return self.drafted_by_kind.get("prediction", 0) - self.accepted_prediction_tokens

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
    drafter: str  # the drafter in effect, spelt as DrafterSpec.parse reads it
    n_ctx: int
    n_vocab: int
    target_name: str
    chat_template: str | None
    bos_text: str
    eos_text: str
    # Which head computes the target's logits (verification and plain decoding alike):
    # "localspec-q8_0", "localspec-q6_k" or "llama.cpp".
    verify_head: str = "llama.cpp"
    # Exact mode: every target row's logits are the same bits whatever the pass (docs/exact.md).
    exact: bool = False
    # The same for a draft model's logits; "" for drafters without a model (n-gram, none).
    draft_head: str = ""
    # How the target remembers a sequence: "attention", "recurrent" or "hybrid" (the last two
    # keep a running state per sequence).
    memory: str = "attention"
    # How many rejected draft tokens the target can take back per step: -1 any (attention);
    # a recurrent or hybrid target's state snapshots (drafts are capped there); 0 none (its
    # n-gram drafter is turned off).
    rollback_depth: int = -1
    # Something the user should know about what was loaded ("" when nothing), e.g. why
    # speculation is off.
    notice: str = ""
    # Generations that share each target pass (LoadOptions.parallel, or 1 where it cannot).
    parallel: int = 1
    # The RPC workers holding target layers (LoadOptions.rpc; docs/rpc.md).
    rpc: tuple[str, ...] = ()

    @property
    def drafter_spec(self) -> DrafterSpec:
        return DrafterSpec.parse(self.drafter)
