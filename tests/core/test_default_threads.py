"""The default thread count on a shared CPU (localspec/runtime/threads.py) with made-up load
figures, and the note for a run far below its timed speed."""

from __future__ import annotations

import pytest

from localspec.runtime import threads
from localspec.runtime.loading import LoadOptions
from localspec.runtime.threads import default_threads, slow_run_note


@pytest.mark.parametrize(("load", "expected"), [
    (0.0, 2), (0.3, 2),  # quiet: every usable core
    (1.0, 1), (2.0, 1), (2.3, 1), (9.0, 1),  # one or two other busy processes: one thread
])
def test_two_cores_leave_out_the_busy_ones(load: float, expected: int) -> None:
    assert default_threads(load=load, usable=2, online=2) == expected


def test_more_cores() -> None:
    assert default_threads(load=0.2, usable=8, online=8) == 8
    assert default_threads(load=2.6, usable=8, online=8) == 5
    assert default_threads(load=16.0, usable=8, online=8) == 1


def test_a_process_on_part_of_the_machine_counts_its_share_of_the_load() -> None:
    """A container limited to 2 of 64 cores sees the whole host's load average."""
    assert default_threads(load=8.0, usable=2, online=64) == 2
    assert default_threads(load=48.0, usable=2, online=64) == 1


def test_without_a_load_figure_every_usable_core(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threads, "system_load", lambda: None)
    assert default_threads(usable=4, online=4) == 4


def test_the_load_options_decide_the_count_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threads, "system_load", lambda: 1.0)
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 2)
    assert LoadOptions(target="t.gguf").with_threads().n_threads == 1
    assert LoadOptions(target="t.gguf", n_threads=2).with_threads().n_threads == 2  # given


def test_a_run_far_below_its_timed_speed_names_threads() -> None:
    """The issue's run: 1.1 tokens/s on 2 threads where a pass was timed at 0.05 s."""
    note = slow_run_note(tokens_per_second=1.1, n_tokens=64, plain_pass_seconds=0.05, threads=2)
    assert note is not None and "--threads 1" in note and "\n" not in note
    assert slow_run_note(12.0, 64, 0.05, 2) is None  # 12 of the 20 timed: not far below
    assert slow_run_note(1.1, 8, 0.05, 2) is None  # too short to judge
    assert slow_run_note(1.1, 64, 0.0, 2) is None  # passes never timed (plain decoding)
    assert slow_run_note(1.1, 64, 0.05, 1) is None  # one thread: nothing fewer to try
    assert slow_run_note(100.0, 64, 0.0005, 4) is None  # a tiny model's passes: not judged


def test_busy_cores_are_other_processes_cpu_time_now(monkeypatch: pytest.MonkeyPatch) -> None:
    """Measured over a short window from /proc (not the 1-minute load average, which still
    counts a build that ended a minute ago), less this process's own time."""
    samples = iter([(1000, 300, 50), (1100, 390, 90)])  # (all ticks, busy ticks, own ticks)
    monkeypatch.setattr(threads, "_cpu_ticks", lambda: next(samples))
    monkeypatch.setattr(threads.time, "sleep", lambda seconds: None)
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 2)
    # 90 of 100 ticks busy, 40 of them this process's: 50 / 100 of 2 cores = one core.
    assert threads.busy_cores_now() == pytest.approx(1.0)
    monkeypatch.setattr(threads, "_cpu_ticks", lambda: None)
    assert threads.busy_cores_now() is None


def test_the_real_proc_files_are_read() -> None:
    ticks = threads._cpu_ticks()
    if ticks is None:
        pytest.skip("no /proc on this system")
    total, busy, own = ticks
    assert 0 <= busy <= total and own >= 0
