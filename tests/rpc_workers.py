"""`localspec rpc-worker` processes on loopback for the RPC tests (docs/rpc.md)."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from tests.test_server_cli import free_port

STARTUP_SECONDS = 60


def wait_listening(port: int, process: subprocess.Popen[str]) -> None:
    """Until the worker accepts connections (a bare connect: the worker serves the next client
    once this one hangs up)."""
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"rpc-worker exited early: {process.communicate()[1]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("rpc-worker did not listen in time")


def start_worker(port: int | None = None, *,
                 exact: bool = False) -> tuple[subprocess.Popen[str], str]:
    """A worker on ``port`` (default: a free one), with ``--exact`` if asked; its process and
    HOST:PORT."""
    port = port or free_port()
    command = [sys.executable, "-m", "localspec.cli", "rpc-worker", "--port", str(port),
               "--threads", "1", *(["--exact"] if exact else [])]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True)
    wait_listening(port, process)
    return process, f"127.0.0.1:{port}"


@contextmanager
def workers(n: int, *, exact: bool = False) -> Iterator[list[tuple[subprocess.Popen[str], str]]]:
    """``n`` workers (``rpc-worker --exact`` if asked); each is killed on the way out."""
    started: list[tuple[subprocess.Popen[str], str]] = []
    try:
        for _ in range(n):
            started.append(start_worker(exact=exact))
        yield started
    finally:
        for process, _ in started:
            if process.poll() is None:
                process.kill()
            process.wait()


class CuttingProxy:
    """A TCP relay in front of a worker that breaks the link the way a failing network or a
    dying worker does: it relays the first ``connections`` connections (then refuses new ones),
    and cuts any connection once its client has sent ``cut_after`` bytes."""

    def __init__(self, worker: str, connections: int = 1 << 30, cut_after: int = 1 << 62) -> None:
        host, port = worker.rsplit(":", 1)
        self._worker = (host, int(port))
        self._left = connections
        self._cut_after = cut_after
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while self._left > 0:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self._left -= 1
            if self._left == 0:
                self._listener.close()  # before relaying: later connections are refused
            upstream = socket.create_connection(self._worker)
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()
        self._listener.close()

    def _pump(self, source: socket.socket, sink: socket.socket, counted: bool) -> None:
        sent = 0
        try:
            while data := source.recv(65536):
                sent += len(data) if counted else 0
                if sent > self._cut_after:
                    break
                sink.sendall(data)
        except OSError:
            pass
        for end in (source, sink):
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            end.close()
