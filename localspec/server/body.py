"""Read and decode a request body: a JSON object of well-formed text, or a 4xx that says why.

``read_body`` runs on the event loop with the body timeout; ``decode_json`` is plain CPU work
and runs on a worker thread with the rest of a request's preparation.
"""

from __future__ import annotations

import json
import re
from typing import Any

import anyio
from starlette.requests import Request

from localspec.server.errors import ApiError

MAX_JSON_DEPTH = 32  # a real request nests 5 levels (messages, message, content, part)


async def read_body(request: Request, timeout: float) -> bytes:
    try:
        with anyio.fail_after(timeout):
            return await request.body()
    except TimeoutError:
        raise ApiError(
            408,
            f"The request body did not arrive within {timeout:g} s; send it in one go.",
            code="request_timeout", reason="slow_body",
        ) from None


def decode_json(raw: bytes, known: frozenset[str] | None = None) -> dict[str, Any]:
    """The body as a JSON object whose strings are all valid Unicode. ``known``: the request's
    top-level names; the first other one is a 400 before the rest of the body is read (a body
    of 200,000 unknown keys cost seconds of validation errors)."""
    if not raw.strip():
        raise ApiError(400, "The request body is empty; send a JSON object.", code="invalid_json")
    try:
        data = _top_level_object(raw.decode("utf-8"), known)
    except RecursionError:
        raise _too_deep() from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ApiError(
            400, f"The request body is not valid JSON: {error}.", code="invalid_json"
        ) from None
    check_text(data)
    return data


_SPACE = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


def _skip_space(text: str, pos: int) -> int:
    """The position after JSON whitespace from ``pos`` (the pattern matches empty too)."""
    match = _SPACE.match(text, pos)
    assert match is not None
    return match.end()


def _top_level_object(text: str, known: frozenset[str] | None) -> dict[str, Any]:
    """json.loads for an object, one member at a time: each key and value is one call of the C
    decoder, and between them the GIL can pass to the event loop (one json.loads of a 2.6 MB
    body held it for 0.18 s, and /health waited behind eight of them). An unknown key ends the
    read at once."""
    pos = _skip_space(text, 0)
    if not text.startswith("{", pos):
        json.loads(text)  # raises for text that is not JSON
        raise ApiError(400, "The request body must be a JSON object.", code="invalid_json")
    data: dict[str, Any] = {}
    pos = _skip_space(text, pos + 1)
    if text.startswith("}", pos):
        return _end(text, pos + 1, data)
    while True:
        if not text.startswith('"', pos):
            raise json.JSONDecodeError("Expecting property name enclosed in double quotes",
                                       text, pos)
        key, pos = _DECODER.raw_decode(text, pos)
        if known is not None and key not in known:
            name = key[:100]
            raise ApiError(400, f"Unrecognized parameter '{name}': localspec does not support it.",
                           code="unknown_parameter", param=name)
        pos = _skip_space(text, pos)
        if not text.startswith(":", pos):
            raise json.JSONDecodeError("Expecting ':' delimiter", text, pos)
        pos = _skip_space(text, pos + 1)
        data[key], pos = _DECODER.raw_decode(text, pos)
        pos = _skip_space(text, pos)
        if text.startswith("}", pos):
            return _end(text, pos + 1, data)
        if not text.startswith(",", pos):
            raise json.JSONDecodeError("Expecting ',' delimiter", text, pos)
        pos = _skip_space(text, pos + 1)


def _end(text: str, pos: int, data: dict[str, Any]) -> dict[str, Any]:
    if _skip_space(text, pos) != len(text):
        raise json.JSONDecodeError("Extra data", text, pos)
    return data


def check_text(data: object) -> None:
    """Raise a 400 naming the first field (in document order) that holds a lone surrogate (JSON
    allows ``"\\ud800"``; no tokenizer does), or when the data nests too deeply."""
    stack: list[tuple[object, str, int]] = [(data, "", 0)]
    while stack:
        value, path, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise _too_deep()
        if isinstance(value, str):
            _check_string(value, path)
        elif isinstance(value, dict):
            for key in value:
                _check_key(key, path)
            children = [(v, _join(path, k), depth + 1) for k, v in value.items()]
            stack.extend(reversed(children))
        elif isinstance(value, list):
            stack.extend(reversed([(v, _join(path, i), depth + 1) for i, v in enumerate(value)]))


def _check_string(text: str, path: str) -> None:
    surrogate = _first_surrogate(text)
    if surrogate is not None:
        code = surrogate.encode("unicode_escape").decode("ascii")
        raise ApiError(
            400,
            f"Invalid value for '{path}': it holds a lone surrogate ({code}), which is not valid "
            "Unicode; send well-formed text.",
            code="invalid_value", param=path,
        )


def _first_surrogate(text: str) -> str | None:
    """Fast for long prompts: ASCII is known without a scan, and encoding runs at memory speed
    where a regular expression would hold the GIL for a tenth of a second per 4 MB."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        return text[error.start]
    return None


def _check_key(key: str, path: str) -> None:
    if _first_surrogate(key) is not None:
        where = f"'{path}'" if path else "the request body"
        raise ApiError(
            400,
            f"A key in {where} holds a lone surrogate, which is not valid Unicode; send "
            "well-formed text.",
            code="invalid_value", param=path or None,
        )


def _join(path: str, key: str | int) -> str:
    return f"{path}.{key}" if path else str(key)


def _too_deep() -> ApiError:
    return ApiError(
        400, f"The request body nests deeper than {MAX_JSON_DEPTH} levels; send a flat request.",
        code="invalid_json",
    )
