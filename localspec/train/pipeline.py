"""``localspec train-head`` from start to end: the five steps of this package in order, each
announced, timed and shown with a progress bar, each resumable from the cache directory.
Imports torch (through train.py) only once the checks have passed."""

from __future__ import annotations

import importlib
import json
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from localspec.errors import InvalidParameterError
from localspec.files import check_input_file
from localspec.models.gguf_reader import read_gguf
from localspec.train import collect, data, evaluate, selfdistill, vocab
from localspec.train.examples import EmbeddingTable, Example, examples, labels_of
from localspec.train.params import (
    MIN_TOKENS,
    HeadShape,
    TrainHeadParams,
    head_shape,
    target_layers,
)

Say = Callable[[str], None]
Bar = Callable[[int, int], None]
BarFactory = Callable[[str], Any]  # a context manager yielding a Bar


@dataclass
class Report:
    tokens: int = 0
    sequences: int = 0
    self_distilled_tokens: int = 0
    largest_feature: float = 0.0
    draft_vocab: int = 0
    depth: int = 0
    steps: int = 0
    first_loss: float = 0.0
    last_loss: float = 0.0
    seconds: dict[str, float] = field(default_factory=dict)
    evaluation: dict[str, Any] = field(default_factory=dict)


def require_torch() -> None:
    try:
        importlib.import_module("torch")
    except ImportError:
        raise InvalidParameterError(
            "Training a head needs torch, which is not installed; run "
            "pip install 'localspec[train]'.") from None


def check_target(target: str, n_layer: int, memory: str) -> None:
    """A head reads layer inputs from layer 1 on, and drafts only where the target's memory
    can take back rejected tokens."""
    if memory != "attention":
        raise InvalidParameterError(
            f"'{target}' is a {memory} model, which localspec decodes without speculation (its "
            "memory cannot take back rejected draft tokens), so a head cannot help it.")
    if n_layer < 2:
        raise InvalidParameterError(
            f"'{target}' has {n_layer} layer; an EAGLE-3 head reads the inputs of layers 1 and "
            "up, so the target needs at least 2 layers.")


def fingerprint(params: TrainHeadParams) -> dict[str, Any]:
    """What the cache is made from: a --resume run must match it."""
    def stamp(path: str) -> list[Any]:
        p = Path(path).resolve()
        return [str(p), p.stat().st_size, int(p.stat().st_mtime)]

    return {"target": stamp(params.target), "data": [stamp(d) for d in params.data],
            "tokens": params.tokens, "self_distill": params.self_distill,
            "seq_len": params.seq_len, "draft_vocab": params.draft_vocab, "depth": params.depth}


@contextmanager
def timed(report: Report, name: str) -> Iterator[None]:
    start = time.monotonic()
    yield
    report.seconds[name] = report.seconds.get(name, 0.0) + time.monotonic() - start


def run(params: TrainHeadParams, say: Say, bar: BarFactory) -> Report:
    params.validate()
    for path in params.data:  # before the cache is made: a missing file leaves nothing behind
        check_input_file(path, "--data")
    require_torch()
    from localspec import _core

    info = read_gguf(params.target)
    check_target(params.target, info.n_layer, _core.memory_kind(params.target))
    layers = list(target_layers(info.n_layer))
    cache = params.cache_dir
    collect.open_cache(cache, fingerprint(params), params.resume)
    report = Report(depth=params.depth)
    collector = _core.FeatureCollector(params.target, layers, params.seq_len, params.n_threads)
    with timed(report, "prepare"):
        sequences = prepare(params, collector, cache, say, bar, report)
    with timed(report, "collect"):
        plan = collect_features(params, collector, sequences, cache, say, bar, report)
    del collector
    held = [collect.is_heldout(i, len(sequences), params.heldout_share)
            for i in range(len(sequences))]
    shards = collect.load_shards(cache, len(plan))
    with timed(report, "vocab"):
        d2t = choose_vocabulary(params, shards, held, info.vocab_size, cache, say, report)
    shape = head_shape(info.n_embd, info.n_ff or 4 * info.n_embd, info.n_layer, int(d2t.size),
                       d2t.tolist())
    table = embedding_table(params.target, sequences, cache)
    t2d = vocab.target_to_draft(d2t, info.vocab_size)
    train_set = examples(shards, [not h for h in held], t2d, table)
    heldout = examples(shards, held, t2d, table)
    heldout_labels = np.concatenate([e.target_labels for e in heldout])
    with timed(report, "train"):
        head = train_head(params, shape, train_set, table, cache, say, bar, report)
    with timed(report, "write"):
        write_output(params, head, shape, say)
    with timed(report, "evaluate"):
        evaluation = evaluate.Evaluation(coverage=vocab.coverage(heldout_labels, d2t))
        evaluate_head(params, head, heldout, table, sequences, held, evaluation, say)
    report.evaluation = evaluation.as_dict()
    (cache / "report.json").write_text(json.dumps(asdict(report), indent=1), encoding="utf-8")
    return report


def prepare(params: TrainHeadParams, tokenizer: data.Tokenizer, cache: Path, say: Say,
            bar: BarFactory, report: Report) -> list[list[int]]:
    """The token sequences (cached after the first run): the data, and with --self-distill
    the target's continuations of its prompts."""
    sequences, n_distilled = collect.load_sequences(cache)
    if not sequences:
        texts, prompts = selfdistill.split_items(data.read_items(params.data, tokenizer), params)
        distilled: list[list[int]] = []
        if prompts:
            say(f"self-distill: the target continues {len(prompts)} prompts "
                f"(up to {params.continuation_tokens} tokens each)")
            with bar("self-distill") as progress:
                distilled = selfdistill.continuations(prompts, params, cache / "distill.jsonl",
                                                      progress, params.tokens // 2)
        pieces = data.pack(distilled, params.seq_len, tokenizer.bos)
        sequences = budgeted(pieces + data.pack(texts, params.seq_len, tokenizer.bos),
                             params.tokens)
        check_enough(sequences)
        n_distilled = min(len(pieces), len(sequences))
        collect.save_sequences(cache, sequences, n_distilled)
    report.tokens = sum(len(s) for s in sequences)
    report.self_distilled_tokens = sum(len(s) for s in sequences[:n_distilled])
    report.sequences = len(sequences)
    return sequences


def budgeted(sequences: Sequence[list[int]], budget: int) -> list[list[int]]:
    out, total = [], 0
    for s in sequences:
        if total >= budget:
            break
        out.append(s[:budget - total] if budget - total >= 8 else s)
        total += len(out[-1])
    return out


def check_enough(sequences: Sequence[Sequence[int]]) -> None:
    total = sum(len(s) for s in sequences)
    if total < MIN_TOKENS or len(sequences) < 2:
        raise InvalidParameterError(
            f"The data gives only {total} tokens in {len(sequences)} sequences; train-head needs "
            f"at least {MIN_TOKENS} tokens in 2 sequences (one is held back): pass more text.")


def collect_features(params: TrainHeadParams, collector: collect.Collector,
                     sequences: Sequence[Sequence[int]], cache: Path, say: Say, bar: BarFactory,
                     report: Report) -> list[range]:
    plan = collect.shard_plan(sequences, params.shard_tokens)
    width = collector.feature_width
    needed = collect.disk_needed(report.tokens, width)
    say(f"collect: {report.tokens} tokens in {len(sequences)} sequences, {width} feature values "
        f"per token (3 layers): about {needed / 2**20:.1f} MiB of fp16 shards in {cache} "
        "(twice that where a value exceeds fp16)")
    collect.check_disk(cache, collect.disk_needed(report.tokens, width, value_bytes=4))
    with bar("collect") as progress:
        report.largest_feature = collect.collect(collector, sequences, plan, cache, progress)
    kind = "fp16" if report.largest_feature < collect.FP16_MAX else "f32 (beyond fp16)"
    say(f"collect: features finite, largest magnitude {report.largest_feature:.1f}, stored as "
        f"{kind}")
    return plan


def choose_vocabulary(params: TrainHeadParams, shards: Sequence[collect.Shard],
                      held: Sequence[bool], n_vocab: int, cache: Path, say: Say,
                      report: Report) -> np.ndarray:
    labels = labels_of(shards, [not h for h in held])
    d2t = vocab.choose_vocab(labels, params.draft_vocab, n_vocab)
    np.save(cache / "d2t.npy", d2t)
    report.draft_vocab = int(d2t.size)
    note = "" if d2t.size == params.draft_vocab else f" (the data has only {d2t.size} distinct)"
    say(f"vocab: {d2t.size} draft tokens{note}")
    return d2t


def embedding_table(target: str, sequences: Sequence[Sequence[int]], cache: Path) -> EmbeddingTable:
    """The target's embedding rows of every token in the data (cached)."""
    from localspec import _core

    path = cache / "embeddings.npz"
    if path.exists():
        with np.load(path) as z:
            return EmbeddingTable(z["ids"], z["rows"])
    ids = np.unique(np.concatenate([np.asarray(s, dtype=np.int64) for s in sequences]))
    rows = _core.token_embeddings(target, ids.tolist())
    np.savez(path, ids=ids, rows=rows)
    return EmbeddingTable(ids, rows)


def train_head(params: TrainHeadParams, shape: HeadShape, train_set: Sequence[Example],
               table: EmbeddingTable, cache: Path, say: Say, bar: BarFactory,
               report: Report) -> Any:
    from localspec.train import train

    n_tokens = sum(len(e.inputs) for e in train_set)
    steps = params.steps or train.default_steps(n_tokens, params.batch_tokens)
    say(f"train: {steps} steps of about {params.batch_tokens} tokens over {n_tokens} training "
        f"tokens, training-time unroll depth {params.depth}, on {train.device()}")
    with bar("train") as progress:
        head, state = train.train(shape, train_set, table, params, steps,
                                  cache / "checkpoint.pt", lambda s, n, _loss: progress(s, n))
    report.steps = state.step
    window = max(1, min(10, len(state.losses) // 4))
    report.first_loss = float(np.mean(state.losses[:window]))
    report.last_loss = float(np.mean(state.losses[-window:]))
    say(f"train: loss {report.first_loss:.3f} (first steps) -> {report.last_loss:.3f} (last)")
    return head


def write_output(params: TrainHeadParams, head: Any, shape: HeadShape, say: Say) -> None:
    from localspec.train.train import numpy_weights
    from localspec.train.write import write_head

    path = write_head(params.out, numpy_weights(head), shape, params.target, params.outtype)
    say(f"write: {path} ({path.stat().st_size / 2**20:.1f} MiB, {params.outtype})")


def evaluate_head(params: TrainHeadParams, head: Any, heldout: Sequence[Example],
                  table: EmbeddingTable, sequences: Sequence[Sequence[int]],
                  held: Sequence[bool], evaluation: evaluate.Evaluation, say: Say) -> None:
    from localspec.train.train import heldout_accuracy

    evaluation.teacher_forced = heldout_accuracy(head, heldout, table, params.depth)
    held_sequences = [s for s, h in zip(sequences, held, strict=True) if h]
    prompts = evaluate.eval_prompts(held_sequences, params.eval_prompts)
    evaluate.through_core(Path(params.out), prompts, params, evaluation)
    for line in evaluate.report_lines(evaluation):
        say(f"evaluate: {line}")
