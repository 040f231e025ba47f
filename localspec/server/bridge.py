"""Bridge a request's events, delivered on the engine thread, to asyncio.

The reader is the handle's listener (localspec.runtime.engine.HandleListener): the engine thread
hands
each chunk and the end to the event loop with ``call_soon_threadsafe``; the loop never blocks on
the engine, and no thread waits per request. ``on_finish`` runs on the engine thread with the
final result, whether or not anyone is still listening, so metrics count cancelled generations
too.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from starlette.requests import Request

from localspec.runtime.engine import HandleListener, RequestHandle
from localspec.server.infill import LineStop
from localspec.types import Chunk, GenerationResult

DISCONNECT_POLL_SECONDS = 0.1


@dataclass
class Finished:
    result: GenerationResult


@dataclass
class Failed:
    error: BaseException


Event = Chunk | Finished | Failed


class Disconnected(Exception):
    """The client went away while we waited for the engine."""


class HandleReader:
    """One request's events on the loop: ``start`` submits it with this reader as its
    listener; ``await next()`` yields the chunks, then Finished or Failed."""

    def __init__(self, on_finish: Callable[[GenerationResult], None] | None = None,
                 stop_rule: LineStop | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop_rule = stop_rule if stop_rule is not None and stop_rule.active else None
        self._events: asyncio.Queue[Event] = asyncio.Queue()
        self._on_finish = on_finish
        self._next_check = 0.0
        self.handle: RequestHandle | None = None

    def start(self, submit: Callable[[HandleListener], RequestHandle]) -> None:
        self.handle = submit(self)

    # Called on the engine thread.
    def on_chunk(self, chunk: Chunk) -> bool:
        """False (a stop rule ended the completion) stops the generation after this chunk."""
        if self._stop_rule is None:
            self._deliver(chunk)
            return True
        self._deliver(self._stop_rule.see(chunk))
        return not self._stop_rule.stopped

    def on_end(self, result: GenerationResult | None, error: BaseException | None) -> None:
        if error is not None or result is None:
            self._deliver(Failed(error or RuntimeError("the generation ended without a result")))
            return
        if self._on_finish is not None:
            self._on_finish(result)
        self._deliver(Finished(result))

    def _deliver(self, event: Event) -> None:
        try:
            self._loop.call_soon_threadsafe(self._events.put_nowait, event)
        except RuntimeError:  # the loop is closed (server shut down): nobody is listening
            self.cancel()

    async def next(self) -> Event:
        return await self._events.get()

    async def next_or_disconnect(self, request: Request) -> Event:
        """The next event; raise Disconnected (after cancelling) if the client leaves first."""
        while True:
            now = time.monotonic()
            if now >= self._next_check:  # by the clock: chunks may arrive faster than the poll
                self._next_check = now + DISCONNECT_POLL_SECONDS
                if await request.is_disconnected():
                    self.cancel()
                    raise Disconnected()
            try:
                return await asyncio.wait_for(self._events.get(), DISCONNECT_POLL_SECONDS)
            except asyncio.TimeoutError:
                continue

    def interrupt(self, error: BaseException) -> None:
        """End the request now (on the loop): cancel the generation and hand ``error`` to the
        reader after the chunks already delivered; what the engine sends later is not read."""
        self.cancel()
        self._events.put_nowait(Failed(error))

    def cancel(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
