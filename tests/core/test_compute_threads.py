"""An idle engine gives back its compute threads (csrc/kernels/head_common.h,
release_compute_threads).
libgomp spins at a barrier only while it manages no more threads than the CPU has; each engine
thread has its own OpenMP workers, so an idle engine that kept them would make every other
engine's passes sleep and wake at each barrier (two engines on 2 cores: the busy one ~30%
slower, docs/design.md "Threading")."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from localspec import Engine, _core
from localspec.types import GenerationParams
from tests.kernels.test_q8_head import q8_0_bytes

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(),
                                reason="counts threads in /proc")


def thread_count() -> int:
    return len(os.listdir("/proc/self/task"))


def settled_thread_count(at_most: int, seconds: float = 10.0) -> int:
    """The thread count once it is at most ``at_most`` (workers end asynchronously), or the
    count after ``seconds``."""
    deadline = time.monotonic() + seconds
    while thread_count() > at_most and time.monotonic() < deadline:
        time.sleep(0.05)
    return thread_count()


def settled_new_threads(before: set[str], seconds: float = 10.0) -> set[str]:
    """The threads not among ``before`` once none is left (workers end asynchronously), or
    those left after ``seconds``. Threads of ``before`` may end meanwhile (an earlier test's)."""
    deadline = time.monotonic() + seconds
    while set(os.listdir("/proc/self/task")) - before and time.monotonic() < deadline:
        time.sleep(0.05)
    return set(os.listdir("/proc/self/task")) - before


def skip_without_openmp() -> None:
    if "libgomp" not in Path("/proc/self/maps").read_text():
        pytest.skip("llama.cpp's CPU backend here does not run on OpenMP")


def test_an_idle_engine_keeps_no_compute_workers(tiny_model_path: Path) -> None:
    skip_without_openmp()
    params = GenerationParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    with Engine.load(tiny_model_path, draft="none", n_ctx=256, n_threads=3) as engine:
        busy = 0
        for _ in engine.stream("Once upon a time", params):
            busy = max(busy, thread_count())  # the engine thread and its 2 workers are up
        assert settled_thread_count(busy - 2) <= busy - 2
        # The next request starts new workers and generates as before.
        again = engine.generate("Once upon a time", params)
        assert again.stats.n_tokens == 24


@pytest.mark.skipif(not _core.q8_head_supported(), reason="the Q8_0 head needs AVX2 or VNNI")
def test_a_computation_on_the_callers_thread_keeps_no_workers() -> None:
    """A binding that computes on the calling Python thread (here the Q8_0 head on 2 threads)
    ends that thread's workers when it returns: kept, they slow every engine after it."""
    skip_without_openmp()
    rng = np.random.default_rng(0)
    blocks = q8_0_bytes(rng.standard_normal((256, 64)))
    hidden = rng.standard_normal((4, 64)).astype(np.float32)
    before = set(os.listdir("/proc/self/task"))
    for _ in range(3):
        _core.testing.q8_head_logits(blocks, 256, 64, hidden, n_threads=2)
    # Compared by thread id, not by count: an earlier test's thread that ends meanwhile made the
    # count one lower than before (a suite run under two busy loops).
    assert settled_new_threads(before) == set()
