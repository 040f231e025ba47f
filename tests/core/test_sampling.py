"""Speculative sampling on real models is distributed exactly as the target (docs/design.md,
"Lossless acceptance").

The exact next-token distribution comes from the target's own logits, warped with the same
parameters; generations over many seeds must fit it (chi-square). The same test, fed samples
from a broken rule built on the same real distributions, must fail: the test has power.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from localspec import _core
from localspec.runtime.engine import Engine
from localspec.types import GenerationParams
from tests.fixtures.stats_helpers import P_VALUE_FLOOR, chi_square_pvalue

PARAMS = GenerationParams(temperature=1.0, top_k=10, top_p=1.0, min_p=0.0, max_tokens=2)
N_SEEDS = 3000
PROMPTS = {
    "model": "the quick brown fox",
    # Repetition gives the n-gram drafter something to propose.
    "ngram": "the cat sat on the mat and the cat sat on the",
}


def exact(engine: Engine, tokens: list[int]) -> dict[int, float]:
    sp = _core.SamplingParams(
        temperature=PARAMS.temperature, top_k=PARAMS.top_k, top_p=PARAMS.top_p, min_p=PARAMS.min_p
    )
    ids, probs = _core.testing.warp(engine.next_token_logits(tokens), sp)
    return dict(zip(ids, probs, strict=False))


@pytest.fixture(scope="module")
def draft_engine(tiny_draft_path):
    engine = Engine.load(tiny_draft_path, draft="none", n_ctx=256)
    yield engine
    engine.close()


@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_first_two_tokens_follow_the_target_distribution(engines, drafter: str) -> None:
    engine = engines[drafter]
    prompt = engine.tokenize(PROMPTS[drafter])
    outputs = [engine.generate(prompt, PARAMS, seed=seed, draft_max=3) for seed in range(N_SEEDS)]
    assert sum(o.stats.drafted for o in outputs) > N_SEEDS // 2, "the drafter must actually draft"
    assert sum(o.stats.rejected for o in outputs) > 0, (
        "rejections must occur for the test to mean much"
    )

    first = [o.tokens[0] for o in outputs]
    assert chi_square_pvalue(first, exact(engine, prompt)) > P_VALUE_FLOOR

    # Second token, conditional on the most frequent first token.
    top = Counter(first).most_common(1)[0][0]
    second = [o.tokens[1] for o in outputs if o.tokens[0] == top]
    assert chi_square_pvalue(second, exact(engine, prompt + [top])) > P_VALUE_FLOOR


def test_the_same_test_rejects_always_accept(engines, draft_engine) -> None:
    """'Always accept the draft' would emit the draft's q; on these real models that fails."""
    prompt = engines["model"].tokenize(PROMPTS["model"])
    p = exact(engines["model"], prompt)
    q = exact(draft_engine, prompt)
    rng = np.random.default_rng(0)
    ids = list(q)
    samples = list(rng.choice(ids, size=N_SEEDS, p=np.array([q[i] for i in ids]) / sum(q.values())))
    assert chi_square_pvalue([int(s) for s in samples], p) < 1e-6


def test_argmax_is_the_first_index_of_the_largest_logit() -> None:
    """The vectorised argmax keeps std::max_element's rule: the first maximum wins, NaN never
    does (unless every value is NaN), any length (not only multiples of its 16 lanes)."""
    rng = np.random.default_rng(7)
    for n in [1, 2, 15, 16, 17, 31, 33, 262_144, 1_000]:
        for _ in range(20):
            logits = rng.integers(-3, 4, size=n).astype(np.float32)  # many ties
            if n > 2:
                logits[rng.integers(1, n)] = np.nan
                logits[rng.integers(0, n)] = -np.inf
            expected = int(np.argmax(np.where(np.isnan(logits), -np.inf, logits)))
            assert _core.testing.argmax(logits) == expected
    assert _core.testing.argmax(np.full(40, -np.inf, dtype=np.float32)) == 0
    assert _core.testing.argmax(np.full(40, np.nan, dtype=np.float32)) == 0


def test_top_probability_matches_a_double_precision_softmax() -> None:
    """The draft's confidence (vectorised exponentials) against numpy in float64, for peaked
    and flat distributions, lengths that are not multiples of the 8 lanes, and logits far
    below the maximum (their exponentials underflow)."""
    rng = np.random.default_rng(11)
    for n in [1, 7, 8, 9, 1000, 262_144, 262_147]:
        for scale in (0.1, 3.0, 30.0):
            logits = (rng.standard_normal(n) * scale).astype(np.float32)
            if n > 10:
                logits[:5] = -1e4
            shifted = logits.astype(np.float64) - logits.max()
            expected = 1.0 / np.exp(shifted).sum()
            assert _core.testing.top_probability(logits) == pytest.approx(expected, rel=1e-5)
