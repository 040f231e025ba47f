"""How closely a draft's next-token distribution q follows the target's p (`localspec check`).

For one drafted token sampled from q, rejection sampling accepts it with probability
sum_x min(p(x), q(x)) = 1 - TV(p, q) (docs/design.md, "Lossless acceptance"), so the mean of
1 - TV over the positions where drafting happens predicts the acceptance of the first drafted
token. Greedy drafting is accepted when the two argmaxes agree, so their agreement predicts greedy
acceptance.
The cosine of the two logit vectors (on the vocabulary both cover) is a diagnostic only: logits
may differ by a constant and by scale without changing the argmax.

A draft model's q covers its whole vocabulary; an EAGLE-3 head's covers its draft vocabulary,
mapped to target ids by its d2t table (q = 0 elsewhere); the target's MTP layers share its
vocabulary (q from their first layer, which drafts position 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from localspec import _core
from localspec.drafter_spec import DrafterSpec
from localspec.models.gguf_reader import read_gguf
from localspec.runtime.engine import Engine

__all__ = ["Agreement", "HeadQ", "ModelQ", "MtpQ", "agreement", "measure_agreement"]


@dataclass(frozen=True)
class Agreement:
    """Means over positions (0.0 with no positions)."""

    one_minus_tv: float  # predicted acceptance of one drafted token sampled from q
    top1: float  # share of positions where argmax q == argmax p (greedy acceptance)
    cosine: float  # cosine of the logit vectors on the shared vocabulary
    positions: int

    def to_dict(self) -> dict[str, float | int]:
        return {"one_minus_tv": self.one_minus_tv, "top1": self.top1, "cosine": self.cosine,
                "positions": self.positions}


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64) - logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def agreement(p_logits: np.ndarray, q_logits: np.ndarray,
              q_ids: np.ndarray | None = None) -> Agreement:
    """Row i of ``p_logits`` ([n, n_target]) and of ``q_logits`` ([n, n_draft]) are the target's
    and the draft's logits for the same next token. ``q_ids[j]`` is the target id of draft
    column j (None: the same id, for a draft model sharing the vocabulary; columns past the
    target's vocabulary then hold mass the target can never accept)."""
    n = p_logits.shape[0]
    if n == 0:
        return Agreement(0.0, 0.0, 0.0, 0)
    ids = np.arange(q_logits.shape[1]) if q_ids is None else np.asarray(q_ids)
    inside = ids < p_logits.shape[1]
    p = _softmax(p_logits)
    q = _softmax(q_logits)
    # sum_x min(p, q): only ids that q covers inside the target's vocabulary contribute.
    overlap = np.minimum(p[:, ids[inside]], q[:, inside]).sum(axis=1)
    top1 = ids[np.argmax(q_logits, axis=1)] == np.argmax(p_logits, axis=1)
    a = p_logits[:, ids[inside]].astype(np.float64)
    b = q_logits[:, inside].astype(np.float64)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    cos = (a * b).sum(axis=1) / np.maximum(norms, 1e-30)
    return Agreement(float(overlap.mean()), float(top1.mean()), float(cos.mean()), n)


def _concat(parts: Sequence[Agreement]) -> Agreement:
    total = sum(a.positions for a in parts)
    if total == 0:
        return Agreement(0.0, 0.0, 0.0, 0)

    def mean(field: str) -> float:
        return sum(getattr(a, field) * a.positions for a in parts) / total

    return Agreement(mean("one_minus_tv"), mean("top1"), mean("cosine"), total)


def measure_agreement(target: Engine, drafter: DrafterSpec,
                      sequences: Sequence[tuple[list[int], list[int]]],
                      n_threads: int) -> Agreement | None:
    """The agreement of a model, head or MTP drafter with the target at the generated positions
    of each (prompt tokens, generated tokens) pair; None for drafters without a model (n-gram)."""
    if drafter.kind == "mtp":
        return _measure(target, MtpQ(target.info.target_path, n_threads), sequences)
    if drafter.path is None:
        return None
    if read_gguf(drafter.path, read_arrays=False).architecture == "eagle3":
        return _measure(target, HeadQ(target.info.target_path, drafter.path, n_threads), sequences)
    n_ctx = target.info.n_ctx
    with Engine.load(drafter.path, draft="none", n_ctx=n_ctx, n_threads=n_threads) as draft:
        return _measure(target, ModelQ(draft), sequences)


class DraftQ(Protocol):
    def rows(self, tokens: list[int]) -> tuple[np.ndarray, int, np.ndarray | None]:
        """The draft's logits rows for positions j = start, start + 1, .. (row j: the token
        after tokens[0..j]), that start, and the target ids of its columns (None: the same)."""
        ...


def _measure(target: Engine, draft: DraftQ,
             sequences: Sequence[tuple[list[int], list[int]]]) -> Agreement:
    parts = []
    for prompt, generated in sequences:
        tokens = prompt + generated
        p = target.pass_logits(tokens, len(tokens))[:-1]  # row j: the token after tokens[0..j]
        q, start, ids = draft.rows(tokens)
        first = max(len(prompt) - 1, start)  # from the row that predicts the first generated token
        parts.append(agreement(p[first:], q[first - start : len(p) - start], ids))
    return _concat(parts)


class ModelQ:
    """A draft model, loaded as a plain target: its row j follows tokens[0..j] too."""

    def __init__(self, draft: Engine) -> None:
        self._draft = draft

    def rows(self, tokens: list[int]) -> tuple[np.ndarray, int, np.ndarray | None]:
        return self._draft.pass_logits(tokens, len(tokens))[:-1], 0, None


class HeadQ:
    """An EAGLE-3 head fed the target's features as the drafter feeds it: its row P pairs token
    P + 1 with the features at P, so it predicts the token after tokens[0..P + 1] (j = P + 1)."""

    def __init__(self, target_path: str, head: str, n_threads: int) -> None:
        layers = read_gguf(head, read_arrays=False).get("eagle3.target_layers", [])
        self._layers = [int(i) for i in layers]
        self._target, self._head, self._threads = target_path, head, n_threads

    def rows(self, tokens: list[int]) -> tuple[np.ndarray, int, np.ndarray | None]:
        collector = _core.FeatureCollector(self._target, self._layers, len(tokens) + 1,
                                           self._threads)
        features, _ = collector.collect(tokens)
        probe = _core.eagle3_head_logits(self._target, self._head, tokens, features, [],
                                         n_threads=self._threads)
        return np.asarray(probe["logits"])[:-1], 1, np.asarray(probe["d2t"])


class MtpQ:
    """The target's MTP layers, run by the core as the drafter runs them: their row j pairs
    token j with the target's final hidden state at j - 1 and predicts the token after
    tokens[0..j]."""

    def __init__(self, target_path: str, n_threads: int) -> None:
        self._target, self._threads = target_path, n_threads

    def rows(self, tokens: list[int]) -> tuple[np.ndarray, int, np.ndarray | None]:
        return np.asarray(_core.mtp_first_logits(self._target, tokens, self._threads)), 0, None
