"""Step 2: the draft vocabulary: the target tokens the head may draft, with the d2t map.

The head drafts only the N most frequent of the target's greedy next tokens in the training
data (what it has to predict); d2t maps draft id i to target id d2t[i] (absolute ids, ascending,
as the eagle3 GGUF stores them). No torch here."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import numpy.typing as npt


def choose_vocab(labels: Iterable[npt.NDArray[np.int32]], n_draft: int,
                 n_vocab: int) -> npt.NDArray[np.int64]:
    """The d2t table: the n_draft most frequent labels (ties: the lower id), ascending; fewer
    when the data has fewer distinct labels."""
    counts = np.zeros(n_vocab, dtype=np.int64)
    for array in labels:
        counts += np.bincount(array, minlength=n_vocab)[:n_vocab]
    seen = np.flatnonzero(counts)
    order = seen[np.lexsort((seen, -counts[seen]))]
    return np.sort(order[:n_draft]).astype(np.int64)


def target_to_draft(d2t: npt.NDArray[np.int64], n_vocab: int) -> npt.NDArray[np.int64]:
    """The inverse map over the target's vocabulary: -1 for tokens outside the draft one."""
    t2d = np.full(n_vocab, -1, dtype=np.int64)
    t2d[d2t] = np.arange(d2t.size)
    return t2d


def coverage(labels: npt.NDArray[np.int32], d2t: npt.NDArray[np.int64]) -> float:
    """Share of `labels` (target tokens) inside the draft vocabulary."""
    return float(np.isin(labels, d2t).mean()) if labels.size else 0.0
