"""The default thread count on a CPU that other work may share, and the note for a slow run.

ggml's CPU worker threads meet at a barrier after every operation of a pass: when another
process holds one of their cores, every barrier waits for the preempted thread, and a pass can
cost several times what it costs with fewer threads (issue 52: 1.1 tokens/s with all of a
2-core machine's cores, 9.4 with one, while two other processes ran). So the default is the
cores this process may run on minus the cores other work keeps busy at start-up (the 1-minute
load average, scaled to those cores), at least one. ``--threads`` overrides it.
"""

from __future__ import annotations

import os


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask where the system has one)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def system_load() -> float | None:
    """The 1-minute load average (runnable tasks over the whole machine), None where unknown."""
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


def default_threads(load: float | None = None, usable: int | None = None,
                    online: int | None = None) -> int:
    """Threads for a run that does not name a count: ``usable`` cores (default: this process's)
    minus the busy ones, at least 1. The busy cores are the load average (default: now) times
    the share of the machine's ``online`` cores this process may use (a container limited to 2
    of 64 cores sees the host's load), rounded to the nearest core."""
    usable = usable_cores() if usable is None else usable
    online = max(usable, (os.cpu_count() or usable) if online is None else online)
    load = system_load() if load is None else load
    if load is None:
        return usable
    busy = int(max(0.0, load) * usable / online + 0.5)
    return max(1, usable - busy)


SLOW_SHARE = 0.35  # a run slower than this share of its plain passes' timed speed is "far below"
# Passes cheaper than this are not judged: a tiny model's per-token work outside the pass
# (sampling, streaming the text) then costs as much as the pass itself.
MIN_PASS_SECONDS = 0.002


def slow_run_note(tokens_per_second: float, n_tokens: int, plain_pass_seconds: float,
                  threads: int) -> str | None:
    """One line when a run on several threads made far fewer tokens per second than one plain
    pass per token would have at the cost its passes were timed at (the controller's estimate
    of a one-row pass: timed at start-up, then tracked), naming --threads; None otherwise.
    Speculation never runs far below plain speed, so a run this slow was slowed by the
    machine."""
    if (threads <= 1 or n_tokens < 16 or plain_pass_seconds < MIN_PASS_SECONDS
            or tokens_per_second <= 0):
        return None  # one thread has no fewer to try
    expected = 1.0 / plain_pass_seconds
    if tokens_per_second >= SLOW_SHARE * expected:
        return None
    return (f"{tokens_per_second:.1f} tokens/s is far below the {expected:.1f} that this "
            f"model's passes were timed at with {threads} threads: the CPU looks busy with "
            f"other work; try --threads {threads - 1}, or a quieter machine.")
