"""The acceptance rule as a pure function, on hand-made distributions (docs/design.md, "Lossless
acceptance")."""

from __future__ import annotations

import numpy as np
import pytest

from localspec import _core
from tests.fixtures.stats_helpers import P_VALUE_FLOOR, chi_square_pvalue, sample_dense

# A 6-token vocabulary where the draft q is deliberately wrong in both directions.
P0 = np.array([0.40, 0.25, 0.15, 0.10, 0.10, 0.00])
Q0 = np.array([0.10, 0.50, 0.05, 0.05, 0.10, 0.20])
P1 = np.array([0.05, 0.05, 0.50, 0.30, 0.05, 0.05])
Q1 = np.array([0.30, 0.10, 0.20, 0.10, 0.20, 0.10])
P2 = np.array([0.20, 0.20, 0.20, 0.20, 0.10, 0.10])
N_TRIALS = 6000


def as_probs(p: np.ndarray) -> dict[int, float]:
    return {i: float(v) for i, v in enumerate(p) if v > 0}


def draw_drafts(rng: np.random.Generator) -> list[int]:
    return [sample_dense(Q0, rng), sample_dense(Q1, rng)]


def speculative_rule(drafts: list[int], seed: int) -> list[int]:
    """Tokens one step emits under the implemented rule."""
    out = _core.testing.accept_sampled(drafts, [P0, P1, P2], [Q0, Q1], seed)
    return drafts[: out["n_accepted"]] + [out["token"]]


def always_accept_rule(drafts: list[int], seed: int) -> list[int]:
    return drafts + [sample_dense(P2, np.random.default_rng(seed))]


def correction_from_p_rule(drafts: list[int], seed: int) -> list[int]:
    """A subtle bug: right acceptance test, but the correction is drawn from p, not p - q."""
    rng = np.random.default_rng(seed)
    emitted = []
    for d, p, q in zip(drafts, (P0, P1), (Q0, Q1), strict=False):
        if rng.random() < min(1.0, p[d] / q[d]):
            emitted.append(d)
            continue
        return emitted + [sample_dense(p, rng)]
    return emitted + [sample_dense(P2, rng)]


def first_and_second(rule, trials: int = N_TRIALS) -> tuple[list[int], list[int]]:
    """First emitted tokens, and second emitted tokens when the first was an accepted d1."""
    rng = np.random.default_rng(1234)
    first, second = [], []
    for seed in range(trials):
        drafts = draw_drafts(rng)
        emitted = rule(drafts, seed)
        first.append(emitted[0])
        if len(emitted) >= 2:
            second.append(emitted[1])
    return first, second


def test_greedy_accepts_matching_prefix_then_corrects() -> None:
    out = _core.testing.accept_greedy([5, 7, 9], [5, 7, 2, 4])
    assert out == {"n_accepted": 2, "token": 2, "bonus": False}


def test_greedy_all_accepted_gives_bonus() -> None:
    out = _core.testing.accept_greedy([5, 7], [5, 7, 11])
    assert out == {"n_accepted": 2, "token": 11, "bonus": True}


def test_greedy_first_mismatch_is_correction() -> None:
    assert _core.testing.accept_greedy([1], [3, 8]) == {"n_accepted": 0, "token": 3, "bonus": False}


def test_sampled_point_mass_draft_that_p_rules_out_is_always_rejected() -> None:
    for seed in range(200):
        out = _core.testing.accept_sampled([5], [P0, P1], [], seed)  # p(5) == 0
        assert out["n_accepted"] == 0 and out["token"] != 5


def test_sampled_identical_p_and_q_accept_everything() -> None:
    for seed in range(200):
        out = _core.testing.accept_sampled([0, 2], [P0, P1, P2], [P0, P1], seed)
        assert out["n_accepted"] == 2 and out["bonus"]


def test_speculative_sampling_matches_target_distribution() -> None:
    first, second = first_and_second(speculative_rule)
    assert chi_square_pvalue(first, as_probs(P0)) > P_VALUE_FLOOR
    assert chi_square_pvalue(second, as_probs(P1)) > P_VALUE_FLOOR


def test_deterministic_draft_matches_target_distribution() -> None:
    """q is a point mass (n-gram drafter): accept d with p(d), else sample p without d."""
    samples = []
    for seed in range(N_TRIALS):
        out = _core.testing.accept_sampled([1], [P0, P1], [], seed)
        samples.append(1 if out["n_accepted"] else out["token"])
    assert chi_square_pvalue(samples, as_probs(P0)) > P_VALUE_FLOOR


@pytest.mark.parametrize("broken_rule", [always_accept_rule, correction_from_p_rule])
def test_the_same_test_rejects_broken_rules(broken_rule) -> None:
    first, _second = first_and_second(broken_rule)
    assert chi_square_pvalue(first, as_probs(P0)) < 1e-6


def test_same_seed_same_decision() -> None:
    a = [_core.testing.accept_sampled([1, 3], [P0, P1, P2], [Q0, Q1], s) for s in range(50)]
    b = [_core.testing.accept_sampled([1, 3], [P0, P1, P2], [Q0, Q1], s) for s in range(50)]
    assert a == b


def test_warp_top_k_top_p_min_p() -> None:
    logits = np.log(np.array([0.5, 0.2, 0.15, 0.1, 0.05], dtype=np.float32))
    ids, probs = _core.testing.warp(
        logits, _core.SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    )
    assert ids == [0, 1, 2, 3, 4] and probs == pytest.approx([0.5, 0.2, 0.15, 0.1, 0.05], rel=1e-5)
    ids, _ = _core.testing.warp(
        logits, _core.SamplingParams(temperature=1.0, top_k=3, top_p=1.0, min_p=0.0)
    )
    assert ids == [0, 1, 2]
    ids, _ = _core.testing.warp(
        logits, _core.SamplingParams(temperature=1.0, top_k=0, top_p=0.8, min_p=0.0)
    )
    assert ids == [0, 1, 2]  # 0.5 + 0.2 < 0.8 <= 0.85
    ids, _ = _core.testing.warp(
        logits, _core.SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.25)
    )
    assert ids == [0, 1, 2]  # >= 0.25 * 0.5
    _, probs = _core.testing.warp(
        logits, _core.SamplingParams(temperature=0.5, top_k=2, top_p=1.0, min_p=0.0)
    )
    assert probs == pytest.approx([0.25 / 0.29, 0.04 / 0.29], rel=1e-4)  # squared, renormalised


def test_coupled_rule_emits_what_plain_sampling_would() -> None:
    """Deterministic drafts are checked against the target's own sample at each position's
    uniform, so the first emitted token is the plain sample whatever was drafted."""
    rng = np.random.default_rng(7)
    for _ in range(500):
        u = list(rng.random(3))
        plain_first = _core.testing.accept_coupled([], [P0], u[:1])["token"]
        for drafts in ([0], [1, 2], [4, 4]):
            rows = len(drafts) + 1
            out = _core.testing.accept_coupled(drafts, [P0, P1, P2][:rows], u[:rows])
            first = drafts[0] if out["n_accepted"] else out["token"]
            assert first == plain_first


def test_coupled_rule_accepts_with_p_and_matches_the_target_distribution() -> None:
    rng = np.random.default_rng(11)
    first, accepted = [], 0
    for _ in range(N_TRIALS):
        out = _core.testing.accept_coupled([1], [P0, P1], list(rng.random(2)))
        accepted += out["n_accepted"]
        first.append(1 if out["n_accepted"] else out["token"])
    assert chi_square_pvalue(first, as_probs(P0)) > P_VALUE_FLOOR
    assert accepted / N_TRIALS == pytest.approx(P0[1], abs=0.03)


@pytest.mark.parametrize("n", [1, 5, 16, 17, 100, 4099])
def test_warp_top_k_keeps_exactly_the_k_best(n: int) -> None:
    """The one-pass top-k (blocks skipped when nothing in them beats the k-th best) keeps the
    same ids in the same order as a full sort: descending logit, ties by ascending id."""
    rng = np.random.default_rng(n)
    for _ in range(10):
        logits = rng.integers(-6, 6, size=n).astype(np.float32)  # many ties
        order = np.lexsort((np.arange(n), -logits))
        for top_k in {1, 3, 40, max(n - 1, 1), n, n + 5}:
            ids, _ = _core.testing.warp(
                logits, _core.SamplingParams(temperature=1.0, top_k=top_k, top_p=1.0, min_p=0.0)
            )
            assert ids == [int(i) for i in order[: min(top_k, n)]]
