"""Errors in OpenAI's JSON shape: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

import logging
import traceback
from collections.abc import Mapping

from pydantic import ValidationError
from starlette.responses import JSONResponse

from localspec.errors import LocalspecError, PromptTooLongError, QueueFullError
from localspec.server.schemas import ErrorBody, ErrorResponse

logger = logging.getLogger("localspec.server")

RETRY_AFTER_SECONDS = 1

_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "invalid_request_error",
    404: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
}


_SCALAR_TAGS = frozenset({"str", "int", "float", "bool", "none", "dict", "list"})


class ApiError(Exception):
    """An HTTP error raised by the server itself (not by the engine). ``reason``: the
    ``localspec_rejected_requests_total`` label when this error refuses a request."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        reason: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.param = param
        self.reason = reason


def shutting_down() -> ApiError:
    return ApiError(
        503, "The server is shutting down; retry against a running server.",
        code="server_shutting_down", reason="shutting_down",
    )


def error_response(
    status: int,
    message: str,
    *,
    code: str | None = None,
    param: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    body = ErrorResponse(error=ErrorBody(message=message, type=_TYPES.get(status, "server_error"),
                                         param=param, code=code))
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


def from_api_error(error: ApiError) -> JSONResponse:
    return error_response(error.status, str(error), code=error.code, param=error.param)


def from_localspec_error(error: LocalspecError) -> JSONResponse:
    """Map an engine-side error (bad parameter, prompt too long, queue full, ...)."""
    param = getattr(error, "param", None) or _param_from_message(str(error))
    if isinstance(error, QueueFullError):
        return error_response(
            429,
            str(error),
            code="rate_limit_exceeded",
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        )
    if isinstance(error, PromptTooLongError):
        return error_response(400, str(error), code="context_length_exceeded", param=error.param)
    code = "invalid_value" if error.status_code == 400 else None
    return error_response(error.status_code, str(error), code=code, param=param)


def from_validation_error(error: ValidationError) -> JSONResponse:
    """The first problem of a request body that does not match the schema."""
    problems = error.errors()
    first = problems[0]
    location = _location(first["loc"])
    if first["type"] == "missing":
        message = f"Missing required parameter '{location}'."
        code = "missing_required_parameter"
    elif first["type"] == "extra_forbidden":
        message = f"Unrecognized parameter '{location}': localspec does not support it."
        code = "unknown_parameter"
    elif sum(_location(p["loc"]) == location for p in problems) > 1:  # no union member fit
        message = f"Invalid value for '{location}': {first['input']!r} has the wrong type."
        code = "invalid_type"
    else:
        message = f"Invalid value for '{location}': {first['msg']}."
        code = "invalid_type"
    return error_response(400, message, code=code, param=location or None)


def _location(loc: tuple[int | str, ...]) -> str:
    """``messages.0.content`` from pydantic's loc, without union member tags like ``list[str]``."""
    return ".".join(str(part) for part in loc if not _is_type_tag(part))


def _is_type_tag(part: int | str) -> bool:
    if isinstance(part, int):
        return False
    return part in _SCALAR_TAGS or any(c in part for c in "[]'") or part != part.lower()


def from_unexpected(error: BaseException, request_id: str) -> JSONResponse:
    """A bug: the client gets a generic 500 with the request id; the log gets the exception's
    type and where it was raised, once. The exception's message is left out of both: it may
    hold the prompt or an object's address."""
    frames = "".join(traceback.format_tb(error.__traceback__))
    logger.error(
        "internal error in request %s: %s\nTraceback (most recent call last):\n%s",
        request_id, type(error).__name__, frames.rstrip(),
    )
    return error_response(
        500,
        f"Internal server error (request id {request_id}); the server log has the details.",
        code="internal",
    )


def _param_from_message(message: str) -> str | None:
    """GenerationParams.validate messages start with ``name=value``."""
    head = message.split("=", 1)[0]
    return head if head.isidentifier() and head != message else None
