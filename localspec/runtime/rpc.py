"""A target spread over machines with llama.cpp's RPC backend (docs/rpc.md).

Other machines run ``localspec rpc-worker`` and lend their devices; ``--rpc HOST:PORT,...``
(``LoadOptions.rpc``) places the target's layers over them first, then the local GPUs; the
drafter and the target's output layer stay local. The RPC backend is a build option of
llama-cpp-python: ``require_rpc`` says how to install it when the installed build lacks it.
"""

from __future__ import annotations

import ipaddress
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any, TypeVar

from localspec.errors import InvalidParameterError, RemoteWorkerError, RpcUnavailableError

DEFAULT_PORT = 50052
ENDPOINT_EXAMPLE = "192.168.1.20:50052"

T = TypeVar("T")


def endpoint_violation(endpoint: object) -> str | None:
    """Why ``endpoint`` is not HOST:PORT, or None when it is."""
    if not isinstance(endpoint, str):
        return f"{endpoint!r} is not text"
    host, colon, port = endpoint.rpartition(":")
    if not colon or not host or any(c.isspace() or c in ",[]:" for c in host):
        return f"{endpoint!r} is not HOST:PORT (an IPv4 address or host name, then the port)"
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        return f"{endpoint!r} has no port from 1 to 65535"
    return None


def endpoints_violation(endpoints: object) -> str | None:
    """LoadOptions' rule for ``rpc``: a tuple of distinct HOST:PORT strings."""
    if not isinstance(endpoints, tuple):
        return "it must be a tuple of HOST:PORT strings"
    for endpoint in endpoints:
        problem = endpoint_violation(endpoint)
        if problem is not None:
            return f"{problem}; write it like {ENDPOINT_EXAMPLE}"
    if len(set(endpoints)) != len(endpoints):
        return "an endpoint is named twice; give each worker once"
    return None


def parse_endpoints(text: str) -> tuple[str, ...]:
    """``HOST:PORT[,HOST:PORT...]`` (the command line's ``--rpc``) as a tuple; raises
    InvalidParameterError with one sentence."""
    endpoints = tuple(part.strip() for part in text.split(","))
    problem = endpoints_violation(endpoints)
    if problem is not None:
        raise InvalidParameterError(f"--rpc {text!r} is invalid: {problem}.")
    return endpoints


def require_rpc() -> None:
    """Raise RpcUnavailableError (saying how to install it) when llama.cpp lacks RPC here."""
    from localspec import _core

    if not _core.rpc_supported():
        hint = _core.rpc_install_hint()
        raise RpcUnavailableError(sentence(hint))


@dataclass(frozen=True)
class RemoteDevice:
    """A device a worker lends, as the worker reports it."""

    endpoint: str
    name: str  # ggml's: RPC0, RPC1, ... in the order of --rpc
    free_bytes: int
    total_bytes: int


def remote_devices(endpoints: tuple[str, ...]) -> list[RemoteDevice]:
    """Ask each worker for its devices and their free memory (loads nothing). Raises
    RpcUnavailableError or RemoteWorkerError.

    A worker lost in the middle of the questions leaves ggml's request waiting forever (the core
    parks ggml's connection thread instead of letting it abort: csrc/rpc/rpc.h), as a load does
    (Engine): so the questions run on a thread of their own, and a connection the core saw fail
    is that worker's error here (the thread stays blocked until the process ends)."""
    from localspec import _core

    require_rpc()
    answer: Future[list[Any]] = Future()

    def ask() -> None:
        try:
            answer.set_result(_core.remote_devices(list(endpoints)))
        except BaseException as error:  # noqa: BLE001 - handed to the caller
            answer.set_exception(error)

    threading.Thread(target=ask, name="localspec-rpc-devices", daemon=True).start()
    found = await_unless_stuck(answer, endpoints)
    return [RemoteDevice(d.endpoint, d.name, d.free_bytes, d.total_bytes) for d in found]


def stuck_worker_error(endpoints: Sequence[str]) -> RemoteWorkerError | None:
    """The error of a worker whose connection the core saw fail in the middle of a request
    (what waits on that request waits forever), or None."""
    if not endpoints:
        return None
    from localspec import _core

    stuck = _core.rpc_failure(list(endpoints))
    return RemoteWorkerError(sentence(stuck)) if stuck else None


def await_unless_stuck(future: Future[T], endpoints: Sequence[str]) -> T:
    """``future``'s result, or the stuck worker's RemoteWorkerError once the core sees one."""
    while True:
        try:
            return future.result(timeout=0.25)
        except FutureTimeout:
            error = stuck_worker_error(endpoints)
            if error is not None:
                raise error from None


def sentence(text: str) -> str:
    """The core's lower-case message as a sentence."""
    return text[0].upper() + text[1:]


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps a listener (an RPC worker, `localspec serve`) on this
    machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
