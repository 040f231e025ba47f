"""Pure ASGI middleware: request counting, Bearer API key, request body size limit."""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from localspec.server.errors import ApiError, error_response
from localspec.server.metrics import ServerMetrics

KNOWN_ENDPOINTS = frozenset(
    {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics"}
)
OPEN_PATHS = frozenset({"/health"})


def endpoint_label(path: str) -> str:
    """A bounded label set: unknown paths are counted as ``other``."""
    return path if path in KNOWN_ENDPOINTS else "other"


class CountRequests:
    """Count every answered HTTP request by endpoint and status."""

    def __init__(self, app: ASGIApp, metrics: ServerMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        endpoint = endpoint_label(scope["path"])

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.record_request(endpoint, int(message["status"]))
            await send(message)

        await self.app(scope, receive, counting_send)


class RequireApiKey:
    """Reject requests without ``Authorization: Bearer <key>`` (except /health and preflight)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self._exempt(scope) or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        response = error_response(
            401,
            "Missing or incorrect API key: send 'Authorization: Bearer <key>' with the key "
            "given to 'localspec serve --api-key'.",
            code="invalid_api_key",
        )
        response.headers["WWW-Authenticate"] = "Bearer"
        await response(scope, receive, send)

    @staticmethod
    def _exempt(scope: Scope) -> bool:
        return scope["path"] in OPEN_PATHS or scope["method"] == "OPTIONS"

    def _authorized(self, scope: Scope) -> bool:
        for name, value in scope["headers"]:
            if name == b"authorization":
                return hmac.compare_digest(value, self.expected)
        return False


class LimitBodySize:
    """Refuse request bodies over ``max_bytes`` (by Content-Length, or while streaming in)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._too_large()(scope, receive, send)
            return
        seen = 0

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise ApiError(413, self._message(), code="request_too_large")
            return message

        await self.app(scope, limited_receive, send)

    def _message(self) -> str:
        return f"The request body is larger than the server's limit of {self.max_bytes} bytes."

    def _too_large(self) -> ASGIApp:
        return error_response(413, self._message(), code="request_too_large")


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
