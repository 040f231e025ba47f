"""Live statistics of the reply being generated: rolling tokens/s and per-step acceptance.

Durations come from a *step clock*: the engine's own timing (``GenerationStats.
generation_seconds``, which excludes prompt processing, docs/design.md, "Benchmarks") unless the
app is given another ``StepClock`` (the tests give one with a fixed cost per target pass).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from localspec.types import GenerationStats

ROLLING_STEPS = 12  # the rolling tokens/s covers this many speculative steps
SPARK_POINTS = 240  # per-step history kept for the sparklines


class StepClock(Protocol):
    """Seconds spent by one speculative step, between two running-stats snapshots."""

    def step_seconds(self, before: GenerationStats, after: GenerationStats) -> float: ...


class EngineClock:
    """The engine's measured generation time (the default clock)."""

    def step_seconds(self, before: GenerationStats, after: GenerationStats) -> float:
        return max(0.0, after.generation_seconds - before.generation_seconds)


@dataclass
class ReplyMetrics:
    """Folds the running stats of each chunk into what the status bar and sparklines show."""

    clock: StepClock = field(default_factory=EngineClock)
    stats: GenerationStats = field(default_factory=GenerationStats)
    steps: int = 0
    segments: int = 1  # parts of the reply generated with different settings
    tokens: int = 0
    total_seconds: float = 0.0
    rate_history: list[float] = field(default_factory=list)
    acceptance_history: list[float | None] = field(default_factory=list)  # None: k was 0
    _window: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=ROLLING_STEPS))

    def reset(self) -> None:
        """Start a new segment (a new reply, or a continuation with other settings)."""
        self.stats = GenerationStats()
        self.segments += 1

    def update(self, n_new_tokens: int, after: GenerationStats) -> None:
        before = self.stats
        seconds = self.clock.step_seconds(before, after)
        self.total_seconds += seconds
        self.steps += 1
        self.tokens += n_new_tokens
        self._window.append((n_new_tokens, seconds))
        self.rate_history.append(self.rolling_tokens_per_second)
        drafted = after.drafted - before.drafted
        # A step that drafted nothing (k = 0) has no acceptance: None, not a rejection's 0.0.
        self.acceptance_history.append(
            (after.accepted - before.accepted) / drafted if drafted > 0 else None)
        del self.rate_history[:-SPARK_POINTS], self.acceptance_history[:-SPARK_POINTS]
        self.stats = after

    @property
    def rolling_tokens_per_second(self) -> float:
        tokens = sum(n for n, _ in self._window)
        seconds = sum(s for _, s in self._window)
        return tokens / seconds if seconds > 0 else 0.0

    @property
    def average_tokens_per_second(self) -> float:
        return self.tokens / self.total_seconds if self.total_seconds > 0 else 0.0

    def shown_tokens_per_second(self, generating: bool) -> float:
        """The one tok/s the chat shows: rolling while the reply streams, the whole reply's
        average once it ended (the status bar and the reply's closing line then agree)."""
        return self.rolling_tokens_per_second if generating else self.average_tokens_per_second
