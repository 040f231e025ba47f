"""A submitted generation's handle (localspec.runtime.engine.Engine.submit): the caller iterates it
for chunks or waits for its result; the engine thread feeds it, or a HandleListener instead."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from localspec.types import Chunk, GenerationParams, GenerationResult

_DONE = object()


class HandleListener(Protocol):
    """Takes a handle's events as they happen, on the engine thread, instead of its queue (the
    server's bridge to asyncio: localspec.server.bridge). Must return at once. (The end of a
    generation whose RPC worker was lost mid-pass comes from the engine's watcher thread.)
    ``on_chunk`` returning False stops the generation after that chunk, as ``cancel`` does."""

    def on_chunk(self, chunk: Chunk) -> bool | None: ...

    def on_end(self, result: GenerationResult | None, error: BaseException | None) -> None: ...


class RequestHandle:
    """One submitted generation: iterate for chunks, ``result()`` for the whole answer (or give
    ``submit`` a HandleListener, which then receives the chunks instead)."""

    def __init__(self, prompt: str | Sequence[int], params: GenerationParams,
                 listener: HandleListener | None = None) -> None:
        self.prompt = prompt
        self.params = params
        self.prediction: list[int] = []  # params.prediction's tokens (Engine.submit)
        self._listener = listener
        self._chunks: queue.Queue[Any] = queue.Queue()
        self._cancel = threading.Event()
        self._result: GenerationResult | None = None
        self._error: BaseException | None = None
        self._finished = threading.Event()
        self._ending = threading.Lock()

    def cancel(self) -> None:
        """Ask the engine to stop this generation; it stops within one step."""
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def __iter__(self) -> Iterator[Chunk]:
        while True:
            item = self._chunks.get()
            if item is _DONE:
                break
            yield item
        if self._error is not None:
            raise self._error

    def result(self, timeout: float | None = None) -> GenerationResult:
        """Block until the generation ends and return it (raises its error, if any)."""
        if not self._finished.wait(timeout):
            raise TimeoutError("generation did not finish in time")
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    # Called on the engine thread only.
    def _on_chunk(self, chunk: Chunk) -> bool:
        if self._listener is not None:
            if self._listener.on_chunk(chunk) is False:
                self._cancel.set()
        else:
            self._chunks.put(chunk)
        return not self._cancel.is_set()

    def _finish(self, result: GenerationResult | None, error: BaseException | None) -> bool:
        """End the handle (the first end wins: a lost RPC worker's watcher and the engine
        thread may both try); whether this call ended it."""
        with self._ending:
            if self._finished.is_set():
                return False
            self._result, self._error = result, error
            self._finished.set()
        if self._listener is not None:
            self._listener.on_end(result, error)
        else:
            self._chunks.put(_DONE)
        return True
