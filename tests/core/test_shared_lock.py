"""The engine's text lock (localspec.runtime.shared_lock): tokenizations share it, closing the
core takes it alone, after the running ones and before new ones."""

from __future__ import annotations

import threading
import time

from localspec.runtime.shared_lock import SharedLock


def test_shared_holders_run_together() -> None:
    lock = SharedLock()
    inside = threading.Barrier(2, timeout=5)

    def hold() -> None:
        with lock.shared():
            inside.wait()  # both must be inside at once, or this times out

    threads = [threading.Thread(target=hold) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not inside.broken


def test_alone_waits_for_sharers_and_new_sharers_wait_for_it() -> None:
    lock = SharedLock()
    order: list[str] = []
    release = threading.Event()

    def sharer(name: str) -> None:
        with lock.shared():
            order.append(name)
            release.wait(5)

    def alone() -> None:
        with lock.alone():
            order.append("alone")

    first = threading.Thread(target=sharer, args=("first",))
    first.start()
    time.sleep(0.05)
    writer = threading.Thread(target=alone)
    writer.start()
    time.sleep(0.05)
    late = threading.Thread(target=sharer, args=("late",))
    late.start()
    time.sleep(0.05)
    assert order == ["first"]  # the writer waits for the first; the late one for the writer
    release.set()
    for t in (first, writer, late):
        t.join(5)
    assert order == ["first", "alone", "late"]
