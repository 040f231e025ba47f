"""Progress of a bench or check run as plain lines, for a stderr that is not a terminal (a log
file, CI): ``bench: 3/20 prompt runs, 0:12 elapsed, about 1:08 left``. A terminal gets a live
bar instead. ``work_line`` says up front how much will be generated."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO

MIN_INTERVAL = 5.0  # seconds between two lines (the first and the last are always printed)


def clock_text(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class LineProgress:
    """``update(done, total)`` prints a line with the ETA (linear in the runs done so far)."""

    def __init__(self, stream: TextIO, clock: Callable[[], float] = time.monotonic,
                 min_interval: float = MIN_INTERVAL, label: str = "bench",
                 unit: str = "prompt runs") -> None:
        self.stream = stream
        self.label, self.unit = label, unit
        self.clock = clock
        self.min_interval = min_interval
        self.started = clock()
        self.last_line: float | None = None

    def update(self, done: int, total: int) -> None:
        now = self.clock()
        finished = done >= total
        if not finished and self.last_line is not None:
            if now - self.last_line < self.min_interval:
                return
        self.last_line = now
        self.stream.write(line(done, total, now - self.started, self.label, self.unit) + "\n")
        self.stream.flush()


def line(done: int, total: int, elapsed: float, label: str = "bench",
         unit: str = "prompt runs") -> str:
    text = f"{label}: {done}/{total} {unit}, {clock_text(elapsed)} elapsed"
    if 0 < done < total:
        text += f", about {clock_text(elapsed / done * (total - done))} left"
    return text


ARMS = 3  # plain, speculative, plain again (bench/runner.py)


def work_line(label: str, n_prompts: int, repeat: int, max_tokens: int) -> str:
    """What a comparison will generate, said before it starts (a 1.5B model on a CPU makes a
    few tokens per second: the default bench is hours there)."""
    tokens = n_prompts * repeat * max_tokens * ARMS
    return (f"{label}: {n_prompts} prompt(s) x {repeat} repeat(s) x {max_tokens} tokens x "
            f"{ARMS} arms (plain, speculative, plain again) = {tokens:,} tokens to generate; "
            "the time left is estimated after the first prompt run")
