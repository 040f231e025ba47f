"""The n-gram ceiling: how fast n-gram speculation could have been on the same outputs.

A perfect controller would know, before each step, how many tokens of the n-gram lookup's
proposal the target will accept. Replaying the plain greedy output of each prompt, this module
finds the cheapest way such an oracle could have emitted it: at position i the lookup proposes
a draft (the same C++ lookup the engine uses, on prompt + output[:i]); the target would accept
its first a_i tokens; drafting j <= a_i of them costs one pass of j + 1 rows and emits j + 1
tokens (drafting more also costs j + 1 rows but emits only a_i + 1). A dynamic programme over
positions gives the minimum total cost

    cost[0] = 0,   cost[i + min(j, a_i) + 1] <- cost[i] + v(j + 1)   for each draft length j

where v(r) is the time of an r-row pass over that of a 1-row pass, measured after the run on the
same engine (medians, every row count up to k_max + 1). Plain decoding costs n, so the ceiling
is n / cost[n]. No controller that drafts from this lookup can beat it with these pass costs,
which is what the number is for: it tells the controller's losses (measured speedup below the
ceiling) from the limits of the drafts and of the hardware (a low ceiling).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from localspec import _core
from localspec.bench.report import Report
from localspec.bench.runner import PromptRun
from localspec.runtime.engine import Engine

Lookup = Callable[[list[int], int], list[int]]  # (history, k) -> up to k drafted tokens


def engine_lookup() -> Lookup:
    """The n-gram lookup with the engine's default match lengths."""
    options = _core.EngineOptions()
    n_min, n_max = options.ngram_min, options.ngram_max
    return lambda history, k: _core.ngram_lookup(history, n_min, n_max, k)


CALIBRATION_REPEATS = 5


def measure_pass_costs(engine: Engine, runs: Sequence[PromptRun], k_max: int) -> list[float] | None:
    """v(r) for r = 0 .. k_max + 1 rows (v(0) unused): the median time of an r-row greedy
    verification pass over that of a 1-row pass, timed on the first prompt and its output
    (fewer rows if that is short; None if it is too short to time a draft at all)."""
    context = runs[0].prompt_tokens + runs[0].plain_tokens
    max_rows = min(k_max + 1, len(context) - 1)
    if max_rows < 2:
        return None
    seconds = engine.pass_seconds(context, max_rows, CALIBRATION_REPEATS)
    return [s / seconds[1] for s in seconds]


def _accepted(draft: Sequence[int], truth: Sequence[int]) -> int:
    n = 0
    while n < len(draft) and n < len(truth) and draft[n] == truth[n]:
        n += 1
    return n


def oracle_cost(prompt: Sequence[int], output: Sequence[int], lookup: Lookup,
                costs: Sequence[float], k_max: int) -> float:
    """The minimum cost, in 1-row passes, of emitting `output` after `prompt` (see above)."""
    n = len(output)
    cost = [0.0] + [math.inf] * n
    history = list(prompt)
    for i in range(n):
        # As in the engine: at most k_max drafts (here also: as many as `costs` covers) and
        # none past the tokens still wanted.
        k = min(k_max, n - i - 1, len(costs) - 2)
        draft = lookup(history, k) if k > 0 else []
        accepted = _accepted(draft, output[i:])
        # Drafting past `accepted` never pays with rising costs, but measured costs need not
        # rise; allowing it keeps every real controller's choices within the oracle's.
        for j in range(len(draft) + 1):
            emitted = min(j, accepted) + 1
            cost[i + emitted] = min(cost[i + emitted], cost[i] + costs[j + 1])
        history.append(output[i])
    return cost[n]


@dataclass
class CeilingRow:
    label: str
    speedup: float  # measured speculative / plain tokens/s (from the report)
    ceiling: float  # plain cost / oracle cost on the same outputs
    of_ceiling: float  # speedup / ceiling

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Ceiling:
    max_rows: int  # the oracle drafts at most max_rows - 1 tokens a step (k_max)
    pass_costs: list[float]  # v[r], r = 0 .. max_rows (v[0] unused)
    rows: list[CeilingRow]

    def to_dict(self) -> dict[str, Any]:
        return {"max_rows": self.max_rows, "pass_costs": self.pass_costs,
                "rows": [r.to_dict() for r in self.rows]}


def ngram_ceiling(runs: Sequence[PromptRun], report: Report, lookup: Lookup, k_max: int,
                  costs: Sequence[float]) -> Ceiling:
    """The ceiling per category and overall, for greedy runs of the n-gram drafter."""
    oracle = {r.prompt.id: oracle_cost(r.prompt_tokens, r.plain_tokens, lookup, costs, k_max)
              for r in runs}

    def row(label: str, group: Sequence[PromptRun], speedup: float) -> CeilingRow:
        plain = sum(len(r.plain_tokens) for r in group)
        best = sum(oracle[r.prompt.id] for r in group)
        ceiling = plain / best if best > 0 else 1.0
        return CeilingRow(label, speedup, ceiling, speedup / ceiling)

    rows = [row(c.label, [r for r in runs if r.prompt.category == c.label], c.speedup)
            for c in report.categories]
    rows.append(row(report.overall.label, runs, report.overall.speedup))
    return Ceiling(len(costs) - 1, list(costs), rows)
