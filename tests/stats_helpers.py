"""Statistics and comparison helpers shared by the losslessness tests."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

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
