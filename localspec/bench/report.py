"""Aggregating benchmark runs into rows: per prompt, per category, overall.

Definitions (DESIGN §7): tokens/s = generated tokens / generation time, prefill excluded.
A prompt's tokens/s is the median over its repeats; a group's is its total tokens over its
total generation time. Speedup = speculative tokens/s / plain tokens/s of the same group.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from localspec.bench.runner import PromptRun
from localspec.types import GenerationStats


@dataclass
class Row:
    label: str
    n_runs: int
    plain_tps: float
    speculative_tps: float
    speedup: float
    drafted: int
    accepted: int
    rejected: int
    acceptance_rate: float
    mean_accepted_length: float
    draft_seconds: float
    verify_seconds: float
    other_seconds: float
    identical: str  # "yes", "tie" (differs only at numerical ties) or "NO"


@dataclass
class Report:
    prompts: list[Row]
    categories: list[Row]
    overall: Row
    accepted_length_histogram: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _throughput(stats: Sequence[GenerationStats]) -> float:
    seconds = sum(s.generation_seconds for s in stats)
    return sum(s.n_tokens for s in stats) / seconds if seconds > 0 else 0.0


def _row(label: str, runs: Sequence[PromptRun], median: bool) -> Row:
    plain = [s for r in runs for s in r.plain]
    spec = [s for r in runs for s in r.speculative]
    if median:
        plain_tps = statistics.median(s.tokens_per_second for s in plain)
        spec_tps = statistics.median(s.tokens_per_second for s in spec)
    else:
        plain_tps, spec_tps = _throughput(plain), _throughput(spec)
    drafted = sum(s.drafted for s in spec)
    accepted = sum(s.accepted for s in spec)
    passes = sum(s.target_passes for s in spec)
    return Row(
        label=label,
        n_runs=len(spec),
        plain_tps=plain_tps,
        speculative_tps=spec_tps,
        speedup=spec_tps / plain_tps if plain_tps > 0 else 0.0,
        drafted=drafted,
        accepted=accepted,
        rejected=drafted - accepted,
        acceptance_rate=accepted / drafted if drafted else 0.0,
        mean_accepted_length=sum(s.n_tokens for s in spec) / passes if passes else 0.0,
        draft_seconds=sum(s.draft_seconds for s in spec),
        verify_seconds=sum(s.verify_seconds for s in spec),
        other_seconds=sum(s.other_seconds for s in spec),
        identical=_verdict(runs),
    )


def _verdict(runs: Sequence[PromptRun]) -> str:
    verdicts = {r.verdict for r in runs}
    return "NO" if "NO" in verdicts else "tie" if "tie" in verdicts else "yes"


def summarize(runs: Sequence[PromptRun]) -> Report:
    prompts = [_row(r.prompt.id, [r], median=True) for r in runs]
    by_category: dict[str, list[PromptRun]] = {}
    for r in runs:
        by_category.setdefault(r.prompt.category, []).append(r)
    categories = [_row(name, group, median=False) for name, group in by_category.items()]
    histogram: list[int] = []
    for r in runs:
        for s in r.speculative:
            for n, count in enumerate(s.accepted_length_histogram):
                if n >= len(histogram):
                    histogram.extend([0] * (n + 1 - len(histogram)))
                histogram[n] += count
    return Report(prompts, categories, _row("all", runs, median=False), histogram)
