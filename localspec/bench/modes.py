"""Two ways of loading the same pair in one bench run, interleaved (`localspec bench --modes
default,exact`, and `--modes local,rpc`).

Each mode loads its engine in a child process of its own, so that neither shares anything with
the other (memory, llama.cpp's per-process state, ggml's numbering of RPC devices), and the bench
drives them in turn: prompt by prompt and repeat by repeat, the two modes run one after the
other (alternating which goes first), each its plain, speculative and A/A arms. Only the
process running a repeat computes; the other waits on its pipe.

The cross-mode comparison pairs repeat r of one mode with repeat r of the other, which ran right
next to it, exactly as the bench pairs speculative with plain within a mode (bench/report.py).

Two modes may write different greedy texts (exact mode's kernels round differently), and an
n-gram drafter finds more or less of each text: per prompt that moves speculative tokens/s by
tens of percent either way. So with greedy decoding the bench also times the *same passes* in
both modes: each mode replays the target passes of both modes' first speculative run (the same
tokens, rows per pass and roll-backs: Engine.replay_greedy, prefill left out; as many replays
of each as the run has repeats, the median), which measures what one mode's kernels cost
against the other's with the texts held equal.
"""

from __future__ import annotations

import multiprocessing
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import Any

from localspec.bench.prompts import Prompt
from localspec.bench.report import Report, summarize
from localspec.bench.runner import PromptRun, constrained, engine_header, run_comparison
from localspec.runtime.engine import Engine
from localspec.runtime.loading import LoadOptions
from localspec.types import GenerationParams, GenerationResult

__all__ = ["MODE_PAIRS", "ModeComparison", "compare_modes", "mode_options", "run_modes",
           "same_pass_ratios"]

# The modes a run can compare, base first: the comparison reads second / first.
MODE_PAIRS = (("default", "exact"), ("local", "rpc"), ("llama-body", "default"))


def mode_options(options: LoadOptions, mode: str) -> LoadOptions:
    """How `mode` loads the pair that `options` describe: exact mode or not; this machine
    alone ("local") or with the options' RPC workers ("rpc"); the body's matrices by
    llama.cpp's kernels ("llama-body") instead of localspec's."""
    if mode in ("default", "exact"):
        return replace(options, exact=mode == "exact")
    if mode == "llama-body":
        return replace(options, exact=False, fast_body=False)
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


@dataclass(frozen=True)
class _Replay:
    """A message to a mode's process: time the target passes of `schedule`."""

    prompt_tokens: list[int]
    schedule: GenerationResult
    params: GenerationParams


def _replay_seconds(engine: Engine, replay: _Replay) -> float:
    """Seconds of the schedule's target passes in this engine, its prefill left out (as the
    bench's tokens/s leave it out): a replay of the whole schedule less one of its prefill."""
    def timed(schedule: GenerationResult) -> float:
        start = time.perf_counter()
        engine.replay_greedy(replay.prompt_tokens, schedule, replay.params)
        return time.perf_counter() - start

    prefill = timed(replace(replay.schedule, pass_rows=[], pass_emitted=[]))
    return timed(replay.schedule) - prefill


def _serve(conn: Connection, options: LoadOptions) -> None:
    """The child: load, then run one (prompt, repeat) or one replay per message until None."""
    try:
        engine = Engine(options)
    except Exception as error:  # noqa: BLE001 - handed to the parent, which raises it
        conn.send(error)
        return
    with engine:
        conn.send(engine.info.notice)
        first: PromptRun | None = None
        while (message := conn.recv()) is not None:
            if isinstance(message, _Replay):
                conn.send(_replay_seconds(engine, message))
                continue
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

    def replay(self, replay: _Replay) -> float:
        self._conn.send(replay)
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
            if params.temperature == 0:
                _time_same_passes(workers, merged, prompt, params,  # type: ignore[arg-type]
                                  rounds=repeat)
            for mode in names:
                runs[mode].append(merged[mode])  # type: ignore[arg-type]
        return [ModeRuns(mode, runs[mode], workers[mode].finish()) for mode in names]
    finally:
        for worker in workers.values():
            worker.kill()


def _time_same_passes(workers: dict[str, _Worker], merged: dict[str, PromptRun],
                      prompt: Prompt, params: GenerationParams, rounds: int) -> None:
    """Sets each mode's same_pass_seconds: the sum, over every mode's first speculative run,
    of the median of `rounds` replays of it in this mode (the modes' order alternating, so
    that drift on this machine falls on both alike). A replay runs every pass even where the
    other mode's text is not this mode's argmax, so the passes stay the same."""
    names = list(workers)
    replays = []
    for source in names:
        run = merged[source]
        if run.schedule is None:
            return
        replays.append(_Replay(run.prompt_tokens, run.schedule, constrained(params, prompt)))
    timings: dict[tuple[str, int], list[float]] = {}
    for r in range(max(1, rounds)):
        for i, replay in enumerate(replays):
            for mode in names if (r + i) % 2 == 0 else reversed(names):
                timings.setdefault((mode, i), []).append(workers[mode].replay(replay))
    for mode in names:
        merged[mode].same_pass_seconds = sum(
            statistics.median(timings[(mode, i)]) for i in range(len(replays)))


def same_pass_ratios(first: Sequence[PromptRun],
                     second: Sequence[PromptRun]) -> tuple[dict[str, float], int]:
    """Second mode's speed over the first's on the same passes, per category and "all": the
    first mode's total replay seconds over the second's. Also how many prompts had no replay
    timing (not greedy)."""
    totals: dict[str, list[float]] = {}
    skipped = 0
    for a, b in zip(first, second, strict=True):
        if a.same_pass_seconds is None or b.same_pass_seconds is None:
            skipped += 1
            continue
        for label in (a.prompt.category, "all"):
            pair = totals.setdefault(label, [0.0, 0.0])
            pair[0] += a.same_pass_seconds
            pair[1] += b.same_pass_seconds
    return {label: t1 / t2 for label, (t1, t2) in totals.items() if t2 > 0}, skipped


@dataclass
class ModeComparison:
    """One mode against the other (exact against default, rpc against local): ``speculative``
    and ``plain`` are reports whose "speedup" is second / first mode's tokens/s of that arm
    (per prompt: the median of paired repeats; per category and overall: total tokens over
    total time)."""

    speculative: Report
    plain: Report
    # second / first speed on the same passes (same_pass_ratios), and prompts left out
    same_passes: dict[str, float]
    same_passes_skipped: int

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            arm: {"overall": report.overall.speedup,
                  "spread": report.overall.speedup_spread,
                  "categories": {row.label: row.speedup for row in report.categories},
                  "worst_category": report.worst.category if report.worst else None}
            for arm, report in (("speculative", self.speculative), ("plain", self.plain))}
        if self.same_passes:
            out["same_passes"] = {
                "overall": self.same_passes["all"],
                "categories": {k: v for k, v in self.same_passes.items() if k != "all"},
                "skipped": self.same_passes_skipped}
        return out


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

    return ModeComparison(paired("speculative"), paired("plain"), *same_pass_ratios(first, second))
