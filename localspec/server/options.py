"""ServerOptions: every limit and access rule of one server, with its default and its check.

``localspec serve`` only converts its flags into this object; ``create_app`` and the uvicorn
runner read it. ``validate`` raises InvalidParameterError naming the flag.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from localspec.errors import InvalidParameterError
from localspec.text.grammar_check import GrammarLimits

MIB = 1024 * 1024


@dataclass(frozen=True)
class ServerOptions:
    """Access rules, queue, per-request limits and client timeouts (docs/server.md)."""

    api_key: str | None = None
    # Extra names accepted in the Host header besides loopback names and addresses.
    allowed_hosts: tuple[str, ...] = ()
    # Origins whose browser pages may call the API (CORS). Other Origin headers get 403.
    cors_origins: tuple[str, ...] = ()
    max_request_bytes: int = 4 * MIB
    # Requests running or waiting; past it, 429.
    max_queue: int = 16
    # Default and cap of a request's generated tokens.
    max_tokens: int = 4096
    # Seconds from arrival to the end of the answer (None: no deadline).
    request_timeout: float | None = None
    # Seconds a client gets to send a request's headers, then its body.
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    # Seconds an idle keep-alive connection stays open.
    keep_alive_timeout: int = 5
    # Open connections at once; a request on one past it gets 503.
    max_connections: int = 64
    # Seconds running generations get to finish after SIGTERM/SIGINT.
    shutdown_timeout: float = 10.0
    # Seconds between SSE comments sent to keep a quiet stream alive.
    stream_keepalive: float = 15.0
    # What one request's grammar (or JSON Schema, once converted) may cost.
    grammar_limits: GrammarLimits = GrammarLimits()

    def validate(self) -> None:
        if self.api_key is not None and not self.api_key.strip():
            raise InvalidParameterError(
                "--api-key (or $LOCALSPEC_API_KEY) is empty, which would serve without "
                "authentication: give a key, or leave both unset to serve without one.")
        if self.max_queue < 1:
            raise _bad("--max-queue", self.max_queue, "must be at least 1")
        if self.max_request_bytes < 1024:
            raise _bad("--max-request-bytes", self.max_request_bytes, "must be at least 1024")
        if self.max_tokens < 1:
            raise _bad("--max-tokens", self.max_tokens, "must be at least 1")
        if self.max_connections <= self.max_queue:
            raise _bad(
                "--max-connections", self.max_connections,
                f"must be larger than --max-queue ({self.max_queue})",
            )
        if "*" in self.cors_origins:
            raise InvalidParameterError(
                "--cors-origin '*' would let any web page call this server; name the origins."
            )
        if any(not host or "*" in host or "/" in host for host in self.allowed_hosts):
            raise InvalidParameterError(
                "--allowed-host takes a host name such as 'mybox.lan' (no '*', scheme or path)."
            )
        self.grammar_limits.validate()
        self._check_seconds()

    def _check_seconds(self) -> None:
        timeouts = {
            "--request-timeout": self.request_timeout,
            "--header-timeout": self.header_timeout,
            "--body-timeout": self.body_timeout,
            "--keep-alive-timeout": self.keep_alive_timeout,
            "--stream-keepalive": self.stream_keepalive,
        }
        for flag, value in timeouts.items():
            if value is not None and not (math.isfinite(value) and value > 0):
                raise _bad(flag, value, "must be a positive number of seconds")
        if not (math.isfinite(self.shutdown_timeout) and self.shutdown_timeout >= 0):
            raise _bad("--shutdown-timeout", self.shutdown_timeout, "must be 0 or more seconds")

    @property
    def host_names(self) -> frozenset[str]:
        return frozenset(host.lower().rstrip(".") for host in self.allowed_hosts)


def _bad(flag: str, value: object, rule: str) -> InvalidParameterError:
    return InvalidParameterError(f"{flag} {value} is invalid: it {rule}.")
