"""The engine's supervision of RPC workers (docs/rpc.md, "How it works"): a worker lost in the
middle of a pass or a load, or one that closed its connection between passes, takes the engine
thread with it. The supervision notices (a watcher thread, and every `status` / `failure`), fails
what waits, leaves that thread and its core (retired: its vocabulary still serves the text
helpers), and loads the model again on a new engine thread at the next request
(Engine._check_open).

A mixin of Engine: it reads and writes the engine's state under the engine's locks; the
attributes below are the engine's, declared here for the type checker.
"""

from __future__ import annotations

import queue
import threading
import weakref
from typing import TYPE_CHECKING

from localspec import _core
from localspec.errors import LocalspecError, RemoteWorkerError
from localspec.runtime.engine_loop import Job
from localspec.runtime.loading import LoadOptions, open_core
from localspec.runtime.rpc import await_unless_stuck, sentence
from localspec.runtime.shared_lock import SharedLock
from localspec.types import EngineInfo

if TYPE_CHECKING:
    from localspec._core import Core
    from localspec.runtime.handle import RequestHandle


class WorkerSupervision:
    """Engine's RPC half: probing, abandoning and reloading (no effect without ``rpc``)."""

    options: LoadOptions
    info: EngineInfo
    _core: Core
    _lock: threading.Lock
    _text_lock: SharedLock
    _stopped: threading.Event
    _thread: threading.Thread | None
    _requests: queue.Queue[RequestHandle | Job | None]
    _live: weakref.WeakSet[RequestHandle]
    _broken: LocalspecError | None
    _reloading: bool
    _watching: bool
    _retired: list[Core]

    def _request_done(self) -> None:
        raise NotImplementedError

    def _await_load(self, loaded: Job) -> tuple[Core, EngineInfo]:
        """The first load's result; a worker lost in the middle of it leaves the engine thread
        waiting forever: that is a RemoteWorkerError here."""
        result: tuple[Core, EngineInfo] = await_unless_stuck(loaded.future, self.options.rpc)
        return result

    def _reload(self) -> tuple[Core, EngineInfo]:
        """On a new engine thread after a lost worker: probe the workers (RemoteWorkerError while
        one does not answer), then load the model again (the lost one is never freed)."""
        _core.rpc_reconnect(list(self.options.rpc))
        with self._lock:
            self._watching = True
        core, info = open_core(self.options)
        with self._text_lock.alone(), self._lock:
            self._core, self.info, self._reloading = core, info, False
        self._close_retired()
        return core, info

    def _close_retired(self) -> None:
        with self._text_lock.alone():
            with self._lock:
                retired, self._retired = self._retired, []
            for core in retired:
                core.close()

    def _watch_workers(self) -> None:
        """With RPC workers: a worker lost in the middle of a pass (or a load) leaves the engine
        thread waiting forever (the core parks ggml's connection thread instead of letting ggml
        abort: csrc/rpc/rpc.h); one that closed its connection between passes leaves the contexts
        unusable. Either way: fail what waits, leave that thread, and load again at the next
        request (Engine._check_open)."""
        while not self._stopped.wait(0.25):
            self._check_workers()

    def _check_workers(self) -> None:
        """The watcher's check, also made by `status` and `failure`, so that they never say
        "ok" in the quarter second between a lost worker failing a request and the watcher's
        next look."""
        endpoints = list(self.options.rpc)
        if not endpoints:
            return
        with self._lock:
            watching, ready, thread = self._watching, not self._reloading, self._thread
        if not watching:
            return
        stuck = _core.rpc_failure(endpoints)
        lost = stuck or (_core.rpc_lost(endpoints) if ready else "")
        if lost:
            self._abandon(RemoteWorkerError(sentence(lost)), stuck=bool(stuck), thread=thread)

    def _abandon(self, error: RemoteWorkerError, stuck: bool,
                 thread: threading.Thread | None) -> None:
        """Leave the engine thread `thread` that lost a worker: unless another check (watcher or
        status, racing) already left it and maybe started the next one."""
        with self._lock:
            if not self._watching or self._thread is not thread:
                return
            self._broken, self._reloading, self._watching = error, False, False
            requests, self._thread = self._requests, None
            handles = [h for h in self._live if not h._finished.is_set()] if stuck else []
        if not stuck:  # the thread fails what it holds (each pass checks the workers) and ends
            requests.put(None)
        for handle in handles:
            if handle._finish(None, error):
                self._request_done()
