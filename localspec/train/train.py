"""Step 3: train the head (torch; CPU, or CUDA when torch sees a GPU).

AdamW with a warm-up and cosine decay; the loss is the draft-vocabulary cross-entropy of every
unroll step j (model.py's training-time test), weighted 0.8^j, over the rows whose anchor is
inside the sequence and whose label is in the draft vocabulary. A checkpoint (model, optimizer,
step, losses) is written every CHECKPOINT_EVERY steps and at the end; --resume continues it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812 - torch's own convention

from localspec.train.examples import EmbeddingTable, Example, batches
from localspec.train.model import Eagle3Head, init_weights
from localspec.train.params import HeadShape, TrainHeadParams

CHECKPOINT_EVERY = 20
STEP_WEIGHT = 0.8
Progress = Callable[[int, int, float], None]  # (step, steps, loss)


@dataclass
class TrainState:
    step: int = 0
    losses: list[float] = field(default_factory=list)


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def default_steps(n_tokens: int, batch_tokens: int) -> int:
    """About two passes over the training data, at least 10 steps."""
    return max(10, math.ceil(2 * n_tokens / batch_tokens))


def tensors(batch: Sequence[Example], table: torch.Tensor,
            dev: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(embeddings [B,T,E], features [B,T,W], draft labels [B,T], target-padded mask [B,T]);
    short sequences are padded at the end (label -1, mask False)."""
    t = max(len(e.inputs) for e in batch)
    width = batch[0].features.shape[1]
    inputs = np.zeros((len(batch), t), dtype=np.int64)
    labels = np.full((len(batch), t), -1, dtype=np.int64)
    features = np.zeros((len(batch), t, width), dtype=np.float32)
    real = np.zeros((len(batch), t), dtype=bool)
    for b, e in enumerate(batch):
        n = len(e.inputs)
        inputs[b, :n], labels[b, :n], features[b, :n] = e.inputs, e.labels, e.features
        real[b, :n] = True
    idx = torch.from_numpy(inputs).to(dev)
    return (table[idx], torch.from_numpy(features).to(dev), torch.from_numpy(labels).to(dev),
            torch.from_numpy(real).to(dev))


def step_masks(labels: torch.Tensor, real: torch.Tensor, depth: int) -> list[torch.Tensor]:
    """Rows of step j with an anchor inside the sequence (s >= j) and a real position."""
    rows = torch.arange(labels.shape[1], device=labels.device)[None, :]
    return [real & (rows >= j) for j in range(depth)]


def loss_of(head: Eagle3Head, batch: Sequence[Example], table: torch.Tensor,
            depth: int) -> torch.Tensor:
    emb, features, labels, real = tensors(batch, table, table.device)
    total = torch.zeros((), device=table.device)
    weights = 0.0
    for j, (logits, mask) in enumerate(zip(head.unroll(emb, features, depth),
                                           step_masks(labels, real, depth), strict=True)):
        keep = mask & (labels >= 0)
        if keep.any():
            total = total + STEP_WEIGHT ** j * F.cross_entropy(logits[keep], labels[keep])
            weights += STEP_WEIGHT ** j
    return total / max(weights, 1e-9)


def learning_rate(step: int, steps: int, peak: float) -> float:
    warmup = max(1, steps // 20)
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(shape: HeadShape, train_set: Sequence[Example], table: EmbeddingTable,
          params: TrainHeadParams, steps: int, checkpoint: Path,
          progress: Progress) -> tuple[Eagle3Head, TrainState]:
    """Train (or continue training from `checkpoint` when --resume finds one) to `steps`."""
    dev = device()
    torch.set_num_threads(params.n_threads)
    torch.manual_seed(params.seed)
    head = Eagle3Head(shape)
    init_weights(head, params.seed)
    head.to(dev)
    optimizer = torch.optim.AdamW(head.parameters(), lr=params.learning_rate,
                                  betas=(0.9, 0.95), weight_decay=0.0)
    state = TrainState()
    if params.resume and checkpoint.exists():
        saved = torch.load(checkpoint, map_location=dev, weights_only=False)
        head.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        state = TrainState(int(saved["step"]), list(saved["losses"]))
    rows = torch.from_numpy(table.rows).to(dev)
    stream = batches(train_set, params.batch_tokens, params.seed, skip=state.step)
    head.train()
    while state.step < steps:
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(state.step, steps, params.learning_rate)
        loss = loss_of(head, next(stream), rows, params.depth)
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        optimizer.step()
        state.step += 1
        state.losses.append(float(loss.item()))
        progress(state.step, steps, state.losses[-1])
        if state.step % CHECKPOINT_EVERY == 0 or state.step == steps:
            save_checkpoint(checkpoint, head, optimizer, state)
    head.eval()
    return head, state


def save_checkpoint(path: Path, head: Eagle3Head, optimizer: torch.optim.Optimizer,
                    state: TrainState) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"model": head.state_dict(), "optimizer": optimizer.state_dict(),
                "step": state.step, "losses": state.losses}, tmp)
    tmp.replace(path)


def heldout_accuracy(head: Eagle3Head, heldout: Sequence[Example], table: EmbeddingTable,
                     depth: int) -> list[float]:
    """Teacher-forced share of rows whose draft (argmax) is the target's token, per unroll
    step, over the held-back examples (a label outside the draft vocabulary is a miss)."""
    rows = torch.from_numpy(table.rows).to(next(head.parameters()).device)
    hits, counts = np.zeros(depth), np.zeros(depth)
    with torch.no_grad():
        for example in heldout:
            emb, features, labels, real = tensors([example], rows, rows.device)
            outs = head.unroll(emb, features, depth)
            for j, (logits, mask) in enumerate(zip(outs, step_masks(labels, real, depth),
                                                   strict=True)):
                hits[j] += int(((logits.argmax(-1) == labels) & mask & (labels >= 0)).sum())
                counts[j] += int(mask.sum())
    return [float(h / c) if c else 0.0 for h, c in zip(hits, counts, strict=True)]


def numpy_weights(head: Eagle3Head) -> dict[str, np.ndarray]:
    return {name: t.detach().cpu().float().numpy() for name, t in head.state_dict().items()}
