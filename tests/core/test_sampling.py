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


def _warp_known_trials(sp: _core.SamplingParams, n_vocab: int, seed: int) -> tuple[int, int, int]:
    """warp_known against warp of the fully masked row, on random rows and allowed sets, the
    known tokens being the allowed ones among the 160 best (as TargetRows checks them; all of
    them when n_vocab <= 160). Returns (rows, decided, decided by min-p alone: fewer than
    top_k known)."""
    rng = np.random.default_rng(seed)
    n_top = 160
    rows = decided = by_min_p = 0
    # Flat rows leave the unknown tokens in play, peaked ones do not; rounded ones tie often
    # (a tie with the last checked token must not be taken as decided).
    for scale, rounded in ((1.0, False), (3.0, False), (8.0, False), (2.0, True)):
        for share in (0.003, 0.03, 0.3, 1.0):  # how much of the vocabulary the grammar allows
            for _ in range(15):
                logits = (rng.standard_normal(n_vocab) * scale).astype(np.float32)
                if rounded:
                    logits = np.round(logits)
                allowed = rng.random(n_vocab) < share
                allowed[rng.integers(n_vocab)] = True
                masked = np.where(allowed, logits, -np.inf).astype(np.float32)
                top = [int(t) for t in np.lexsort((np.arange(n_vocab), -logits))[:n_top]]
                known = [t for t in top if allowed[t]]
                if not known:
                    continue
                bound = -np.inf if len(top) == n_vocab else float(logits[top[-1]])
                got = _core.testing.warp_known(logits, known, bound, sp)  # the unmasked row
                rows += 1
                if got is None:
                    continue
                decided += 1
                by_min_p += len(known) < max(sp.top_k, 1)
                assert got == _core.testing.warp(masked, sp)  # ids and probabilities, bit for bit
    return rows, decided, by_min_p


@pytest.mark.parametrize(
    ("top_k", "top_p", "min_p"),
    [(40, 0.95, 0.05), (40, 1.0, 0.05), (10, 0.5, 0.0), (0, 0.95, 0.1), (1000, 0.9, 0.05)],
)
def test_a_grammar_row_is_warped_from_its_best_tokens_when_they_decide(
    top_k: int, top_p: float, min_p: float
) -> None:
    """A sampled row under a grammar (csrc/sample/target_rows.cpp) checks only its best tokens
    when top-k or min-p leave every other token out: the distribution must be the fully masked
    row's, bit for bit, and the shortcut must be taken in most rows with llama.cpp's defaults."""
    sp = _core.SamplingParams(temperature=0.8, top_k=top_k, top_p=top_p, min_p=min_p)
    rows, decided, by_min_p = _warp_known_trials(sp, 2000, seed=top_k + int(100 * min_p))
    assert rows > 200
    if (top_k, min_p) == (40, 0.05):
        assert decided > rows // 2
        assert by_min_p > 20  # min-p decided rows that top-k could not
    if min_p == 0.0:
        assert by_min_p == 0
    # Every token checked: nothing else may be sampled, whatever the parameters.
    rows, decided, _ = _warp_known_trials(sp, 120, seed=1)
    assert decided == rows > 200
