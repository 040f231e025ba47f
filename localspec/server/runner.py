"""Run an app under uvicorn with the server's limits: the listening socket, client timeouts,
the connection cap, and a clean shutdown on SIGTERM/SIGINT.

uvicorn's own settings carry what they can: ``timeout_keep_alive`` (idle keep-alive),
``limit_concurrency`` (open connections; past it a request gets 503),
``h11_max_incomplete_event_size`` (request line + headers) and ``timeout_graceful_shutdown``.
uvicorn has no deadline for a request's headers, so ``HeaderTimeoutProtocol`` adds one to its
h11 protocol; the body deadline lives in the app (body.read_body).
"""

from __future__ import annotations

import asyncio
import errno
import math
import socket
from collections.abc import Callable
from types import FrameType
from typing import Any

import h11
import uvicorn
from starlette.types import ASGIApp
from uvicorn.protocols.http.h11_impl import H11Protocol

from localspec.errors import LocalspecError
from localspec.server.options import ServerOptions

MAX_HEADER_BYTES = 16 * 1024
UVICORN_GRACE_MARGIN_SECONDS = 5  # uvicorn cancels what is left this long after our own end
_TIMED_OUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"connection: close\r\ncontent-length: 37\r\n\r\nThe request headers came too slowly.\n"
)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port, or a LocalspecError saying why not (bad host, busy
    port, no permission). Done before a model loads, so mistakes show at once."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as error:
        raise LocalspecError(
            f"--host {host!r} is neither an IP address nor a known host name "
            f"({_reason(error)}); use 127.0.0.1, ::1 or 0.0.0.0."
        ) from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as error:
        sock.close()
        raise LocalspecError(f"Cannot listen on {host}:{port}: {_bind_advice(error)}.") from None
    sock.set_inheritable(True)
    return sock


def server_config(app: ASGIApp, options: ServerOptions, log_level: str) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        http=header_timeout_protocol(options.header_timeout),
        log_level=log_level,
        lifespan="off",
        timeout_keep_alive=options.keep_alive_timeout,
        # uvicorn refuses a request when connections >= the limit, its own one included
        limit_concurrency=options.max_connections + 1,
        h11_max_incomplete_event_size=MAX_HEADER_BYTES,
        timeout_graceful_shutdown=math.ceil(
            options.shutdown_timeout + UVICORN_GRACE_MARGIN_SECONDS
        ),
    )


class GracefulServer(uvicorn.Server):
    """uvicorn's server with our shutdown: SIGTERM/SIGINT call ``on_exit`` on the event loop
    (the app stops admitting and drains) and the process exits 0 afterwards instead of
    re-raising the signal. A second signal stops waiting."""

    def __init__(self, config: uvicorn.Config, on_exit: Callable[[], None] | None) -> None:
        super().__init__(config)
        self._on_exit = on_exit
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.begin_exit()

    def begin_exit(self) -> None:
        """Start the shutdown (any thread)."""
        if self.should_exit:
            self.force_exit = True
        self.should_exit = True
        if self._on_exit is not None and self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._on_exit)


def header_timeout_protocol(seconds: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol that closes a connection whose request headers are not complete
    ``seconds`` after it opened or after the request's first byte (slowloris). An idle
    connection between requests is uvicorn's keep-alive timeout's business."""

    class HeaderTimeoutProtocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:
                self._disarm()
            elif self._header_timer is None and self.conn.trailing_data[0]:
                self._arm()  # the first bytes of the next request on a kept-alive connection

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(seconds, self._headers_late)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_late(self) -> None:
            self._header_timer = None
            if self.conn.their_state is not h11.IDLE or self.transport.is_closing():
                return
            if self.conn.trailing_data[0]:  # part of a request came: say why it is cut
                self.transport.write(_TIMED_OUT)
            self.transport.close()

    return HeaderTimeoutProtocol


def drain_hook(app: Any) -> Callable[[], None] | None:
    """The app's shutdown hook (``Service.begin_shutdown``) when it is a localspec app."""
    service = getattr(getattr(app, "state", None), "localspec", None)
    hook = getattr(service, "begin_shutdown", None)
    return hook if callable(hook) else None


def _bind_advice(error: OSError) -> str:
    if error.errno == errno.EADDRINUSE:
        return "the port is in use; pick another --port or stop the program that uses it"
    if error.errno == errno.EADDRNOTAVAIL:
        return "that address is not one of this machine's; use 127.0.0.1, ::1 or 0.0.0.0"
    if error.errno == errno.EACCES:
        return "permission denied; ports below 1024 need privileges, pick a higher --port"
    return _reason(error)


def _reason(error: BaseException) -> str:
    text = getattr(error, "strerror", None) or str(error)
    return text[:1].lower() + text[1:] if text else type(error).__name__
