"""Run one request against the engine and answer it, streamed (SSE) or whole.

The engine call happens on the engine thread; this code only submits and reads handles via a
HandleReader, so the event loop never blocks. A client that disconnects gets its handle
cancelled: the engine stops within one step.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from sse_starlette import EventSourceResponse
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from localspec.engine import Engine
from localspec.errors import LocalspecError
from localspec.server.bridge import Disconnected, Failed, Finished, HandleReader
from localspec.server.errors import ApiError, from_localspec_error, from_unexpected
from localspec.server.metrics import ServerMetrics
from localspec.server.prepare import Prepared, Preparer
from localspec.server.responses import (
    Shape,
    finish_reason_of,
    provenance_of,
    speculation_of,
    usage_of,
)
from localspec.server.schemas import SamplingRequest
from localspec.types import Chunk, GenerationResult

CLIENT_CLOSED_REQUEST = 499  # nginx's status for "the client went away"


@dataclass
class Call:
    """One request in flight: what was asked and how to shape the answer."""

    request: SamplingRequest
    prepared: Prepared
    shape: Shape
    endpoint: str


class Service:
    """Everything a route needs: the engine, names, the preparer and the metrics."""

    def __init__(
        self, engine: Engine, model_name: str, preparer: Preparer, metrics: ServerMetrics
    ) -> None:
        self.engine = engine
        self.model_name = model_name
        self.preparer = preparer
        self.metrics = metrics
        self.model_names = {model_name, engine.info.target_name}

    def check_model(self, model: str) -> None:
        if model not in self.model_names:
            raise ApiError(
                404,
                f"The model '{model}' does not exist; this server serves '{self.model_name}' "
                "(see GET /v1/models).",
                code="model_not_found",
                param="model",
            )

    async def respond(self, http: Request, call: Call) -> Response:
        reader = self._start(call)
        try:
            first = await reader.next_or_disconnect(http)
            if isinstance(first, Failed):
                raise first.error
            if call.request.stream:
                return EventSourceResponse(self._events(call, reader, first), sep="\n")
            return await self._whole(http, call, reader, first)
        except Disconnected:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        except BaseException:  # an error, or the task was cancelled (server shutdown)
            reader.cancel()
            raise

    def _start(self, call: Call) -> HandleReader:
        handle = self.engine.submit(call.prepared.tokens, call.prepared.params)

        def on_finish(result: GenerationResult) -> None:
            self.metrics.record_generation(call.endpoint, result.finish_reason, result.stats)

        return HandleReader(handle, on_finish)

    async def _whole(
        self, http: Request, call: Call, reader: HandleReader, event: object
    ) -> Response:
        while not isinstance(event, Finished):
            if isinstance(event, Failed):
                raise event.error
            event = await reader.next_or_disconnect(http)
        result = event.result
        extension = self._extension(call, result)
        if call.prepared.provenance:
            extension["provenance"] = provenance_of(
                result.tokens, result.provenance, self._piece
            )
        usage = usage_of(result, len(call.prepared.tokens))
        return JSONResponse(call.shape.full(result, usage, extension))

    def _piece(self, token: int) -> str:
        return self.engine.detokenize([token])

    def _extension(self, call: Call, result: GenerationResult) -> dict[str, Any]:
        params, drafter = call.prepared.params, self.engine.info.drafter
        speculative = params.speculative and params.draft_max != 0 and drafter != "none"
        return speculation_of(result.stats, PurePath(drafter).name, speculative)

    async def _events(
        self, call: Call, reader: HandleReader, first: object
    ) -> AsyncIterator[dict[str, str]]:
        shape, usage_field = call.shape, call.request.include_usage
        try:
            if shape.kind == "chat":
                yield _data(shape.chunk("", role=True, with_usage_field=usage_field))
            event = first
            while True:
                if isinstance(event, Chunk):
                    body = self._chunk_body(call, event)
                    if body is not None:
                        yield _data(body)
                elif isinstance(event, Finished):
                    for body in self._final_bodies(call, event.result):
                        yield _data(body)
                    yield {"data": "[DONE]"}
                    return
                elif isinstance(event, Failed):
                    yield _data(_stream_error(event.error))
                    yield {"data": "[DONE]"}
                    return
                event = await reader.next()
        finally:
            reader.cancel()  # a disconnect lands here; a finished handle ignores it

    def _chunk_body(self, call: Call, chunk: Chunk) -> dict[str, Any] | None:
        extension = None
        if call.prepared.provenance:
            sources = provenance_of(chunk.tokens, chunk.provenance, self._piece)
            extension = {"provenance": sources}
        if not chunk.text and extension is None:
            return None
        return call.shape.chunk(
            chunk.text, extension=extension, with_usage_field=call.request.include_usage
        )

    def _final_bodies(self, call: Call, result: GenerationResult) -> list[dict[str, Any]]:
        extension = self._extension(call, result)
        final = call.shape.chunk(
            "",
            finish_reason=finish_reason_of(result.finish_reason),
            extension=extension,
            with_usage_field=call.request.include_usage,
        )
        if not call.request.include_usage:
            return [final]
        usage = usage_of(result, len(call.prepared.tokens))
        return [final, call.shape.usage_chunk(usage, extension)]


def _data(body: dict[str, Any]) -> dict[str, str]:
    return {"data": json.dumps(body, ensure_ascii=False)}


def _stream_error(error: BaseException) -> dict[str, Any]:
    """An error after the stream started: OpenAI clients raise on an ``error`` event body."""
    if isinstance(error, LocalspecError):
        response = from_localspec_error(error)
    else:
        response = from_unexpected(error)
    return json.loads(bytes(response.body))
