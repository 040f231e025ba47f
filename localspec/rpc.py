"""A target spread over machines with llama.cpp's RPC backend (docs/rpc.md).

Other machines run ``localspec rpc-worker`` and lend their devices; ``--rpc HOST:PORT,...``
(``LoadOptions.rpc``) places the target's layers over them first, then the local GPUs; the
drafter and the target's output layer stay local. The RPC backend is a build option of
llama-cpp-python: ``require_rpc`` says how to install it when the installed build lacks it.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from localspec.errors import InvalidParameterError, RpcUnavailableError

DEFAULT_PORT = 50052
ENDPOINT_EXAMPLE = "192.168.1.20:50052"


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
        raise RpcUnavailableError(hint[0].upper() + hint[1:])


@dataclass(frozen=True)
class RemoteDevice:
    """A device a worker lends, as the worker reports it."""

    endpoint: str
    name: str  # ggml's: RPC0, RPC1, ... in the order of --rpc
    free_bytes: int
    total_bytes: int


def remote_devices(endpoints: tuple[str, ...]) -> list[RemoteDevice]:
    """Ask each worker for its devices and their free memory (loads nothing). Raises
    RpcUnavailableError or RemoteWorkerError."""
    from localspec import _core

    require_rpc()
    return [RemoteDevice(d.endpoint, d.name, d.free_bytes, d.total_bytes)
            for d in _core.remote_devices(list(endpoints))]


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps a listener (an RPC worker, `localspec serve`) on this
    machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
