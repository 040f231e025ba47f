"""Pure ASGI middleware: request counting, request ids and the last-resort 500, Bearer API
key, request body size limit."""

from __future__ import annotations

import hmac
import uuid

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from localspec.server.errors import ApiError, error_response, from_unexpected
from localspec.server.metrics import ServerMetrics

KNOWN_ENDPOINTS = frozenset(
    {"/v1/chat/completions", "/v1/completions", "/infill", "/v1/models", "/health", "/metrics"}
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


def request_id(scope: Scope) -> str:
    """The id TagRequests gave this request ("" outside it)."""
    return str(scope.get("state", {}).get("request_id", ""))


class TagRequests:
    """Give every HTTP request an id (the ``X-Request-Id`` response header) and answer an
    unexpected exception with a generic 500 naming that id; the exception is logged once."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = rid
        started = False

        async def tagged_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = [*message.get("headers", []), (b"x-request-id", rid.encode())]
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, tagged_send)
        except ClientDisconnect:  # the client left while its body arrived: nobody to answer
            return
        except Exception as error:  # noqa: BLE001 - a bug: answered generically, logged once
            response = from_unexpected(error, rid)
            if not started:  # else the stream is cut; the client sees it end early
                await response(scope, receive, tagged_send)


class RequireApiKey:
    """Reject requests without ``Authorization: Bearer <key>`` (except /health and preflight)."""

    def __init__(self, app: ASGIApp, api_key: str, metrics: ServerMetrics) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self._exempt(scope) or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        self.metrics.record_rejected("bad_api_key")
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

    def __init__(self, app: ASGIApp, max_bytes: int, metrics: ServerMetrics) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            self.metrics.record_rejected("too_large")
            await self._too_large()(scope, receive, send)
            return
        seen = 0

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise ApiError(
                        413, self._message(), code="request_too_large", reason="too_large"
                    )
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
