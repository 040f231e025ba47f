"""Draft-vocabulary coverage: the share of the target's tokens an EAGLE-3 head can draft at all.

A head drafts only tokens of its draft vocabulary (the d2t map). Counted over the plain outputs
of a bench run, per category, this bounds what the head can be right about there: a category
whose text lies mostly outside the vocabulary cannot be drafted well by that head, however well
it was trained (docs/train-head.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from localspec.bench.runner import PromptRun
from localspec.drafter_spec import DrafterSpec
from localspec.runtime.loading import is_head

ALL = "all"


def head_of(drafter: DrafterSpec) -> str | None:
    """The EAGLE-3 head file a drafter drafts with, if any."""
    if drafter.path is None or drafter.kind not in ("eagle3", "hybrid", "model"):
        return None
    return drafter.path if is_head(drafter.path) else None


def draft_vocabulary(head: str | Path) -> set[int]:
    """The target ids a head can draft: its d2t map (absolute ids), or every id below its
    output width when it has none (the draft vocabulary is then the target's)."""
    import gguf

    reader = gguf.GGUFReader(str(head))
    for tensor in reader.tensors:
        if tensor.name == "d2t":
            return {int(t) for t in np.asarray(tensor.data).reshape(-1)}
    for tensor in reader.tensors:
        if tensor.name == "output.weight":
            return set(range(int(tensor.shape[-1])))
    return set()


def coverage(tokens: Iterable[int], vocabulary: set[int]) -> float:
    seen = [t in vocabulary for t in tokens]
    return sum(seen) / len(seen) if seen else 0.0


def coverage_by_category(runs: Sequence[PromptRun], vocabulary: set[int]) -> dict[str, float]:
    """Share of plain-output tokens inside `vocabulary`, per category and over all runs."""
    tokens: dict[str, list[int]] = {}
    for run in runs:
        tokens.setdefault(run.prompt.category, []).extend(run.plain_tokens)
    out = {category: coverage(ids, vocabulary) for category, ids in tokens.items()}
    out[ALL] = coverage((t for ids in tokens.values() for t in ids), vocabulary)
    return out


def head_coverage(drafter: DrafterSpec, runs: Sequence[PromptRun]) -> dict[str, float] | None:
    """Coverage per category when `drafter` drafts with an EAGLE-3 head, else None."""
    head = head_of(drafter)
    return None if head is None else coverage_by_category(runs, draft_vocabulary(head))
