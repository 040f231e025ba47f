"""The draft-length controller's decisions, driven by a fake cost model (no clocks involved)."""

from __future__ import annotations

import numpy as np
import pytest

from localspec import _core


def simulate(
    controller: _core.testing.DraftController,
    accept: float,
    draft_cost: float,
    verify,
    steps: int,
    seed: int = 0,
    available: int | None = None,
) -> list[int]:
    """Run `steps` steps against a made-up machine; return the k chosen at each step.

    verify(rows) gives the seconds of a target pass; each drafted token costs draft_cost;
    each drafted token is accepted with probability `accept` until the first rejection.
    """
    rng = np.random.default_rng(seed)
    chosen = []
    for _ in range(steps):
        k = controller.choose()
        chosen.append(k)
        k_used = min(k, available) if available is not None else k
        n = 0
        while n < k_used and rng.random() < accept:
            n += 1
        controller.observe(k_used, n, draft_cost * k_used, verify(k_used + 1))
    return chosen


def calibrated(k_max: int, verify) -> _core.testing.DraftController:
    """A controller that knows every pass size's cost, as the engine's start-up timing gives it
    (SpecEngine::calibrate); acceptance it still has to learn."""
    controller = _core.testing.DraftController(k_max)
    for rows in range(1, k_max + 2):
        controller.seed_verify_seconds(rows, verify(rows))
    return controller


def optimum(accept: float, draft_cost: float, verify, k_max: int) -> int:
    def rate(k: int) -> float:
        return (1 - accept ** (k + 1)) / (1 - accept) / (k * draft_cost + verify(k + 1))

    return max(range(k_max + 1), key=rate)


def cpu_like(rows: int) -> float:
    """Verification that grows steeply with rows (large vocabulary on a CPU)."""
    return 0.017 * (1 + 0.45 * (rows - 1))


def gpu_like(rows: int) -> float:
    """Verification that is almost flat in rows (memory-bound GPU)."""
    return 0.010 * (1 + 0.03 * (rows - 1))


def test_starts_with_a_plain_pass_to_measure_the_baseline() -> None:
    assert _core.testing.DraftController(8).choose() == 0


@pytest.mark.parametrize("verify", [cpu_like, gpu_like])
@pytest.mark.parametrize("accept", [0.5, 0.8, 0.95])
def test_converges_to_the_best_draft_length(verify, accept: float) -> None:
    controller = calibrated(12, verify)
    chosen = simulate(controller, accept, draft_cost=0.0005, verify=verify, steps=400)
    best = optimum(accept, 0.0005, verify, 12)
    settled = chosen[-100:]
    # Near the optimum the rate curve is flat; allow one step either side.
    assert abs(int(np.median(settled)) - best) <= 1, (best, settled[-20:])


def test_chooses_plain_decoding_when_drafts_are_rarely_right() -> None:
    """A cheap drafter that is rarely right: k goes to 0, with occasional probes."""
    controller = _core.testing.DraftController(8)
    chosen = simulate(controller, accept=0.05, draft_cost=0.0005, verify=cpu_like, steps=300)
    settled = chosen[-160:]
    assert settled.count(0) / len(settled) > 0.85
    assert any(k > 0 for k in settled), "it must keep probing so it can notice a change"


def test_stops_drafting_when_even_perfect_drafts_cannot_pay() -> None:
    """A draft model costing most of a target pass (an F16 target with its own Q4 copy on a
    CPU): even acceptance 1 loses, so after learning the costs it never drafts again."""
    controller = _core.testing.DraftController(8)
    chosen = simulate(controller, accept=0.95, draft_cost=0.012, verify=cpu_like, steps=600)
    assert chosen[-200:].count(0) == 200


def test_notices_when_acceptance_improves() -> None:
    controller = _core.testing.DraftController(8)
    simulate(controller, accept=0.1, draft_cost=0.0005, verify=cpu_like, steps=200)
    later = simulate(controller, accept=0.97, draft_cost=0.0005, verify=cpu_like, steps=300, seed=1)
    assert np.median(later[-100:]) >= 3


def test_acceptance_estimate_and_costs_are_learned() -> None:
    controller = _core.testing.DraftController(8)
    simulate(controller, accept=0.7, draft_cost=0.001, verify=gpu_like, steps=500)
    assert controller.acceptance() == pytest.approx(0.7, abs=0.12)
    assert controller.verify_seconds(1) == pytest.approx(gpu_like(1), rel=0.05)


def test_never_drafts_without_a_drafter() -> None:
    controller = _core.testing.DraftController(0)
    assert set(simulate(controller, 0.9, 0.0, gpu_like, 50)) == {0}


def repacked_cpu(rows: int) -> float:
    """llama.cpp's repacked CPU kernels: multiples of 4 rows are cheap, leftover rows are not
    (measured on Gemma 3 270M: 4 rows 2.8x one, 7 rows 4.8x, 8 rows 3.4x)."""
    return 0.012 * (1 + 0.6 * (rows // 4) + 1.0 * (rows % 4) - (0.6 if rows % 4 == 0 else 0))


def test_finds_cheap_batch_sizes_in_a_non_linear_cost_curve() -> None:
    controller = calibrated(15, repacked_cpu)
    chosen = simulate(controller, accept=0.9, draft_cost=0.0002, verify=repacked_cpu, steps=600)
    best = optimum(0.9, 0.0002, repacked_cpu, 15)
    assert (best + 1) % 4 == 0
    settled = chosen[-100:]
    assert max(set(settled), key=settled.count) == best, (best, settled[-20:])


def test_limit_bounds_the_choice() -> None:
    controller = _core.testing.DraftController(15)
    simulate(controller, accept=0.95, draft_cost=0.0, verify=gpu_like, steps=200)
    assert controller.choose(0, 3) <= 3


def test_probes_get_rarer_while_plain_decoding_keeps_winning() -> None:
    """A drafter that is almost never right: probes are paid from the request's 2% budget and
    the evidence against it grows, so they stay rare."""
    controller = _core.testing.DraftController(8)
    chosen = simulate(controller, accept=0.02, draft_cost=0.0005, verify=cpu_like, steps=1000)
    probes = [i for i, k in enumerate(chosen) if k > 0]
    assert len(probes) < 30  # a fixed interval of 8 would give more than 100
    later = simulate(controller, accept=0.97, draft_cost=0.0005, verify=cpu_like, steps=200)
    assert np.median(later[-100:]) >= 3  # and a change is still noticed


def test_each_kind_of_draft_has_its_own_cost() -> None:
    """The hybrid drafter: free n-gram drafts (kind = match length) and an expensive draft
    model (kind 0) under one controller. The model's cost must not stop the free drafts."""
    controller = _core.testing.DraftController(8)
    rng = np.random.default_rng(5)
    lookups = []
    for step in range(600):
        kind = 3 if step % 2 else 0  # every other step the context has a 3-token match
        k = controller.choose(kind, 6 if kind else 1 << 30)
        if kind:
            lookups.append(k)
        n = 0
        while n < k and rng.random() < 0.9:
            n += 1
        draft_seconds = 0.0 if kind else 0.012 * k  # the model costs most of a target pass
        controller.observe(k, n, draft_seconds, cpu_like(k + 1), kind)
    assert controller.draft_seconds_per_token(3) == pytest.approx(0.0)
    assert controller.draft_seconds_per_token(0) == pytest.approx(0.012)
    assert np.median(lookups[-100:]) >= 2  # free drafts keep being verified


def test_changes_the_pass_shape_less_where_changing_it_costs() -> None:
    """Over RPC a pass whose row count differs from the last one's costs more (ggml sends the
    workers a new graph). With proposals of varying length (as n-gram lookups give) a
    controller blind to that changes shape about 540 times in these 6 x 300 steps and makes
    ~174 tokens/s; one that learns both costs keeps its shape more often and loses less."""
    change = 0.008
    changes, rates = 0, []
    for seed in range(6):
        controller = _core.testing.DraftController(12)
        rng = np.random.default_rng(seed)
        previous, tokens, seconds = 0, 0, 0.0
        for step in range(800):
            limit = int(rng.integers(1, 13)) if rng.random() < 0.5 else 12
            k = controller.choose(0, limit)
            n = 0
            while n < k and rng.random() < 0.7:
                n += 1
            pass_seconds = gpu_like(k + 1) + (change if k + 1 != previous else 0.0)
            controller.observe(k, n, 0.0005 * k, pass_seconds)
            if step >= 500:
                changes += k + 1 != previous
                tokens, seconds = tokens + n + 1, seconds + pass_seconds + 0.0005 * k
            previous = k + 1
        rates.append(tokens / seconds)
    assert changes < 450, changes
    assert np.mean(rates) > 177, rates


FORCED = 8  # the slot of grammar-forced text (DraftKind::kForcedSlot)


def test_grammar_forced_text_is_drafted_from_a_requests_first_step() -> None:
    """The grammar allows forced text alone, so its prior acceptance is high: a fresh controller
    with no credit yet drafts it at once (a tool call's syntax is a few steps long) where a
    second row costs half a pass; a kind with the even prior does not."""
    def verify(rows: int) -> float:
        return 0.004 * (1 + 0.5 * (rows - 1))

    controller = calibrated(15, verify)
    controller.begin_request()
    assert controller.choose(FORCED, 6) > 0
    assert calibrated(15, verify).choose(1, 6) == 0  # a 1-token lookup must earn its probes
    # Its own misses outweigh the prior within one request.
    for _ in range(30):
        k = controller.choose(FORCED, 6)
        controller.observe(k, 0, 0.0, verify(k + 1), FORCED)
    assert controller.choose(FORCED, 6) == 0


def test_a_draft_models_catch_up_is_priced_once_and_kept_out_of_its_cost_per_token() -> None:
    """A draft model that did not draft for a while first catches up over what was emitted
    meanwhile (issue 51: on the real pair a probe after n-gram steps paid ~100 rows, which as
    cost per token turned the model off for good). The choice weighs that one-time setup
    against the draft it buys, and the cost per token is learned without it."""
    def verify(rows: int) -> float:  # the real pair on 2 cores: V(1) 49 ms, a row ~8 ms more
        return 0.049 + 0.008 * (rows - 1)

    per_token = 0.020  # D(1) of the 0.5B
    controller = calibrated(8, verify)
    simulate(controller, 0.85, per_token, verify, 200)  # the model drafting at 85% acceptance
    assert controller.choose(0, 8) > 0
    assert controller.draft_seconds_per_token(0) == pytest.approx(per_token, rel=0.01)
    assert controller.choose(0, 8, setup_seconds=0.005) > 0  # a few rows behind: still pays
    assert controller.choose(0, 8, setup_seconds=0.5) == 0  # ~100 rows behind: it cannot
    # A step that paid a setup: the seconds per token stay the model's own.
    k = controller.choose(0, 8, setup_seconds=0.005)
    controller.observe(k, k, 0.3 + k * per_token, verify(k + 1), 0, setup_seconds=0.3)
    assert controller.draft_seconds_per_token(0) == pytest.approx(per_token, rel=0.01)
