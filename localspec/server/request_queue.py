"""The server's request queue: the one place that decides which request runs when.

A request is admitted (or refused with 429 when ``capacity`` requests are already running or
waiting), waits for one of ``slots`` running slots, runs, and is released. Releasing a waiting
ticket frees its place at once: a client that goes away stops counting immediately, not when the
engine would have reached it. The engine only ever sees the running requests.

Everything here runs on the event loop (no locks). Batched serving raises ``slots``.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import Literal

from localspec.errors import QueueFullError

State = Literal["waiting", "running", "released"]


class QueueTimeout(Exception):
    """The request's deadline passed while it waited for a slot."""


class Ticket:
    """One admitted request's place: waiting, then running, then released."""

    def __init__(self, arrived: float, turn: asyncio.Future[BaseException | None]) -> None:
        self.arrived = arrived
        self.state: State = "waiting"
        self._turn = turn
        # Set while running: how to end the request early (server shutdown).
        self.on_stop: Callable[[BaseException], None] | None = None
        self.stopped: BaseException | None = None

    @property
    def running(self) -> bool:
        return self.state == "running"

    async def turn(self, timeout: float | None = None) -> None:
        """Wait for a running slot; raise the queue's error if it closed, QueueTimeout if
        ``timeout`` seconds pass first."""
        try:
            error = await asyncio.wait_for(asyncio.shield(self._turn), timeout)
        except asyncio.TimeoutError:
            raise QueueTimeout() from None
        if error is not None:
            raise error

    def stop(self, error: BaseException) -> None:
        self.stopped = error
        if self.on_stop is not None:
            self.on_stop(error)


class RequestQueue:
    """At most ``capacity`` tickets at once, of which ``slots`` run."""

    def __init__(
        self,
        capacity: int,
        slots: int = 1,
        on_turn: Callable[[float], None] | None = None,
    ) -> None:
        self.capacity = capacity
        self.slots = slots
        self._on_turn = on_turn
        self._waiting: deque[Ticket] = deque()
        self._running: set[Ticket] = set()
        self._closed: BaseException | None = None

    @property
    def depth(self) -> int:
        """Requests running or waiting."""
        return len(self._waiting) + len(self._running)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def admit(self) -> Ticket:
        """A ticket, running at once when a slot is free. Raises QueueFullError when full and
        the closing error once ``close`` was called."""
        if self._closed is not None:
            raise self._closed
        if self.depth >= self.capacity:
            raise QueueFullError(
                f"{self.depth} requests are already running or waiting (--max-queue "
                f"{self.capacity}); retry when one has finished."
            )
        ticket = Ticket(time.monotonic(), asyncio.get_running_loop().create_future())
        self._waiting.append(ticket)
        self._promote()
        return ticket

    def release(self, ticket: Ticket) -> None:
        """Give the ticket's place back (idempotent); the next waiting ticket may run."""
        if ticket.state == "waiting":
            self._waiting.remove(ticket)
            ticket._turn.cancel()
        elif ticket.state == "running":
            self._running.discard(ticket)
        ticket.state = "released"
        self._promote()

    def close(self, error: BaseException) -> None:
        """Admit nothing more; waiting tickets get ``error`` instead of a turn."""
        self._closed = error
        while self._waiting:
            ticket = self._waiting.popleft()
            ticket.state = "released"
            if not ticket._turn.done():
                ticket._turn.set_result(error)

    def stop_running(self, error: BaseException) -> None:
        """Ask every running request to end now with ``error``."""
        for ticket in list(self._running):
            ticket.stop(error)

    def _promote(self) -> None:
        while self._waiting and len(self._running) < self.slots:
            ticket = self._waiting.popleft()
            ticket.state = "running"
            self._running.add(ticket)
            if not ticket._turn.done():
                ticket._turn.set_result(None)
            if self._on_turn is not None:
                self._on_turn(time.monotonic() - ticket.arrived)
