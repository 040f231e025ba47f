"""Helpers shared by the test modules: the command line as a user runs it (a subprocess), and
a few pieces several drafting tests use."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any


def run_localspec(*args: str, stdin: str | None = None, env: dict[str, str] | None = None,
                  timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``localspec ARGS`` in a child process (this interpreter), its output captured as text."""
    return subprocess.run([sys.executable, "-m", "localspec.cli", *args], input=stdin,
                          capture_output=True, text=True, timeout=timeout, env=env)


def run_bench(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``localspec bench --threads 1 ARGS``."""
    return run_localspec("bench", "--threads", "1", *args, env=env)


def mtp_core_alone(target: str | os.PathLike[str]) -> Any:
    """A core drafting with the target's MTP layers alone: no n-gram lookup in front (no match
    length is ever tried), every draft the layers'."""
    from localspec import _core

    options = _core.EngineOptions()
    options.target_path, options.drafter = str(target), "mtp"
    options.n_ctx, options.n_threads, options.draft_p_min = 1024, 1, 0.0
    options.ngram_min, options.ngram_max = 9, 8
    return _core.Core(options)


def length_one_walk(right: list[bool], n: int) -> tuple[int, int]:
    """(drafted, accepted) of n generated tokens drafted one at a time, where right[m] says
    whether the draft for output position m is the target's token: an accepted draft emits it
    and the bonus token, so the next draft is for m + 2; a rejected one, for m + 1."""
    drafted = accepted = m = 0
    while m <= n - 2:
        drafted += 1
        accepted += right[m]
        m += 2 if right[m] else 1
    return drafted, accepted


def length_one_counts(p: Any, q: Any, start: int, ids: Any, first: int, n: int) -> tuple[int, int]:
    """(drafted, accepted) of n greedy tokens drafted one at a time, from the target's rows p
    (p[j]: after tokens[0..j]) and a drafter's rows q as localspec.draft_agreement gives them
    (q[j - start], over the draft vocabulary `ids`): the draft for output position m is right
    where argmax q == argmax p at row first + m."""
    from localspec.draft_agreement import agreement

    right = [agreement(p[j : j + 1], q[j - start : j - start + 1], ids).top1 == 1.0
             for j in range(first, first + n)]
    return length_one_walk(right, n)
