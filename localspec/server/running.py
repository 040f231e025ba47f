"""One admitted request from its queue ticket to its last event: waiting for a slot (unless the
client leaves), submitting to the engine, the optional deadline, and giving the slot back."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TypeVar

from starlette.requests import Request

from localspec.runtime.engine import Engine
from localspec.server.bridge import Disconnected, Event, HandleReader
from localspec.server.errors import ApiError
from localspec.server.infill import InfillShape
from localspec.server.prepare import Prepared
from localspec.server.request_queue import QueueTimeout, RequestQueue, Ticket
from localspec.server.responses import Shape
from localspec.server.schemas import SamplingRequest
from localspec.types import GenerationResult

_T = TypeVar("_T")


@dataclass
class Call:
    """One request in flight: what was asked and how to shape the answer."""

    request: SamplingRequest
    prepared: Prepared
    shape: Shape | InfillShape
    endpoint: str


class Run:
    """A Call with its ticket. ``close`` (idempotent) stops the generation and frees the slot."""

    def __init__(
        self,
        call: Call,
        queue: RequestQueue,
        http: Request,
        timeout: float | None,
    ) -> None:
        self.call = call
        self.http = http
        self.queue = queue
        self.ticket: Ticket = queue.admit()
        self.reader: HandleReader | None = None
        self.deadline_hit = False
        self._deadline = None if timeout is None else self.ticket.arrived + timeout
        self._timer: asyncio.TimerHandle | None = None

    async def wait_turn(self, watch_client: bool) -> None:
        """Wait for a running slot. ``watch_client``: raise Disconnected (the slot is given back
        by ``close``) as soon as the client goes away; streams leave that to the SSE response."""
        try:
            if watch_client:
                await unless_disconnected(self.http, self.ticket.turn(self._left()))
            else:
                await self.ticket.turn(self._left())
        except QueueTimeout:
            raise ApiError(
                503,
                "The request waited in the queue past the server's --request-timeout; retry "
                "later.",
                code="queue_timeout", reason="queue_timeout",
            ) from None

    def submit(self, engine: Engine, on_finish: Callable[[GenerationResult], None]) -> None:
        if self.ticket.stopped is not None:
            raise self.ticket.stopped
        prepared = self.call.prepared
        shape = self.call.shape
        stop_rule = shape.stop_rule if isinstance(shape, InfillShape) else None
        self.reader = HandleReader(on_finish, stop_rule)
        self.reader.start(lambda listener: engine.submit(prepared.tokens, prepared.params,
                                                         listener=listener))
        self.ticket.on_stop = self.reader.interrupt
        left = self._left()
        if left is not None:
            self._timer = asyncio.get_running_loop().call_later(left, self._time_up)

    async def next(self, watch_client: bool = False) -> Event:
        assert self.reader is not None
        if watch_client:
            return await self.reader.next_or_disconnect(self.http)
        return await self.reader.next()

    def final(self, result: GenerationResult) -> GenerationResult:
        """The result as the client sees it: stopped by the deadline reads as ``length``."""
        if self.deadline_hit and result.finish_reason == "cancelled":
            return replace(result, finish_reason="length")
        return result

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self.reader is not None:
            self.reader.cancel()  # a finished generation ignores it
        self.queue.release(self.ticket)

    def _left(self) -> float | None:
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - time.monotonic())

    def _time_up(self) -> None:
        self.deadline_hit = True
        if self.reader is not None:
            self.reader.cancel()


async def unless_disconnected(http: Request, waiting: Awaitable[_T]) -> _T:
    """Await ``waiting`` unless the client disconnects first (then raise Disconnected)."""
    work = asyncio.ensure_future(waiting)
    gone = asyncio.ensure_future(_disconnect(http))
    try:
        done, _ = await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        work.cancel()
        gone.cancel()
    if work in done:
        return work.result()
    raise Disconnected()


async def _disconnect(http: Request) -> None:
    while (await http.receive())["type"] != "http.disconnect":
        pass
