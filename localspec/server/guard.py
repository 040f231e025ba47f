"""Keep web pages out: Host, Origin and Content-Type checks as pure ASGI middleware.

A server on 127.0.0.1 is reachable from every page the user's browser opens. Three rules close
that door:

- **Host**: a request that arrived on a loopback address must name a loopback host
  (``localhost``, ``*.localhost``, ``127.x.x.x``, ``::1``) or an ``--allowed-host``. A page that
  re-points its own domain at 127.0.0.1 (DNS rebinding) still sends its own name, and is refused.
  With ``--allowed-host`` the rule holds on every address.
- **Origin**: a browser request from another origin is refused unless ``--cors-origin`` names
  it, whatever its method or content type (a "simple" request skips the CORS preflight).
- **Content-Type**: a POST body must be declared as JSON.
"""

from __future__ import annotations

import ipaddress

from starlette.types import ASGIApp, Receive, Scope, Send

from localspec.server.errors import ApiError, error_response
from localspec.server.metrics import ServerMetrics
from localspec.server.options import ServerOptions


class RequestGuard:
    def __init__(self, app: ASGIApp, options: ServerOptions, metrics: ServerMetrics) -> None:
        self.app = app
        self.hosts = options.host_names
        self.origins = frozenset(options.cors_origins)
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            problem = self.problem(scope)
            if problem is not None:
                self.metrics.record_rejected(problem.reason or "")
                response = error_response(problem.status, str(problem), code=problem.code)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def problem(self, scope: Scope) -> ApiError | None:
        headers = _headers(scope)
        host = headers.get("host")
        if host is not None and self._host_checked(scope) and not self._host_allowed(host):
            return ApiError(
                403,
                f"The Host header {host!r} does not name this server; web pages that point their "
                "own domain at this machine look like this. If that name is yours, start the "
                f"server with --allowed-host {host_name(host)}.",
                code="forbidden_host", reason="bad_host",
            )
        origin = headers.get("origin")
        if origin is not None and not self._origin_allowed(origin, scope, host):
            return ApiError(
                403,
                f"Requests from web pages at {origin!r} are refused; start the server with "
                f"--cors-origin {origin} to let that page call it.",
                code="forbidden_origin", reason="bad_origin",
            )
        if scope["method"] == "POST" and not _is_json(headers.get("content-type", "")):
            return ApiError(
                415, "The request body must be JSON: send 'Content-Type: application/json'.",
                code="unsupported_media_type", reason="bad_content_type",
            )
        return None

    def _host_checked(self, scope: Scope) -> bool:
        server = scope.get("server")
        return bool(self.hosts) or (server is not None and is_loopback(str(server[0])))

    def _host_allowed(self, host: str) -> bool:
        name = host_name(host)
        return is_loopback(name) or name in self.hosts

    def _origin_allowed(self, origin: str, scope: Scope, host: str | None) -> bool:
        if origin in self.origins:
            return True
        same = f"{scope.get('scheme', 'http')}://{host}" if host is not None else None
        return same is not None and origin.lower() == same.lower()


def host_name(host: str) -> str:
    """The name in a Host header, without port or IPv6 brackets, lower case."""
    value = host.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        return value[1:end] if end > 0 else value
    if value.count(":") == 1:
        value = value.split(":", 1)[0]
    return value.rstrip(".")


def is_loopback(name: str) -> bool:
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def _headers(scope: Scope) -> dict[str, str]:
    """The first value of each header, as Starlette reads them."""
    out: dict[str, str] = {}
    for name, value in scope["headers"]:
        out.setdefault(name.decode("latin-1"), value.decode("latin-1"))
    return out


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and
                                            media.endswith("+json"))
