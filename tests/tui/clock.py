"""A step clock for tests and snapshots: every target verification pass costs a fixed time.

The tokens/s it gives still follow the real speculation of the reply (more tokens per pass,
more tokens/s); only the wall-clock noise of a shared machine is gone, so snapshots are stable.
"""

from __future__ import annotations

from dataclasses import dataclass

from localspec.types import GenerationStats


@dataclass
class PassCostClock:
    seconds_per_pass: float = 0.02

    def step_seconds(self, before: GenerationStats, after: GenerationStats) -> float:
        passes = max(1, after.target_passes - before.target_passes)
        return passes * self.seconds_per_pass
