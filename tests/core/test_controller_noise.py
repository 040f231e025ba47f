"""The controller on a busy machine (docs/design.md, "The controller", "A shared CPU"), with a
fake clock: made-up pass costs, jittered at random as another process would, and made-up
acceptance. What turns a useless drafter off is its acceptance record, never its timings;
probes are bounded in count; noisy timings hand the decision to acceptance."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from localspec import _core

from .test_controller_bound import calibrated, gemma_cpu

HEAD = 0  # the slot of a draft model or head
LOOKUP = 3  # an n-gram lookup with a 3-token match


def tiny_cpu(rows: int) -> float:
    """A tiny target whose second row costs 20% of a pass (tests/draft's EAGLE-3 target):
    cheap probes, the case the time bound alone let run on."""
    return 0.004 * (1 + 0.2 * (rows - 1))


def busy(verify: Callable[[int], float], rng: np.random.Generator,
         spread: float = 3.0) -> Callable[[int], float]:
    """Pass costs on a shared CPU: each pass costs its quiet cost times a random factor in
    [1, 1 + spread] (another process preempts a worker thread; time is only ever added)."""
    return lambda rows: verify(rows) * (1 + spread * rng.random())


def cheap_rows(verify: Callable[[int], float], rng: np.random.Generator) -> Callable[[int], float]:
    """The adversary of a timing-based controller: a one-row pass is preempted most of the
    time and a longer one hardly ever, so drafting looks free or better."""
    return lambda rows: verify(rows) * (1 + (2.0 if rows == 1 and rng.random() < 0.7 else 0.1))


def run_steps(controller: _core.testing.DraftController, steps: int,
              accept: float, verify: Callable[[int], float], rng: np.random.Generator,
              slot: int = HEAD, limit: int = 15) -> list[int]:
    """``steps`` choices of one request against a drafter of per-token acceptance ``accept``."""
    controller.begin_request()
    chosen = []
    for _ in range(steps):
        k = controller.choose(slot, limit)
        n = 0
        while n < k and rng.random() < accept:
            n += 1
        controller.observe(k, n, 0.0, verify(k + 1), slot)
        chosen.append(k)
    return chosen


def test_a_useless_head_is_turned_off_by_its_acceptance_whatever_the_timings() -> None:
    """A head accepted 1% of the time, from a fresh controller, on passes whose costs make
    drafting look free: after a few dozen probes its record turns it off, and from then on it
    drafts one token per recheck, the rechecks spaced 32, 64, 128 ... steps apart."""
    for seed in range(5):
        rng = np.random.default_rng(seed)
        controller = calibrated(15, tiny_cpu)
        chosen = run_steps(controller, 2000, 0.01, cheap_rows(tiny_cpu, rng), rng)
        assert not controller.worth_probing(HEAD)
        off = next(i for i in range(len(chosen)) if sum(chosen[i:]) <= 6)
        assert off < 400, (seed, off)  # off within a few hundred steps ...
        # ... and after that at most log2(steps / 32) + 1 rechecks of one token
        assert max(chosen[off:]) <= 1 and sum(chosen[off:]) <= 6


def test_a_head_whose_record_says_useless_is_not_probed_at_all() -> None:
    """Memory from a run with a fixed draft length (every step observed) is enough: a new
    request drafts nothing before its first recheck, and later ones stay within the spacing."""
    rng = np.random.default_rng(1)
    controller = calibrated(15, tiny_cpu)
    controller.begin_request()
    for _ in range(300):  # a fixed draft length of 3: what the engine feeds it from every step
        controller.observe(3, int(rng.random() < 0.01), 0.0, tiny_cpu(4), HEAD)
    assert not controller.worth_probing(HEAD)
    chosen = run_steps(controller, 31, 0.01, cheap_rows(tiny_cpu, rng), rng)
    assert sum(chosen) == 0
    chosen = run_steps(controller, 400, 0.01, cheap_rows(tiny_cpu, rng), rng)
    assert sum(chosen) <= 4 and max(chosen) <= 1


def test_probes_are_bounded_in_count() -> None:
    """A drafter accepted 12% of the time: above the gate, and on a target whose second row
    costs 20% of a pass, rarely worth exploiting, so most drafts are probes, each cheap enough
    for the time budget to pay one every ten tokens or so. The count bound holds them to
    4 + 1/16 of a request's steps."""
    rng = np.random.default_rng(2)
    controller = calibrated(15, tiny_cpu)
    seen = 0
    for steps in (16, 64, 256, 1024):
        run_steps(controller, steps, 0.12, tiny_cpu, rng)
        assert controller.worth_probing(HEAD)
        assert controller.probes <= 4 + steps / 16, (steps, controller.probes)
        seen = max(seen, controller.probes)
    assert seen >= 4 + 1024 / 16 - 1  # the bound is what held them, not the budget


def test_noisy_timings_are_measured() -> None:
    rng = np.random.default_rng(3)
    quiet = calibrated(15, gemma_cpu)
    run_steps(quiet, 300, 0.9, gemma_cpu, rng, slot=LOOKUP)
    assert quiet.timing_noise < 0.05 and not quiet.noisy
    shared = calibrated(15, gemma_cpu)
    run_steps(shared, 300, 0.9, busy(gemma_cpu, rng), rng, slot=LOOKUP)
    assert shared.timing_noise > 0.15 and shared.noisy  # it went past 0.25 and stays above 0.15


def test_with_noisy_timings_acceptance_decides() -> None:
    """On a busy machine a good drafter still drafts (its acceptance says so) and a poor one
    does not, however cheap a pass looks at random."""
    rng = np.random.default_rng(4)
    good = calibrated(15, gemma_cpu)
    chosen = run_steps(good, 400, 0.9, busy(gemma_cpu, rng), rng, slot=LOOKUP)
    assert good.noisy
    assert sum(k > 0 for k in chosen[200:]) > 0.9 * 200
    poor = calibrated(15, gemma_cpu)
    chosen = run_steps(poor, 400, 0.2, busy(gemma_cpu, rng), rng, slot=LOOKUP)
    assert poor.noisy
    assert sum(k > 0 for k in chosen[200:]) <= 200 / 16
