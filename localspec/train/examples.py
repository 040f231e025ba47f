"""The training examples, from the cache: one per collected sequence, as the head sees it
(model.py): row s pairs the embedding of token s + 1 with the target's features at s and is
labelled with the target's greedy token after token s + 1, as a draft id (-1 outside the draft
vocabulary). No torch here: train.py turns batches into tensors."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from localspec.train.collect import Shard


@dataclass(frozen=True)
class Example:
    features: npt.NDArray[np.float32]  # [T, width], T = sequence length - 1
    inputs: npt.NDArray[np.int64]  # [T]: rows of the embedding table (token s + 1)
    labels: npt.NDArray[np.int64]  # [T]: draft ids, -1 outside the draft vocabulary
    target_labels: npt.NDArray[np.int32]  # [T]: the same labels as target ids


@dataclass(frozen=True)
class EmbeddingTable:
    """The target's token embedding rows for the tokens the data holds."""

    ids: npt.NDArray[np.int64]  # sorted target ids
    rows: npt.NDArray[np.float32]  # [len(ids), n_embd]

    def index(self, tokens: npt.NDArray[np.int32]) -> npt.NDArray[np.int64]:
        return np.searchsorted(self.ids, tokens).astype(np.int64)


def examples(shards: Sequence[Shard], chosen: Sequence[bool], t2d: npt.NDArray[np.int64],
             table: EmbeddingTable) -> list[Example]:
    """The examples of the sequences whose flag in `chosen` is set (global sequence order)."""
    out: list[Example] = []
    index = 0
    for shard in shards:
        for piece in shard.sequences():
            if chosen[index]:
                tokens, labels = shard.tokens[piece], shard.labels[piece]
                out.append(Example(
                    features=np.asarray(shard.features[piece][:-1]),
                    inputs=table.index(tokens[1:]),
                    labels=t2d[labels[1:]],
                    target_labels=labels[1:],
                ))
            index += 1
    return out


def labels_of(shards: Sequence[Shard], chosen: Sequence[bool]) -> list[npt.NDArray[np.int32]]:
    """The labels (target ids) of the examples `examples` would make."""
    out: list[npt.NDArray[np.int32]] = []
    index = 0
    for shard in shards:
        for piece in shard.sequences():
            if chosen[index]:
                out.append(shard.labels[piece][1:])
            index += 1
    return out


def batches(examples: Sequence[Example], batch_tokens: int, seed: int,
            skip: int = 0) -> Iterator[list[Example]]:
    """Endless batches of about batch_tokens positions, in a fresh order every epoch (the
    order depends only on the seed: a resumed run skips the batches it has seen)."""
    epoch, produced = 0, 0
    while True:
        order = np.random.default_rng(seed + epoch).permutation(len(examples))
        batch: list[Example] = []
        count = 0
        for i in order:
            batch.append(examples[int(i)])
            count += len(examples[int(i)].inputs)
            if count >= batch_tokens:
                if produced >= skip:
                    yield batch
                produced += 1
                batch, count = [], 0
        if batch:
            if produced >= skip:
                yield batch
            produced += 1
        epoch += 1
