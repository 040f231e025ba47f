"""Step 5: how the written head drafts, on held-back data, through the core itself.

The head drafts alone (its bare path: no n-gram lookup) at a fixed k = K_MAX with no
confidence cutoff, greedily, from prompts cut from the held-back sequences. From the drafter's
statistics: acceptance by position (the share of steps whose draft was accepted up to and
including position i), the mean accepted length tau(k) = 1 + sum of the first k of those, and
with this machine's measured draft cost c (head seconds per drafted token / one plain target
pass) and verification costs v(j) (a pass over j rows / one row), the speedup the theory of
localspec/bench/theory.py predicts: S(k) = tau(k) / (k*c + v(k+1)). No torch here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from localspec.runtime.engine import Engine
from localspec.train.params import TrainHeadParams
from localspec.types import GenerationParams

K_MAX = 8


@dataclass
class Evaluation:
    coverage: float = 0.0  # held-back target tokens inside the draft vocabulary
    teacher_forced: list[float] = field(default_factory=list)  # per unroll step (train.py)
    drafted: int = 0
    acceptance_by_position: list[float] = field(default_factory=list)
    mean_accepted_length: list[float] = field(default_factory=list)  # index k-1: tau(k)
    c: float = 0.0
    v: list[float] = field(default_factory=list)  # index j-1: v(j)
    predicted_speedup: list[float] = field(default_factory=list)  # index k-1: S(k)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def through_core(head: Path, prompts: Sequence[Sequence[int]], params: TrainHeadParams,
                 evaluation: Evaluation) -> None:
    """Fill the drafting figures of `evaluation` from greedy runs of the head in the core."""
    engine = Engine.load(params.target, draft=str(head), draft_p_min=0.0,
                         n_ctx=params.seq_len + params.eval_tokens + 16,
                         n_threads=params.n_threads)
    try:
        generation = GenerationParams(temperature=0.0, max_tokens=params.eval_tokens,
                                      ignore_eos=True, draft_max=K_MAX)
        drafted = [0] * K_MAX
        accepted = [0] * K_MAX
        draft_seconds, model_drafted = 0.0, 0
        for prompt in prompts:
            stats = engine.generate(list(prompt), generation).stats
            for i, (d, a) in enumerate(zip(stats.drafted_by_position, stats.accepted_by_position,
                                           strict=True)):
                drafted[i] += d
                accepted[i] += a
            draft_seconds += stats.model_draft_seconds
            model_drafted += stats.model_drafted
        seconds = engine.pass_seconds(list(prompts[0]), K_MAX + 1, repeats=3)
    finally:
        engine.close()
    evaluation.drafted = sum(drafted)
    evaluation.acceptance_by_position = [a / d if d else 0.0 for a, d in zip(accepted, drafted,
                                                                             strict=True)]
    one = seconds[1] if len(seconds) > 1 and seconds[1] > 0 else 1.0
    evaluation.c = draft_seconds / model_drafted / one if model_drafted else 0.0
    evaluation.v = [s / one for s in seconds[1:]]
    taus, speedups = [], []
    for k in range(1, K_MAX + 1):
        taus.append(1.0 + sum(evaluation.acceptance_by_position[:k]))
        speedups.append(taus[-1] / (k * evaluation.c + evaluation.v[k]))
    evaluation.mean_accepted_length, evaluation.predicted_speedup = taus, speedups


def eval_prompts(sequences: Sequence[Sequence[int]], count: int) -> list[list[int]]:
    """Prompts from held-back sequences: each one's first half, at most 64 tokens."""
    return [list(s[:max(2, min(64, len(s) // 2))]) for s in sequences[:count]]


def report_lines(evaluation: Evaluation) -> list[str]:
    e = evaluation
    lines = [f"draft-vocabulary coverage of held-back target tokens: {e.coverage:.1%}"]
    if e.teacher_forced:
        steps = ", ".join(f"{a:.1%}" for a in e.teacher_forced)
        lines.append(f"teacher-forced accuracy by unroll step (held back): {steps}")
    if e.acceptance_by_position:
        lines.append(f"through the core, k = {K_MAX}, {e.drafted} tokens drafted:")
        lines.append("  acceptance by position: "
                     + ", ".join(f"{a:.1%}" for a in e.acceptance_by_position))
        lines.append(f"  draft cost c = {e.c:.3f} of a plain pass; v(j), j = 1..{K_MAX + 1}: "
                     + ", ".join(f"{v:.2f}" for v in e.v))
        lines.append("  k:         " + " ".join(f"{k:>5d}" for k in range(1, K_MAX + 1)))
        lines.append("  tau(k):    " + " ".join(f"{t:5.2f}" for t in e.mean_accepted_length))
        lines.append("  speedup:   " + " ".join(f"{s:5.2f}" for s in e.predicted_speedup))
    return lines
