"""Two ways of loading the same pair in one bench run, interleaved (`localspec bench --modes
default,exact`, and `--modes local,rpc`).

Each mode loads its engine in a child process of its own, so that neither shares anything with
the other (memory, llama.cpp's per-process state, ggml's numbering of RPC devices), and the bench
drives them in turn: prompt by prompt and repeat by repeat, the two modes run one after the
other (alternating which goes first), each its plain, speculative and A/A arms. Only the
process running a repeat computes; the other waits on its pipe.

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

__all__ = ["MODE_PAIRS", "ModeComparison", "compare_modes", "mode_options", "run_modes"]

# The modes a run can compare, base first: the comparison reads second / first.
MODE_PAIRS = (("default", "exact"), ("local", "rpc"))


def mode_options(options: LoadOptions, mode: str) -> LoadOptions:
    """How `mode` loads the pair that `options` describe: exact mode or not; this machine
    alone ("local") or with the options' RPC workers ("rpc")."""
    if mode in ("default", "exact"):
        return replace(options, exact=mode == "exact")
    if mode == "local":
        return replace(options, rpc=())
    if mode == "rpc":
        return options
    raise ValueError(f"unknown bench mode {mode!r}")


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


def run_modes(modes: dict[str, LoadOptions], prompts: Sequence[Prompt], params: GenerationParams,
              repeat: int, progress: Callable[[int, int], None] | None = None,
              notice: Callable[[str], None] | None = None) -> list[ModeRuns]:
    """Every prompt's repeats in each mode (name: how it loads), interleaved; the modes' runs
    in the dict's order."""
    names = tuple(modes)
    workers: dict[str, _Worker] = {}
    try:
        for mode in names:
            workers[mode] = _Worker(modes[mode])
            if workers[mode].notice and notice:
                notice(f"{mode} mode: {workers[mode].notice}")
        runs: dict[str, list[PromptRun]] = {mode: [] for mode in names}
        total, done = len(prompts) * repeat * len(names), 0
        for prompt in prompts:
            merged: dict[str, PromptRun | None] = dict.fromkeys(names)
            for r in range(repeat):
                for mode in names if r % 2 == 0 else tuple(reversed(names)):
                    merged[mode] = _merge(merged[mode], workers[mode].run(prompt, params, r))
                    done += 1
                    if progress:
                        progress(done, total)
            for mode in names:
                runs[mode].append(merged[mode])  # type: ignore[arg-type]
        return [ModeRuns(mode, runs[mode], workers[mode].finish()) for mode in names]
    finally:
        for worker in workers.values():
            worker.kill()


@dataclass
class ModeComparison:
    """One mode against the other (exact against default, rpc against local): ``speculative``
    and ``plain`` are reports whose "speedup" is second / first mode's tokens/s of that arm
    (per prompt: the median of paired repeats; per category and overall: total tokens over
    total time)."""

    speculative: Report
    plain: Report

    def to_dict(self) -> dict[str, Any]:
        return {arm: {"overall": report.overall.speedup,
                      "spread": report.overall.speedup_spread,
                      "categories": {row.label: row.speedup for row in report.categories},
                      "worst_category": report.worst.category if report.worst else None}
                for arm, report in (("speculative", self.speculative), ("plain", self.plain))}


def compare_modes(first: Sequence[PromptRun], second: Sequence[PromptRun]) -> ModeComparison:
    """Pairs each prompt's repeat r across the modes: the first mode's arm stands where the
    bench puts plain decoding, the second's where it puts speculation, so summarize's ratios
    read second / first."""
    def paired(arm: str) -> Report:
        return summarize([
            PromptRun(a.prompt, plain=getattr(a, arm), speculative=getattr(b, arm),
                      identical=a.identical and b.identical)
            for a, b in zip(first, second, strict=True)
        ])

    return ModeComparison(paired("speculative"), paired("plain"))
