"""Step 1: the target's hidden states and next tokens, in a cache directory of shards.

The cache (``OUT.cache/`` next to the output) holds ``manifest.json`` (what the run was made
from: a rerun with ``--resume`` must match it), ``sequences.npz`` (the token sequences, one
target context each), ``shard-NNNNN.npz`` (per shard of sequences: the features, fp16 unless a
value would overflow it, then f32; the tokens; the target's greedy next tokens), and what the
later steps write. Shards are written whole (a temporary file renamed), so an interrupted run
resumes at the first missing shard. No torch here.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from localspec.errors import InvalidParameterError

FP16_MAX = 65504.0
MANIFEST = "manifest.json"
SEQUENCES = "sequences.npz"
Progress = Callable[[int, int], None]


class Collector(Protocol):
    feature_width: int

    def collect(self, tokens: list[int]) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int32]]:
        ...


@dataclass(frozen=True)
class Shard:
    """Sequences [first, first + len(offsets) - 1) of the plan, concatenated."""

    features: npt.NDArray[Any]  # [n, width], float16 or float32
    tokens: npt.NDArray[np.int32]  # [n]
    labels: npt.NDArray[np.int32]  # [n]: the target's greedy token after tokens[.. i]
    offsets: npt.NDArray[np.int64]  # sequence boundaries, from 0 to n

    def sequences(self) -> list[slice]:
        return [slice(int(a), int(b)) for a, b in zip(self.offsets[:-1], self.offsets[1:],
                                                       strict=True)]


def open_cache(cache: Path, fingerprint: dict[str, Any], resume: bool) -> None:
    """Create the cache, or check that the one there belongs to this run (--resume)."""
    manifest = cache / MANIFEST
    if manifest.exists():
        if not resume:
            raise InvalidParameterError(
                f"{cache} holds an earlier (perhaps interrupted) run; pass --resume to continue "
                "it, or delete that directory to start over.")
        if json.loads(manifest.read_text(encoding="utf-8")) != fingerprint:
            raise InvalidParameterError(
                f"{cache} was made from another target, data or settings; delete it or choose "
                "another --out.")
        return
    cache.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps(fingerprint, indent=1), encoding="utf-8")


def save_sequences(cache: Path, sequences: Sequence[Sequence[int]], n_distilled: int) -> None:
    """The plan of sequences; the first n_distilled are the target's own continuations."""
    tokens = np.array([t for s in sequences for t in s], dtype=np.int32)
    offsets = np.cumsum([0] + [len(s) for s in sequences]).astype(np.int64)
    _save(cache / SEQUENCES, tokens=tokens, offsets=offsets, distilled=np.int64(n_distilled))


def load_sequences(cache: Path) -> tuple[list[list[int]], int]:
    """(the saved sequences, how many are self-distilled); ([], 0) before the first save."""
    path = cache / SEQUENCES
    if not path.exists():
        return [], 0
    with np.load(path) as z:
        tokens, offsets, distilled = z["tokens"], z["offsets"], int(z["distilled"])
    return [tokens[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:], strict=True)], distilled


def shard_plan(sequences: Sequence[Sequence[int]], shard_tokens: int) -> list[range]:
    """Consecutive runs of sequences of about shard_tokens tokens each."""
    plan: list[range] = []
    start, count = 0, 0
    for i, seq in enumerate(sequences):
        count += len(seq)
        if count >= shard_tokens:
            plan.append(range(start, i + 1))
            start, count = i + 1, 0
    if start < len(sequences):
        plan.append(range(start, len(sequences)))
    return plan


def disk_needed(n_tokens: int, width: int, value_bytes: int = 2) -> int:
    """Bytes of the shards: features (fp16: 2 bytes a value, f32: 4) plus two token ids per
    position."""
    return n_tokens * (value_bytes * width + 8)


def check_disk(cache: Path, needed: int) -> None:
    free = shutil.disk_usage(cache).free
    if free < needed * 1.1 + (64 << 20):
        raise InvalidParameterError(
            f"The cache needs about {needed / 2**20:.0f} MiB but {cache} has only "
            f"{free / 2**20:.0f} MiB free; free some space, lower --tokens, or choose an --out "
            "on another disk.")


def shard_path(cache: Path, index: int) -> Path:
    return cache / f"shard-{index:05d}.npz"


def collect(collector: Collector, sequences: Sequence[Sequence[int]], plan: Sequence[range],
            cache: Path, progress: Progress) -> float:
    """Write every missing shard; returns the largest feature magnitude over all shards."""
    total = sum(len(s) for s in sequences)
    done, largest = 0, 0.0
    for index, run in enumerate(plan):
        path = shard_path(cache, index)
        if not path.exists():
            _write_shard(collector, [sequences[i] for i in run], path)
        with np.load(path) as z:
            largest = max(largest, float(z["largest"]))
        done += sum(len(sequences[i]) for i in run)
        progress(done, total)
    return largest


def _write_shard(collector: Collector, sequences: Sequence[Sequence[int]], path: Path) -> None:
    features, labels = [], []
    for seq in sequences:
        f, a = collector.collect(list(seq))
        if not np.isfinite(f).all():
            raise InvalidParameterError(
                "The target produced non-finite hidden states (inf or NaN) on the training "
                "text; check the model file, or train on other text.")
        features.append(f)
        labels.append(a)
    stacked = np.concatenate(features)
    largest = float(np.abs(stacked).max()) if stacked.size else 0.0
    dtype = np.float16 if largest < FP16_MAX else np.float32
    _save(path, features=stacked.astype(dtype),
          tokens=np.array([t for s in sequences for t in s], dtype=np.int32),
          labels=np.concatenate(labels).astype(np.int32),
          offsets=np.cumsum([0] + [len(s) for s in sequences]).astype(np.int64),
          largest=np.float64(largest))


def _save(path: Path, **arrays: Any) -> None:
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, **arrays)
    os.replace(tmp, path)


def load_shard(path: Path) -> Shard:
    with np.load(path) as z:
        return Shard(z["features"], z["tokens"], z["labels"], z["offsets"])


def load_shards(cache: Path, plan_size: int) -> list[Shard]:
    return [load_shard(shard_path(cache, i)) for i in range(plan_size)]


def is_heldout(index: int, n_sequences: int, share: float) -> bool:
    """Every round(1/share)-th sequence is held back for the evaluation (at least one)."""
    every = max(2, round(1 / share)) if share > 0 else n_sequences + 1
    return index % every == every - 1 or (n_sequences < every and index == n_sequences - 1)
