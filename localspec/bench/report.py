"""Aggregating benchmark runs into rows: per prompt, per category, overall, and the worst.

Definitions (docs/design.md, "Benchmarks"): tokens/s = generated tokens / generation time,
prefill excluded. Repeats are paired: repeat r of the speculative arm is compared with repeat r
of the plain arm, which ran right next to it.

* A prompt's speedup is the median of its per-repeat ratios (speculative / plain tokens/s);
  its spread is half the range of those ratios, relative to the median.
* A group's (category, all) speedup is its total tokens over its total time, speculative
  against plain; its spread is half the range of the same ratio computed repeat by repeat.
* A/A is the same for the second plain arm against the first: ideally 1.00x with no spread.
  A floor (say >= 0.97x) is only met where the A/A spread is below 2%; wider, and the machine
  was too noisy to tell.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from localspec.bench.runner import PromptRun
from localspec.bench.theory import plain_pass_seconds
from localspec.types import GenerationStats, mean_accepted_length

TRUSTED_AA_SPREAD = 0.02  # a comparison is trusted where the A/A arm drifts less than this


@dataclass
class Row:
    label: str
    n_runs: int
    plain_tps: float
    speculative_tps: float
    speedup: float
    speedup_spread: float  # half the range of the per-repeat speedups, relative
    aa: float  # second plain arm / first (ideally 1.0)
    aa_spread: float
    drafted: int
    accepted: int
    rejected: int
    acceptance_rate: float
    mean_accepted_length: float
    draft_seconds: float
    verify_seconds: float
    other_seconds: float
    identical: str  # "yes", "tie" (differs only at numerical ties) or "NO"
    # Grammar-forced drafts (prompts with a JSON Schema): drafted, and of those accepted.
    forced_drafted: int = 0
    forced_accepted: int = 0
    candidate_rows: int = 0  # verification rows computed at the forced text's candidates only
    valid: str = "-"  # every output follows its JSON Schema: "yes", "NO", or "-" (no schema)

    @property
    def trusted(self) -> bool:
        """Whether the A/A arm says this machine could see a 2% difference here."""
        return self.aa_spread < TRUSTED_AA_SPREAD and abs(self.aa - 1) < TRUSTED_AA_SPREAD


@dataclass
class Worst:
    """The slowest prompt and category: floors are about the worst case, not the average."""

    prompt: str
    prompt_speedup: float
    category: str
    category_speedup: float


@dataclass(frozen=True)
class DraftCost:
    """What a drafter that runs a model (a draft model or a hidden-state head) costs: c is its
    seconds per drafted token over one plain target pass of the same run."""

    c: float
    drafted: int  # model-drafted tokens it is measured over
    draft_ms: float  # per drafted token
    plain_pass_ms: float


@dataclass
class Report:
    prompts: list[Row]
    categories: list[Row]
    overall: Row
    accepted_length_histogram: list[int] = field(default_factory=list)
    worst: Worst | None = None
    draft_cost: DraftCost | None = None  # None: no draft ran a model

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("prompts", "categories"):
            for row, data in zip(getattr(self, key), out[key], strict=True):
                data["trusted"] = row.trusted
        out["overall"]["trusted"] = self.overall.trusted
        return out


def _throughput(stats: Sequence[GenerationStats]) -> float:
    seconds = sum(s.generation_seconds for s in stats)
    return sum(s.n_tokens for s in stats) / seconds if seconds > 0 else 0.0


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else 0.0


def _spread(values: Sequence[float], center: float) -> float:
    return (max(values) - min(values)) / 2 / center if len(values) > 1 and center > 0 else 0.0


def _paired(runs: Sequence[PromptRun], arm: str, median: bool) -> tuple[float, float]:
    """(ratio, spread) of `arm` against the plain arm, pairing repeat r with repeat r."""
    n = min(len(r.plain) for r in runs)
    per_repeat = []
    for i in range(n):
        plain = [r.plain[i] for r in runs]
        other = [getattr(r, arm)[i] for r in runs if i < len(getattr(r, arm))]
        if len(other) == len(plain):
            per_repeat.append(_ratio(_throughput(other), _throughput(plain)))
    if not per_repeat:
        return 0.0, 0.0
    if median:
        center = statistics.median(per_repeat)
    else:
        plain_all = [s for r in runs for s in r.plain]
        other_all = [s for r in runs for s in getattr(r, arm)]
        center = _ratio(_throughput(other_all), _throughput(plain_all))
    return center, _spread(per_repeat, center)


def _row(label: str, runs: Sequence[PromptRun], median: bool) -> Row:
    plain = [s for r in runs for s in r.plain]
    spec = [s for r in runs for s in r.speculative]
    if median:
        plain_tps = statistics.median(s.tokens_per_second for s in plain)
        spec_tps = statistics.median(s.tokens_per_second for s in spec)
    else:
        plain_tps, spec_tps = _throughput(plain), _throughput(spec)
    speedup, speedup_spread = _paired(runs, "speculative", median)
    aa, aa_spread = _paired(runs, "plain_again", median) if runs[0].plain_again else (1.0, 0.0)
    drafted = sum(s.drafted for s in spec)
    accepted = sum(s.accepted for s in spec)
    passes = sum(s.target_passes for s in spec)
    return Row(
        label=label,
        n_runs=len(spec),
        plain_tps=plain_tps,
        speculative_tps=spec_tps,
        speedup=speedup,
        speedup_spread=speedup_spread,
        aa=aa,
        aa_spread=aa_spread,
        drafted=drafted,
        accepted=accepted,
        rejected=drafted - accepted,
        acceptance_rate=accepted / drafted if drafted else 0.0,
        mean_accepted_length=mean_accepted_length(accepted, passes),
        draft_seconds=sum(s.draft_seconds for s in spec),
        verify_seconds=sum(s.verify_seconds for s in spec),
        other_seconds=sum(s.other_seconds for s in spec),
        identical=_verdict(runs),
        forced_drafted=sum(s.forced_drafted for s in spec),
        forced_accepted=sum(s.forced_accepted for s in spec),
        candidate_rows=sum(s.candidate_rows for s in spec),
        valid=_valid(runs),
    )


def _verdict(runs: Sequence[PromptRun]) -> str:
    verdicts = {r.verdict for r in runs}
    return "NO" if "NO" in verdicts else "tie" if "tie" in verdicts else "yes"


def _valid(runs: Sequence[PromptRun]) -> str:
    verdicts = {r.valid for r in runs} - {"-"}
    return "NO" if "NO" in verdicts else "yes" if verdicts else "-"


def _worst(prompts: Sequence[Row], categories: Sequence[Row]) -> Worst | None:
    if not prompts or not categories:
        return None
    p = min(prompts, key=lambda row: row.speedup)
    c = min(categories, key=lambda row: row.speedup)
    return Worst(p.label, p.speedup, c.label, c.speedup)


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
    return Report(prompts, categories, _row("all", runs, median=False), histogram,
                  _worst(prompts, categories), draft_cost(runs))


def draft_cost(runs: Sequence[PromptRun]) -> DraftCost | None:
    spec = [s for r in runs for s in r.speculative]
    plain = [s for r in runs for s in r.plain + r.plain_again]
    drafted = sum(s.model_drafted for s in spec)
    plain_pass = plain_pass_seconds(plain)
    if drafted == 0 or plain_pass == 0:
        return None
    draft = sum(s.model_draft_seconds for s in spec) / drafted
    c = draft / plain_pass
    return DraftCost(c, drafted, draft * 1e3, plain_pass * 1e3)
