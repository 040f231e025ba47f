"""The engine thread's loop: admits requests into free generation slots, steps every running
generation at once (one target pass per step: csrc/engine/speculative_step.cpp), and hands chunks
and results to the request handles.

Requests and jobs arrive on one queue, in order. A job (a function that needs the contexts)
runs between steps; a request starts when a slot is free (``LoadOptions.parallel`` slots) and
waits at the head of the line otherwise.
"""

from __future__ import annotations

import queue
import random
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any, Protocol

from localspec import _core
from localspec.errors import EngineClosedError, GenerationFailedError, InvalidParameterError
from localspec.runtime.convert import logprobs_from_core, params_to_core, stats_from_core
from localspec.text.grammar_check import GrammarError, checked_mask_seconds
from localspec.types import (
    Chunk,
    EngineInfo,
    GenerationParams,
    GenerationResult,
    GenerationStats,
    Provenance,
)

_PROVENANCE: tuple[Provenance, Provenance] = ("draft", "target")


class Job:
    """A function to run on the engine thread (it owns the contexts)."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.future: Future[Any] = Future()

    def run(self) -> None:
        try:
            self.future.set_result(self.fn())
        except BaseException as error:  # noqa: BLE001 - handed to the caller
            self.future.set_exception(error)


@dataclass(frozen=True)
class PassReport:
    """One engine step, for metrics: generations in its target pass, the pass's rows and the
    tokens it emitted."""

    sequences: int
    rows: int
    emitted: int


class Handle(Protocol):
    """What the loop needs of a request handle (localspec.runtime.engine.RequestHandle)."""

    @property
    def prompt(self) -> str | Sequence[int]: ...

    @property
    def params(self) -> GenerationParams: ...

    @property
    def prediction(self) -> list[int]: ...  # params.prediction's tokens, [] for none

    @property
    def cancelled(self) -> bool: ...

    def _on_chunk(self, chunk: Chunk) -> bool: ...

    def _finish(self, result: GenerationResult | None, error: BaseException | None) -> None: ...


class EngineLoop:
    def __init__(
        self,
        core: _core.Core,
        info: EngineInfo,
        requests: queue.Queue[Any],
        on_done: Callable[[], None],
        observers: list[Callable[[PassReport], None]],
    ) -> None:
        self._core = core
        self._info = info
        self._requests = requests
        self._on_done = on_done  # a request left the engine (finished, failed or refused)
        self._observers = observers
        self._waiting: deque[Any] = deque()
        self._running: dict[int, tuple[Handle, GenerationParams]] = {}
        self._slots = core.n_seq()

    def run(self) -> None:
        """Until close() (a None on the queue): then the running generations finish and
        requests still waiting fail."""
        closing = False
        while not closing or self._running:
            closing = self._admit(block=not self._running and not closing) or closing
            if self._running:
                self._step()
        self._fail_waiting()

    # ---- admission ------------------------------------------------------------------------

    def _admit(self, block: bool) -> bool:
        """Run queued jobs and start queued requests while slots are free; True once the
        queue says close."""
        if block and not self._waiting:
            try:
                item = self._requests.get_nowait()
            except queue.Empty:  # idle: free this thread's compute workers for other engines
                self._core.release_compute_threads()
                item = self._requests.get()
            self._waiting.append(item)
        self._drain()
        while self._waiting:
            item = self._waiting[0]
            if item is None:
                self._waiting.popleft()
                return True
            if isinstance(item, Job):
                self._waiting.popleft()
                item.run()
                continue
            if len(self._running) >= self._slots:
                break
            self._waiting.popleft()
            self._start(item)
        return False

    def _start(self, handle: Handle) -> None:
        if handle.cancelled:
            self._finish(handle, _empty_result("cancelled"), None)
            return
        params = handle.params
        if params.seed is None:
            params = replace(params, seed=random.getrandbits(63))
        if not self._info.drafter_spec.drafts:  # also when loading turned the n-gram drafter off
            params = replace(params, speculative=False)
        try:
            prompt = handle.prompt
            tokens = (
                self._core.tokenize(prompt, True, True) if isinstance(prompt, str) else list(prompt)
            )
            request = params_to_core(params, tokens)
            request.prediction = handle.prediction
            if params.grammar is not None:  # its measured cost starts its fair turns (csrc)
                request.grammar_mask_seconds = checked_mask_seconds(
                    params.grammar, self._info.n_vocab) or 0.0
            generation = self._core.start(request, _chunk_callback(handle, params))
        except Exception as error:  # a LocalspecError for a bad request; else a bug, kept visible
            self._finish(handle, None, error)
            return
        self._running[generation] = (handle, params)

    # ---- steps -------------------------------------------------------------------------------

    def _step(self) -> None:
        for generation, (handle, _) in self._running.items():
            if handle.cancelled:
                self._core.cancel(generation)
        try:
            report = self._core.step()
        except Exception as error:  # noqa: BLE001 - a failed pass ends every generation in it
            for handle, _ in self._running.values():
                self._finish(handle, None, error)
            self._running.clear()
            return
        if report.sequences:
            done = PassReport(report.sequences, report.rows, report.emitted)
            for observe in self._observers:
                observe(done)
        for generation in report.finished:
            handle, params = self._running.pop(generation)
            try:
                result = self._result(self._core.take_result(generation), params)
            except Exception as error:  # a LocalspecError, or a bug: the caller sees it
                self._finish(handle, None, error)
            else:
                self._finish(handle, result, None)

    def _result(self, raw: dict[str, Any], params: GenerationParams) -> GenerationResult:
        if raw["finish_reason"] == "error":  # this generation alone failed (csrc: fail)
            if raw["error_is_users"]:
                message = f"The generation stopped: {raw['error']}"
                if params.grammar is not None:  # a grammar is the request's one way to fail here
                    raise GrammarError(message)
                raise InvalidParameterError(message)
            raise GenerationFailedError(
                f"The generation failed and was ended alone ({raw['error']}); the engine goes "
                "on serving the others.")
        result = GenerationResult(
            text=raw["text"],
            tokens=list(raw["tokens"]),
            provenance=[_PROVENANCE[p] for p in raw["provenance"]],
            finish_reason=raw["finish_reason"],
            stats=stats_from_core(raw["stats"]),
            pass_rows=list(raw["pass_rows"]),
            pass_emitted=list(raw["pass_emitted"]),
            logprobs=logprobs_from_core(raw["logprobs"], params.logprobs),
        )
        if result.finish_reason == "stop" and params.stop:
            result.text_tokens = text_tokens(self._detokenize, result.tokens, result.text)
        return result

    def _detokenize(self, tokens: Sequence[int]) -> str:
        return self._core.detokenize(list(tokens))

    def _finish(self, handle: Handle, result: GenerationResult | None,
                error: BaseException | None) -> None:
        handle._finish(result, error)
        self._on_done()

    def _drain(self) -> None:
        """Move everything queued so far behind what already waits."""
        while True:
            try:
                self._waiting.append(self._requests.get_nowait())
            except queue.Empty:
                break

    def _fail_waiting(self) -> None:
        self._drain()
        for item in self._waiting:
            if item is not None and not isinstance(item, Job):
                self._finish(
                    item, None, EngineClosedError("The engine was closed before this request ran.")
                )
        self._waiting.clear()


def _chunk_callback(handle: Handle, params: GenerationParams) -> Callable[..., bool]:
    def on_chunk(
        text: str, ids: list[int], prov: list[int], stats: _core.GenerationStats, lps: list[Any]
    ) -> bool:
        chunk = Chunk(
            text, ids, [_PROVENANCE[p] for p in prov], stats_from_core(stats),
            logprobs_from_core(lps, params.logprobs),
        )
        return handle._on_chunk(chunk)

    return on_chunk


def text_tokens(detokenize: Callable[[Sequence[int]], str], tokens: Sequence[int],
                text: str) -> int:
    """How many of ``tokens`` it takes to spell ``text``: the fewest whose text starts with it
    (a stop string cuts the text, and the tokens after the cut never reach the caller)."""
    n = len(tokens)
    while n > 0 and detokenize(tokens[: n - 1]).startswith(text):
        n -= 1
    return n


def _empty_result(reason: str) -> GenerationResult:
    return GenerationResult("", [], [], reason, GenerationStats())  # type: ignore[arg-type]
