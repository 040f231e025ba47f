"""Bridge a RequestHandle (a blocking iterator fed by the engine thread) to asyncio.

A small reader thread per request iterates the handle and hands each event to the event
loop with ``call_soon_threadsafe``; the loop never blocks on the engine. ``on_finish`` runs
on the reader thread with the final result, whether or not anyone is still listening, so
metrics count cancelled generations too.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from starlette.requests import Request

from localspec.engine import RequestHandle
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
    """Read one handle's chunks on a thread; ``await next()`` yields them on the loop."""

    def __init__(
        self,
        handle: RequestHandle,
        on_finish: Callable[[GenerationResult], None] | None = None,
    ) -> None:
        self.handle = handle
        self._loop = asyncio.get_running_loop()
        self._events: asyncio.Queue[Event] = asyncio.Queue()
        self._on_finish = on_finish
        self._next_check = 0.0
        self._thread = threading.Thread(target=self._read, name="localspec-reader", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for chunk in self.handle:
                self._deliver(chunk)
            result = self.handle.result()
        except BaseException as error:  # noqa: BLE001 - forwarded to the request's task
            self._deliver(Failed(error))
            return
        if self._on_finish is not None:
            self._on_finish(result)
        self._deliver(Finished(result))

    def _deliver(self, event: Event) -> None:
        try:
            self._loop.call_soon_threadsafe(self._events.put_nowait, event)
        except RuntimeError:  # the loop is closed (server shut down): nobody is listening
            self.handle.cancel()

    async def next(self) -> Event:
        return await self._events.get()

    async def next_or_disconnect(self, request: Request) -> Event:
        """The next event; raise Disconnected (after cancelling) if the client leaves first."""
        while True:
            now = time.monotonic()
            if now >= self._next_check:  # by the clock: chunks may arrive faster than the poll
                self._next_check = now + DISCONNECT_POLL_SECONDS
                if await request.is_disconnected():
                    self.handle.cancel()
                    raise Disconnected()
            try:
                return await asyncio.wait_for(self._events.get(), DISCONNECT_POLL_SECONDS)
            except asyncio.TimeoutError:
                continue

    def interrupt(self, error: BaseException) -> None:
        """End the request now (on the loop): cancel the generation and hand ``error`` to the
        reader after the chunks already delivered; what the engine sends later is not read."""
        self.handle.cancel()
        self._events.put_nowait(Failed(error))

    def cancel(self) -> None:
        self.handle.cancel()
