"""A lock that many holders share, or one holds alone (a readers-writer lock).

The engine's text helpers (tokenize, detokenize, grammar checks) read the core's vocabulary
from the callers' threads, with the GIL released: they share the lock, so that one long prompt
being tokenized does not make every other request wait for it. Closing or replacing the core
takes the lock alone, after the running helpers are done and before new ones start.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class SharedLock:
    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._sharing = 0  # holders of the shared side
        self._alone = False  # the exclusive side is held
        self._waiting_alone = 0  # exclusive holders waiting: new shared holders wait for them

    @contextmanager
    def shared(self) -> Iterator[None]:
        with self._changed:
            while self._alone or self._waiting_alone:
                self._changed.wait()
            self._sharing += 1
        try:
            yield
        finally:
            with self._changed:
                self._sharing -= 1
                self._changed.notify_all()

    @contextmanager
    def alone(self) -> Iterator[None]:
        with self._changed:
            self._waiting_alone += 1
            while self._alone or self._sharing:
                self._changed.wait()
            self._waiting_alone -= 1
            self._alone = True
        try:
            yield
        finally:
            with self._changed:
                self._alone = False
                self._changed.notify_all()
