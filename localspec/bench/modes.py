"""Default and exact mode in one bench run, interleaved (`localspec bench --modes default,exact`).

One process cannot hold both modes (exact mode switches llama.cpp's tiled K-quant matmul off for
the whole process, docs/exact.md), so each mode loads its engine in a child process of its own
and the bench drives them in turn: prompt by prompt and repeat by repeat, the two modes run one
after the other (alternating which goes first), each its plain, speculative and A/A arms. Only
the process running a repeat computes; the other waits on its pipe.

The cross-mode comparison pairs repeat r of one mode with repeat r of the other, which ran right
next to it, exactly as the bench pairs speculative with plain within a mode (bench/report.py).
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import Any

from localspec.bench.report import Report, summarize
from localspec.bench.runner import PromptRun, engine_header, run_comparison
from localspec.engine import Engine
from localspec.loading import LoadOptions
from localspec.prompts import Prompt
from localspec.types import GenerationParams

__all__ = ["MODES", "ModeComparison", "compare_modes", "run_modes"]

MODES = ("default", "exact")


@dataclass
class ModeRuns:
    """One mode's runs and what its engine reported (bench's header fields)."""

    mode: str
    runs: list[PromptRun]
    heads: dict[str, Any]


def _serve(conn: Connection, options: LoadOptions) -> None:
    """The child: load, then run one (prompt, repeat) per message until None."""
    try:
        engine = Engine(options)
    except Exception as error:  # noqa: BLE001 - handed to the parent, which raises it
        conn.send(error)
        return
    with engine:
        conn.send(engine.info.notice)
        first: PromptRun | None = None
        while (message := conn.recv()) is not None:
            prompt, params, repeat = message
            try:
                run = run_comparison(engine, [prompt], params, first_repeat=repeat,
                                     warm=first is None)[0]
            except Exception as error:  # noqa: BLE001 - as above
                conn.send(error)
                continue
            first = first or run
            conn.send(run)
        conn.send(engine_header(engine, [first] if first else []))


class _Worker:
    def __init__(self, options: LoadOptions) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(child, options), daemon=True)
        self._process.start()
        child.close()
        self.notice = self._receive()

    def _receive(self) -> Any:
        reply = self._conn.recv()
        if isinstance(reply, BaseException):
            raise reply
        return reply

    def run(self, prompt: Prompt, params: GenerationParams, repeat: int) -> PromptRun:
        self._conn.send((prompt, params, repeat))
        return self._receive()  # type: ignore[no-any-return]

    def finish(self) -> dict[str, Any]:
        self._conn.send(None)
        heads = self._receive()
        self._process.join()
        return heads  # type: ignore[no-any-return]

    def kill(self) -> None:
        if self._process.is_alive():
            self._process.kill()


def _merge(into: PromptRun | None, run: PromptRun) -> PromptRun:
    if into is None:
        return run
    into.plain += run.plain
    into.speculative += run.speculative
    into.plain_again += run.plain_again
    into.identical = into.identical and run.identical
    into.divergences += run.divergences
    return into


def run_modes(options: LoadOptions, prompts: Sequence[Prompt], params: GenerationParams,
              repeat: int, progress: Callable[[int, int], None] | None = None,
              notice: Callable[[str], None] | None = None) -> list[ModeRuns]:
    """Every prompt's repeats in both modes, interleaved; the modes' runs in MODES order."""
    workers: dict[str, _Worker] = {}
    try:
        for mode in MODES:
            workers[mode] = _Worker(replace(options, exact=mode == "exact"))
            if workers[mode].notice and notice:
                notice(f"{mode} mode: {workers[mode].notice}")
        runs: dict[str, list[PromptRun]] = {mode: [] for mode in MODES}
        total, done = len(prompts) * repeat * len(MODES), 0
        for prompt in prompts:
            merged: dict[str, PromptRun | None] = dict.fromkeys(MODES)
            for r in range(repeat):
                for mode in MODES if r % 2 == 0 else tuple(reversed(MODES)):
                    merged[mode] = _merge(merged[mode], workers[mode].run(prompt, params, r))
                    done += 1
                    if progress:
                        progress(done, total)
            for mode in MODES:
                runs[mode].append(merged[mode])  # type: ignore[arg-type]
        return [ModeRuns(mode, runs[mode], workers[mode].finish()) for mode in MODES]
    finally:
        for worker in workers.values():
            worker.kill()


@dataclass
class ModeComparison:
    """Exact mode against default mode: ``speculative`` and ``plain`` are reports whose
    "speedup" is exact / default tokens/s of that arm (per prompt: the median of paired
    repeats; per category and overall: total tokens over total time)."""

    speculative: Report
    plain: Report

    def to_dict(self) -> dict[str, Any]:
        return {arm: {"overall": report.overall.speedup,
                      "spread": report.overall.speedup_spread,
                      "categories": {row.label: row.speedup for row in report.categories},
                      "worst_category": report.worst.category if report.worst else None}
                for arm, report in (("speculative", self.speculative), ("plain", self.plain))}


def compare_modes(default: Sequence[PromptRun], exact: Sequence[PromptRun]) -> ModeComparison:
    """Pairs each prompt's repeat r across the modes: default mode's arm stands where the bench
    puts plain decoding, exact mode's where it puts speculation, so summarize's ratios read
    exact / default."""
    def paired(arm: str) -> Report:
        return summarize([
            PromptRun(d.prompt, plain=getattr(d, arm), speculative=getattr(e, arm),
                      identical=d.identical and e.identical)
            for d, e in zip(default, exact, strict=True)
        ])

    return ModeComparison(paired("speculative"), paired("plain"))
