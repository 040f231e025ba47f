"""Statistics and comparison helpers shared by the losslessness tests."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy import stats

# A test "passes" when the observed sample is plausible under the exact distribution. The
# threshold is small so an honest implementation fails at most 1 in 10,000 runs, while the
# broken rules below are rejected with p-values many orders of magnitude lower.
P_VALUE_FLOOR = 1e-4


def chi_square_pvalue(
    samples: Sequence[int], probs: Mapping[int, float], min_expected: float = 5.0
) -> float:
    """Goodness of fit of `samples` to the exact distribution `probs` (token -> probability).

    Tokens whose expected count is below `min_expected` are pooled into one bin; a sample
    outside the support of `probs` makes the p-value 0.
    """
    n = len(samples)
    counts = Counter(samples)
    if any(token not in probs or probs[token] <= 0 for token in counts):
        return 0.0
    observed, expected = [], []
    pooled_obs, pooled_exp = 0.0, 0.0
    for token, p in probs.items():
        if p * n >= min_expected:
            observed.append(counts.get(token, 0))
            expected.append(p * n)
        else:
            pooled_obs += counts.get(token, 0)
            pooled_exp += p * n
    if pooled_exp > 0:
        observed.append(pooled_obs)
        expected.append(pooled_exp)
    if len(observed) < 2:
        return 1.0
    expected_arr = np.array(expected) * (n / np.sum(expected))
    return float(stats.chisquare(observed, expected_arr).pvalue)


def sample_dense(probs: np.ndarray, rng: np.random.Generator) -> int:
    return int(rng.choice(len(probs), p=probs / probs.sum()))


# The sampling settings the hidden-state drafters' distribution tests use: no truncation, so q
# overlaps p enough for acceptances.
UNTRUNCATED = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}


def assert_first_two_tokens_fit(plain: Any, prompt: list[int], outputs: Sequence[Any]) -> None:
    """The first token of `outputs` (GenerationResults of `prompt`, one seed each, UNTRUNCATED)
    fits the target's distribution after `prompt`, and the second token, after the most frequent
    first one, fits the distribution there (`plain`: an Engine on the target)."""
    from localspec import _core

    sampling = _core.SamplingParams(**UNTRUNCATED)

    def exact(tokens: list[int]) -> dict[int, float]:
        ids, probs = _core.testing.warp(plain.next_token_logits(tokens), sampling)
        return dict(zip(ids, probs, strict=False))

    first = [o.tokens[0] for o in outputs]
    assert chi_square_pvalue(first, exact(prompt)) > P_VALUE_FLOOR
    top = Counter(first).most_common(1)[0][0]
    second = [o.tokens[1] for o in outputs if o.tokens[0] == top]
    assert chi_square_pvalue(second, exact([*prompt, top])) > P_VALUE_FLOOR
