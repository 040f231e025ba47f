"""Checking the lossless promise on greedy outputs (docs/design.md, "Lossless acceptance").

A speculative greedy output must equal the target's own greedy output. llama.cpp computes a
position's logits slightly differently in a single-token pass (plain decoding) and as a row of
a multi-token batch (verification), so two near-equal candidates can swap places. A divergence
is accepted only as a numerical tie: either the two tokens' logits are within TIE_TOLERANCE,
or replaying the speculative output with the target alone, in the same batch shapes from a
clean cache, shows every emitted token was the target's own argmax (so the only difference
from plain decoding is the shape of the passes). A bug (a wrong acceptance, a stale cache
entry after rollback, a misread logits row) fails the replay.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np

from localspec.types import GenerationParams, GenerationResult

if TYPE_CHECKING:
    from localspec._core import ReplayOutcome

TIE_TOLERANCE = 1e-4
Verdict = Literal["yes", "tie", "NO"]


class Target(Protocol):
    def next_token_logits(self, tokens: Sequence[int], batch_rows: int = 1) -> np.ndarray: ...

    def replay_greedy(self, prompt: Sequence[int], result: GenerationResult,
                      params: GenerationParams | None = None) -> ReplayOutcome: ...


@dataclass(frozen=True)
class Divergence:
    position: int  # index into the generated tokens
    expected: int  # the plain (single-token) greedy token
    actual: int  # the token speculation emitted
    margin: float  # logit(expected) - logit(actual) in the single-token pass
    replay_mismatch: int  # first token the same-shape replay disagrees with; -1: none
    verdict: Verdict


def compare_greedy(
    target: Target, prompt: Sequence[int], plain: Sequence[int], result: GenerationResult,
    *, exact: bool = False, params: GenerationParams | None = None,
) -> Divergence | None:
    """None when the speculative tokens equal the plain ones; else where and why they differ.
    ``exact``: the engine runs in exact mode, where no tie excuses a difference (always "NO").
    ``params``: the generation's, whose penalties and grammar shaped its argmax."""
    actual = result.tokens
    j = next((i for i, (a, b) in enumerate(zip(plain, actual, strict=False)) if a != b), None)
    if j is None:
        return None
    a, b = plain[j], actual[j]
    single = target.next_token_logits(list(prompt) + list(plain[:j]))
    margin = float(single[a] - single[b])
    mismatch = target.replay_greedy(prompt, result, params).first_mismatch
    tie = not exact and (abs(margin) <= TIE_TOLERANCE or mismatch == -1)
    return Divergence(j, a, b, margin, mismatch, "tie" if tie else "NO")
