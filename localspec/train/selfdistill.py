"""``--self-distill``: the target's own continuations of the data's prompts (what the EAGLE
papers train on), generated through localspec's Engine with speculation on (n-gram drafting:
the output is the target's either way). Resumable: each continuation is appended to
``distill.jsonl`` in the cache as soon as it is written. No torch here."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from localspec.runtime.engine import Engine
from localspec.train.data import Item
from localspec.train.params import TrainHeadParams
from localspec.types import GenerationParams

Progress = Callable[[int, int], None]  # (done, total)
PARALLEL = 4  # continuations generated together


def split_items(items: Sequence[Item], params: TrainHeadParams
                ) -> tuple[list[list[int]], list[tuple[int, ...]]]:
    """(texts trained on as they are, prompts the target continues): without --self-distill
    every item is text; with it, every prompt item, and every second text item cut to its
    first prompt_tokens tokens, is continued (the other half of the text stays as it is)."""
    if not params.self_distill:
        return [list(item.tokens) for item in items], []
    texts: list[list[int]] = []
    prompts: list[tuple[int, ...]] = []
    text_seen = 0
    for item in items:
        if item.is_prompt:
            prompts.append(item.tokens[-(params.seq_len - params.continuation_tokens):])
            continue
        text_seen += 1
        if text_seen % 2 == 0 and len(item.tokens) > params.prompt_tokens:
            prompts.append(item.tokens[:params.prompt_tokens])
        else:
            texts.append(list(item.tokens))
    return texts, prompts


def _done(path: Path) -> dict[int, list[int]]:
    done: dict[int, list[int]] = {}
    if not path.exists():
        return done
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
            done[int(record["index"])] = [int(t) for t in record["tokens"]]
        except (ValueError, KeyError, TypeError):
            break  # a line cut by an interruption: everything after it is written again
    return done


def continuations(prompts: Sequence[tuple[int, ...]], params: TrainHeadParams, path: Path,
                  progress: Progress, budget: int) -> list[list[int]]:
    """prompt + the target's continuation, for prompts in order until `budget` tokens. The
    target continues PARALLEL prompts at a time (they share its passes:
    localspec.runtime.engine_loop)."""
    done = _done(path)
    total = sum(min(len(p) + params.continuation_tokens, params.seq_len) for p in prompts)
    total = min(total, budget)
    out: list[list[int]] = []
    engine: Engine | None = None
    produced = 0
    try:
        with path.open("a", encoding="utf-8") as log:
            for first in range(0, len(prompts), PARALLEL):
                if produced >= budget:
                    break
                group = range(first, min(len(prompts), first + PARALLEL))
                missing = [index for index in group if index not in done]
                if missing:
                    if engine is None:
                        engine = Engine.load(params.target, draft="ngram", n_ctx=params.seq_len + 8,
                                             n_threads=params.n_threads, parallel=PARALLEL)
                    for index, tokens in zip(missing, _generate_all(engine, prompts, params,
                                                                    missing), strict=True):
                        done[index] = tokens
                        log.write(json.dumps({"index": index, "tokens": tokens}) + "\n")
                    log.flush()
                for index in group:
                    if produced >= budget:
                        break
                    out.append(list(prompts[index]) + done[index])
                    produced += len(out[-1])
                    progress(min(produced, total), total)
    finally:
        if engine is not None:
            engine.close()
    return out


def _generate_all(engine: Engine, prompts: Sequence[tuple[int, ...]], params: TrainHeadParams,
                  indices: Sequence[int]) -> list[list[int]]:
    with ThreadPoolExecutor(len(indices)) as pool:
        return list(pool.map(lambda i: _generate(engine, prompts[i], params, i), indices))


def _generate(engine: Engine, prompt: tuple[int, ...], params: TrainHeadParams,
              index: int) -> list[int]:
    room = params.seq_len - len(prompt)
    generation = GenerationParams(max_tokens=max(1, min(params.continuation_tokens, room)),
                                  temperature=0.8, seed=params.seed + index)
    return list(engine.generate(list(prompt), generation).tokens)
