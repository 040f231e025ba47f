"""Penalties (repetition, frequency, presence) shape the target identically in plain and
speculative decoding: row i of a verification batch judges the window that includes the drafts
before it (docs/design.md, "Lossless acceptance")."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from localspec import _core
from localspec.runtime.engine import Engine
from localspec.types import GenerationParams
from tests.fixtures.stats_helpers import P_VALUE_FLOOR, chi_square_pvalue

PENALTIES = {"repeat_penalty": 1.6, "frequency_penalty": 0.8, "presence_penalty": 1.2}
GREEDY = GenerationParams(temperature=0.0, max_tokens=40, ignore_eos=True, **PENALTIES)
PROMPT = "the cat sat on the mat and the cat sat on the"
# Negative penalties boost what the window holds: with a window of one token, the token after a
# draft d1 judges d1 alone, which on these tiny models changes its distribution a lot.
BOOST = {
    "repeat_penalty": 1.0, "frequency_penalty": -1.0, "presence_penalty": -2.0, "penalty_last_n": 1,
}
SAMPLED = GenerationParams(temperature=1.0, top_k=10, top_p=1.0, min_p=0.0, max_tokens=2, **BOOST)
SAMPLED_PROMPT = "the the the"
N_SEEDS = 3000


def reference_penalties(logits: np.ndarray, context: list[int], last_n: int) -> np.ndarray:
    """llama.cpp's rule, written out independently."""
    out = logits.astype(np.float64).copy()
    window = context if last_n < 0 else context[len(context) - min(last_n, len(context)):]
    for token, count in Counter(window).items():
        rp = PENALTIES["repeat_penalty"]
        out[token] = out[token] * rp if out[token] <= 0 else out[token] / rp
        out[token] -= count * PENALTIES["frequency_penalty"] + PENALTIES["presence_penalty"]
    return out


@pytest.mark.parametrize("last_n", [-1, 0, 3, 64])
def test_penalties_follow_llama_cpp(last_n: int) -> None:
    rng = np.random.default_rng(1)
    logits = rng.normal(0, 3, 50).astype(np.float32)
    context = [1, 2, 2, 7, 7, 7, 3, 9]
    params = _core.SamplingParams(penalty_last_n=last_n, **PENALTIES)
    got = _core.testing.apply_penalties(logits, context, params)
    expected = logits if last_n == 0 else reference_penalties(logits, context, last_n)
    assert np.allclose(got, expected, atol=1e-5)


def test_penalties_change_the_output(engines) -> None:
    """Otherwise the comparisons below would prove nothing."""
    plain = engines["none"]
    penalized = plain.generate(PROMPT, GREEDY).tokens
    free = plain.generate(PROMPT, GREEDY, repeat_penalty=1.0, frequency_penalty=0.0,
                          presence_penalty=0.0).tokens
    assert penalized != free
    assert max(Counter(penalized).values()) < max(Counter(free).values())


@pytest.mark.parametrize("drafter", ["ngram", "model", "self"])
@pytest.mark.parametrize("k", [3, 8])
def test_greedy_speculative_equals_plain_with_penalties(engines, drafter: str, k: int) -> None:
    expected = engines["none"].generate(PROMPT, GREEDY).tokens
    result = engines[drafter].generate(PROMPT, GREEDY, draft_max=k)
    assert result.stats.drafted > 0
    # n-gram drafts repeat the context, which the penalties discourage: mostly rejected.
    assert drafter == "ngram" or result.stats.accepted > 0, "drafts must be accepted too"
    assert result.tokens == expected


def exact_second(
    engine: Engine, prompt: list[int], first: int, include_first: bool
) -> dict[int, float]:
    """The penalized, warped target distribution of the token after `first`; the broken rule
    (include_first=False) judges the window without the token before the row."""
    logits = engine.next_token_logits(prompt + [first])
    window = prompt + [first] if include_first else prompt
    sp = _core.SamplingParams(temperature=1.0, top_k=10, top_p=1.0, min_p=0.0, **BOOST)
    ids, probs = _core.testing.warp(_core.testing.apply_penalties(logits, window, sp), sp)
    return dict(zip(ids, probs, strict=False))


def distance(a: dict[int, float], b: dict[int, float]) -> float:
    return 0.5 * sum(abs(a.get(t, 0.0) - b.get(t, 0.0)) for t in set(a) | set(b))


@pytest.mark.parametrize("drafter", ["model", "self"])
def test_sampling_with_penalties_follows_the_penalized_target(engines, drafter: str) -> None:
    engine = engines[drafter]
    prompt = engine.tokenize(SAMPLED_PROMPT)
    outputs = [engine.generate(prompt, SAMPLED, seed=seed, draft_max=3) for seed in range(N_SEEDS)]
    assert sum(o.stats.accepted for o in outputs) > N_SEEDS // 4
    # The second token (verified in the same batch as the first, a draft, most of the time),
    # after the frequent first token whose penalty state matters most.
    counts = Counter(o.tokens[0] for o in outputs)
    firsts = [t for t, c in counts.items() if c >= 200]
    top = max(firsts, key=lambda t: distance(exact_second(engine, prompt, t, True),
                                             exact_second(engine, prompt, t, False)))
    right = exact_second(engine, prompt, top, include_first=True)
    wrong = exact_second(engine, prompt, top, include_first=False)
    assert distance(right, wrong) > 0.2, "the drafts must matter to the penalty state"
    second = [o.tokens[1] for o in outputs if o.tokens[0] == top]
    assert chi_square_pvalue(second, right) > P_VALUE_FLOOR

    # Power: a penalty state that ignores the drafts gives a distribution the test rejects.
    rng = np.random.default_rng(0)
    ids = list(wrong)
    weights = np.array([wrong[i] for i in ids]) / sum(wrong.values())
    broken = rng.choice(ids, size=len(second), p=weights)
    assert chi_square_pvalue([int(t) for t in broken], right) < 1e-6
