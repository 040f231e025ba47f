"""Batch invariance, measured: does a target row get the same logits bits in a pass of r rows
as in a single-token pass? Exact mode promises it (docs/exact.md); the tests and
``localspec bench --exact`` check it with this function."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

MAX_ROWS = 16  # the longest verification pass checked (a draft of 15 tokens)


class PassTarget(Protocol):
    def pass_logits(self, tokens: list[int], rows: int) -> np.ndarray: ...


def differing_row_counts(
    target: PassTarget, tokens: Sequence[int], max_rows: int = MAX_ROWS
) -> list[int]:
    """The row counts r in 1..max_rows whose pass over the last r tokens gives any row other
    logits bits than the single-token passes at the same positions ([] : batch-invariant).
    Needs more than max_rows tokens."""
    if len(tokens) <= max_rows:
        raise ValueError(f"need more than {max_rows} tokens, got {len(tokens)}")
    tokens = list(tokens)
    n = len(tokens)
    single = np.stack(
        [target.pass_logits(tokens[: p + 1], 1)[0] for p in range(n - max_rows, n)]
    ).view(np.uint32)
    differing = []
    for rows in range(1, max_rows + 1):
        batch = target.pass_logits(tokens, rows).view(np.uint32)
        if not np.array_equal(batch, single[max_rows - rows :]):
            differing.append(rows)
    return differing
