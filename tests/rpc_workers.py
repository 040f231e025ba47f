"""`localspec rpc-worker` processes on loopback for the RPC tests (docs/rpc.md)."""

from __future__ import annotations

import socket
import subprocess
import sys
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


def start_worker() -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    command = [sys.executable, "-m", "localspec.cli", "rpc-worker", "--port", str(port),
               "--threads", "1"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True)
    wait_listening(port, process)
    return process, f"127.0.0.1:{port}"


@contextmanager
def workers(n: int) -> Iterator[list[tuple[subprocess.Popen[str], str]]]:
    """``n`` workers; each is killed on the way out."""
    started: list[tuple[subprocess.Popen[str], str]] = []
    try:
        for _ in range(n):
            started.append(start_worker())
        yield started
    finally:
        for process, _ in started:
            if process.poll() is None:
                process.kill()
            process.wait()
