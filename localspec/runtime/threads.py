"""The default thread count on a CPU that other work may share, and the note for a slow run.

ggml's CPU worker threads meet at a barrier after every operation of a pass: when another
process holds one of their cores, every barrier waits for the preempted thread, and a pass can
cost several times what it costs with fewer threads (issue 52: 1.1 tokens/s with all of a
2-core machine's cores, 9.4 with one, while two other processes ran). So the default is the
cores this process may run on minus the cores other work keeps busy at start-up, at least one.
``--threads`` overrides it.

"Busy at start-up" is measured over a fifth of a second (/proc/stat, less this process's own
time), not read from the 1-minute load average: that average lags by a minute, and a model
loaded just after a build or a test run ended got one thread on an idle machine and kept it
(the edit benchmark ran at half speed). The load average is the fallback where /proc is not.
"""

from __future__ import annotations

import os
import time

SAMPLE_SECONDS = 0.2  # how long the start-up measure of other work watches the CPUs


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask where the system has one)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def system_load() -> float | None:
    """How many of the machine's cores other work keeps busy now (measured over
    SAMPLE_SECONDS), else the 1-minute load average; None where neither is known."""
    busy = busy_cores_now()
    if busy is not None:
        return busy
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


def busy_cores_now(seconds: float = SAMPLE_SECONDS) -> float | None:
    """Cores busy with other processes over the next ``seconds``: the machine's busy CPU time
    (/proc/stat) less this process's own (/proc/self/stat), per second; None without /proc."""
    first = _cpu_ticks()
    if first is None:
        return None
    time.sleep(seconds)
    second = _cpu_ticks()
    if second is None:
        return None
    total = second[0] - first[0]
    if total <= 0:
        return None
    busy = (second[1] - first[1]) - (second[2] - first[2])
    online = os.cpu_count() or 1
    return max(0.0, busy / total * online)


def _cpu_ticks() -> tuple[int, int, int] | None:
    """(all CPU ticks, busy ticks, this process's ticks) since boot, None without /proc."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            fields = [int(x) for x in stat.readline().split()[1:]]
        with open("/proc/self/stat", encoding="ascii") as process:
            after_name = process.read().rsplit(")", 1)[1].split()
    except (OSError, ValueError, IndexError):
        return None
    if len(fields) < 5 or len(after_name) < 13:
        return None
    idle = fields[3] + fields[4]  # idle + iowait
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal (not guest: in user)
    own = int(after_name[11]) + int(after_name[12])  # utime + stime
    return total, total - idle, own


def default_threads(load: float | None = None, usable: int | None = None,
                    online: int | None = None) -> int:
    """Threads for a run that does not name a count: ``usable`` cores (default: this process's)
    minus the busy ones, at least 1. The busy cores are ``load``, the machine's cores busy with
    other work (default: system_load, now), times the share of the machine's ``online`` cores
    this process may use (a container limited to 2 of 64 cores sees the host's load), rounded
    to the nearest core."""
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
