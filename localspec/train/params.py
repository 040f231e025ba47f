"""The parameters of ``localspec train-head``: one owner of their defaults and checks (the
CLI only converts), and the head's shape derived from the target."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from localspec.errors import InvalidParameterError

OUTTYPES = ("f16", "q8_0", "f32")
MIN_TOKENS = 200  # below this, nothing can be learned or held back


@dataclass(frozen=True)
class TrainHeadParams:
    """What one train-head run does. Paths are checked when the run starts."""

    target: str
    data: tuple[str, ...]
    out: str
    draft_vocab: int = 16000
    tokens: int = 400_000  # training text to collect (the target's own continuations included)
    steps: int | None = None  # optimizer steps; None: about two passes over the data
    self_distill: bool = False
    resume: bool = False
    n_threads: int = 2
    outtype: str = "f16"
    # Fixed choices (not flags): see docs/train-head.md.
    seq_len: int = 512  # tokens per collected sequence (one target context each)
    depth: int = 4  # training-time unroll: the head learns from its own states this many steps
    batch_tokens: int = 2048  # tokens per optimizer step
    learning_rate: float = 1e-3
    heldout_share: float = 0.05  # of the sequences, for the evaluation
    prompt_tokens: int = 32  # self-distill: a text item's prompt length
    continuation_tokens: int = 192  # self-distill: tokens the target writes per prompt
    shard_tokens: int = 16384  # tokens per cache shard (the unit of resuming)
    eval_prompts: int = 8  # held-back prompts drafted through the core
    eval_tokens: int = 64  # tokens generated per evaluation prompt
    seed: int = 0

    def validate(self) -> None:
        """Raise InvalidParameterError with one sentence naming the bad value."""
        for name, ok, rule in (
            ("draft_vocab", self.draft_vocab >= 2, "use 2 or more tokens"),
            ("tokens", self.tokens >= MIN_TOKENS, f"use at least {MIN_TOKENS} tokens"),
            ("steps", self.steps is None or self.steps >= 1, "use 1 or more steps"),
            ("n_threads", self.n_threads >= 1, "use 1 or more threads"),
            ("outtype", self.outtype in OUTTYPES, "use one of " + ", ".join(OUTTYPES)),
            ("depth", self.depth >= 1, "use 1 or more steps"),
        ):
            if not ok:
                raise InvalidParameterError(
                    f"{name}={getattr(self, name)!r} is invalid: {rule}.")
        if not self.data:
            raise InvalidParameterError("Pass at least one data file with --data.")

    @property
    def cache_dir(self) -> Path:
        """Where the steps keep their results: next to the output."""
        out = Path(self.out)
        return out.with_name(out.name + ".cache")


@dataclass(frozen=True)
class HeadShape:
    """The head's hyper-parameters (an EAGLE-3 layer as wide as the target, whose token
    embeddings it borrows)."""

    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    target_layers: tuple[int, int, int]
    target_width: int  # the target's n_embd
    n_draft: int
    rms_eps: float = 1e-6
    rope_base: float = 10000.0
    context_length: int = 4096
    d2t: tuple[int, ...] = field(default=(), repr=False)

    @property
    def feature_width(self) -> int:
        return 3 * self.target_width


def target_layers(n_layer: int) -> tuple[int, int, int]:
    """Low, middle and high layers whose inputs the head reads: (2, n/2, n-3) as llama.cpp's
    converters default to, kept inside 1 .. n-1 (the core taps from layer 1 on)."""
    def clamp(i: int) -> int:
        return min(max(i, 1), n_layer - 1)

    return clamp(2), clamp(n_layer // 2), clamp(n_layer - 3)


def head_shape(n_embd: int, n_ff: int, n_layer: int, n_draft: int,
               d2t: Sequence[int] = ()) -> HeadShape:
    """Heads of 64 values (one when the target is narrower), no grouped keys, the target's
    feed-forward width."""
    n_head = max(1, n_embd // 64)
    while n_embd % n_head:
        n_head -= 1
    return HeadShape(n_embd=n_embd, n_head=n_head, n_head_kv=n_head, head_dim=n_embd // n_head,
                     n_ff=n_ff, target_layers=target_layers(n_layer), target_width=n_embd,
                     n_draft=n_draft, d2t=tuple(d2t))
