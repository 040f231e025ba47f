"""`localspec bench --synthetic`: a generated target/draft pair and the speed limit it allows.

The pair comes from ``localspec.testing.synthetic.write_pair``: the draft is the target without its
last ``extra_layers`` blocks, and those blocks write into the residual stream scaled by
``divergence`` (0: the two always agree). With a fixed draft length k, the bench measures the
per-token acceptance a, the draft cost c and the verification cost v(k+1) and prints the
measured speedup next to S = E / (k*c + v(k+1)) (see ``localspec.bench.theory``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from localspec.bench.runner import PromptRun
from localspec.bench.theory import Costs, estimate_costs
from localspec.errors import InvalidParameterError
from localspec.testing.synthetic import TinyConfig, write_pair

HEAD_DIM = 32


@dataclass(frozen=True)
class SyntheticSpec:
    """The generated pair: draft = ``n_layer`` blocks, target = ``n_layer + extra_layers``."""

    # Defaults: a 1-block draft of an 8-block, 768-wide target. One target pass then reads
    # ~170 MB of F32 weights (memory-bound on a CPU, ~10-30 ms here), so verifying k + 1 rows
    # costs far less than k + 1 passes and the draft costs about 1/8 of the target.
    divergence: float = 0.1
    extra_layers: int = 7
    n_embd: int = 768
    n_layer: int = 1
    seed: int = 0

    def validate(self) -> None:
        if not 0.0 <= self.divergence <= 100.0:
            raise InvalidParameterError(
                f"--agreement-divergence {self.divergence} is invalid: use a value in [0, 100].")
        if self.extra_layers < 0:
            raise InvalidParameterError(
                f"--extra-layers {self.extra_layers} is invalid: use 0 or more.")
        if self.n_layer < 1:
            raise InvalidParameterError(
                f"--synthetic-layers {self.n_layer} is invalid: use 1 or more.")
        if self.n_embd < HEAD_DIM or self.n_embd % HEAD_DIM:
            raise InvalidParameterError(
                f"--synthetic-embd {self.n_embd} is invalid: use a multiple of {HEAD_DIM}.")

    def config(self) -> TinyConfig:
        n_head = self.n_embd // HEAD_DIM
        n_head_kv = n_head // 2 if n_head % 2 == 0 else n_head
        return TinyConfig(n_embd=self.n_embd, n_head=n_head, n_head_kv=n_head_kv,
                          n_ff=2 * self.n_embd, n_layer=self.n_layer, seed=self.seed)


def write_synthetic_pair(directory: str | Path, spec: SyntheticSpec) -> tuple[Path, Path]:
    """Write (target, draft) GGUF files for `spec` into `directory`."""
    spec.validate()
    return write_pair(directory, spec.config(), extra_layers=spec.extra_layers,
                      divergence=spec.divergence)


def check_draft_max(draft_max: object) -> int:
    """The synthetic mode needs one fixed draft length: the theory is for a fixed k."""
    if not isinstance(draft_max, int) or draft_max < 1:
        raise InvalidParameterError(
            f"--synthetic needs a fixed --draft-max of 1 or more, not {draft_max!r}.")
    return draft_max


@dataclass
class TheoryRow:
    label: str
    n_runs: int
    costs: Costs

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "n_runs": self.n_runs, **asdict(self.costs)}


def theory_rows(runs: Sequence[PromptRun]) -> list[TheoryRow]:
    """One row per category and one for all runs, from the same plain/speculative runs."""
    groups: dict[str, list[PromptRun]] = {}
    for r in runs:
        groups.setdefault(r.prompt.category, []).append(r)
    groups["all"] = list(runs)

    def row(label: str, group: list[PromptRun]) -> TheoryRow:
        plain = [s for r in group for s in r.plain]
        spec = [s for r in group for s in r.speculative]
        return TheoryRow(label, len(spec), estimate_costs(plain, spec))

    return [row(label, group) for label, group in groups.items()]
