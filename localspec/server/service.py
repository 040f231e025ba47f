"""Run one request against the engine and answer it, streamed (SSE) or whole.

A request first takes a place in the server's RequestQueue (429 when full). While it waits for
a running slot, a whole answer watches its client (the place is given back the moment the client
leaves) and a stream is already open, sending SSE comments. The engine call happens on the engine
thread; this code only submits and reads handles via a HandleReader, so the event loop never
blocks. A client that disconnects gets its generation cancelled: the engine stops within one step.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import PurePath
from typing import Any

import anyio
from pydantic import BaseModel
from sse_starlette import EventSourceResponse
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from localspec.errors import LocalspecError, QueueFullError
from localspec.runtime.engine import Engine
from localspec.server.body import decode_json
from localspec.server.bridge import Disconnected, Failed, Finished
from localspec.server.errors import (
    ApiError,
    from_api_error,
    from_localspec_error,
    from_unexpected,
    shutting_down,
)
from localspec.server.infill import InfillShape, LineStop
from localspec.server.logprobs import chat_logprobs, completion_logprobs
from localspec.server.metrics import ServerMetrics
from localspec.server.middleware import request_id
from localspec.server.options import ServerOptions
from localspec.server.prepare import Preparer
from localspec.server.request_queue import RequestQueue
from localspec.server.responses import (
    Shape,
    finish_reason_of,
    provenance_of,
    speculation_of,
    usage_of,
)
from localspec.server.running import Call, Run
from localspec.server.schemas import ChatCompletionRequest, CompletionRequest, InfillRequest
from localspec.server.tools import ToolReply
from localspec.text.tool_calls import ToolFamily
from localspec.types import Chunk, GenerationResult, TokenLogprob

CLIENT_CLOSED_REQUEST = 499  # nginx's status for "the client went away"
SSE_CANCEL_MARGIN_SECONDS = 3  # sse-starlette cuts streams this long after our own shutdown end


def _field_names(model: type[BaseModel]) -> frozenset[str]:
    return frozenset(name for key, field in model.model_fields.items()
                     for name in (key, field.alias) if name)


_CHAT_FIELDS = _field_names(ChatCompletionRequest)
_COMPLETION_FIELDS = _field_names(CompletionRequest)
_INFILL_FIELDS = _field_names(InfillRequest)
# Requests decoded and prepared at once on worker threads. The work is Python under the GIL:
# more threads at it would only take the GIL from the event loop (eight 2.6 MB bodies kept
# /health waiting 12 s), not finish sooner.
PREPARING_AT_ONCE = 2


def model_slug(name: str) -> str:
    """``Qwen2.5 Coder 1.5B Instruct`` -> ``qwen2.5-coder-1.5b-instruct``: lowercase, each run
    of whitespace one '-' (a model id without spaces, for clients and shells)."""
    return "-".join(name.lower().split())


class Service:
    """Everything a route needs: the engine, names, the preparer, metrics, limits and queue."""

    def __init__(
        self,
        engine: Engine,
        model_name: str,
        preparer: Preparer,
        options: ServerOptions,
        aliases: tuple[str, ...] = (),
    ) -> None:
        self.engine = engine
        self.model_name = model_name
        self.preparer = preparer
        self.options = options
        # The id /v1/models lists, the GGUF's general.name, the aliases (a models.toml name),
        # and each one's slug: what a "model" field may say.
        names = {model_name, engine.info.target_name, *aliases}
        self.model_names = names | {model_slug(name) for name in names}
        self.metrics = ServerMetrics(lambda: self.queue.depth)
        self.queue = RequestQueue(
            options.max_queue, slots=engine.info.parallel, on_turn=self.metrics.record_queue_wait
        )
        engine.observe_passes(self.metrics.record_pass)
        self._draining = False
        self._preparing: anyio.CapacityLimiter | None = None

    async def prepare(self, call: Callable[[bytes], Call], raw: bytes) -> Call:
        """``call`` (chat_call or completion_call) on a worker thread, PREPARING_AT_ONCE at most."""
        if self._preparing is None:  # made on the event loop, where anyio wants it
            self._preparing = anyio.CapacityLimiter(PREPARING_AT_ONCE)
        return await anyio.to_thread.run_sync(call, raw, limiter=self._preparing)

    def check_model(self, model: str) -> None:
        if model not in self.model_names:
            raise ApiError(
                404,
                f"The model '{model}' does not exist; this server serves '{self.model_name}' "
                "(see GET /v1/models).",
                code="model_not_found",
                param="model",
            )

    # ---- preparation (worker threads) ---------------------------------------------------

    def chat_call(self, raw: bytes) -> Call:
        body = ChatCompletionRequest.model_validate(decode_json(raw, _CHAT_FIELDS))
        self.check_model(body.model)
        prepared = self.preparer.chat(body)
        return Call(body, prepared, Shape("chat", self.model_name), "/v1/chat/completions")

    def completion_call(self, raw: bytes) -> Call:
        body = CompletionRequest.model_validate(decode_json(raw, _COMPLETION_FIELDS))
        self.check_model(body.model)
        prepared = self.preparer.completion(body)
        return Call(body, prepared, Shape("completion", self.model_name), "/v1/completions")

    def infill_call(self, raw: bytes) -> Call:
        body = InfillRequest.model_validate(decode_json(raw, _INFILL_FIELDS))
        if body.model:
            self.check_model(body.model)
        prepared = self.preparer.infill(body)
        rule = LineStop(body.n_indent, body.t_max_predict_ms, keep_nothing=body.n_predict == 0)
        shape = InfillShape(self.model_name, body, len(prepared.tokens), prepared.prompt_text,
                            rule)
        return Call(body, prepared, shape, "/infill")

    # ---- answering (the event loop) -----------------------------------------------------

    async def respond(self, http: Request, call: Call) -> Response:
        run = self._admit(http, call)
        streaming = False
        try:
            if not run.ticket.running:
                if call.request.stream:
                    streaming = True
                    return self._stream(run, None)
                await run.wait_turn(watch_client=True)
            self._submit(run)
            first = await run.next(watch_client=True)
            if isinstance(first, Failed):
                raise first.error
            if call.request.stream:
                streaming = True
                return self._stream(run, first)
            return await self._whole(run, first)
        except Disconnected:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        finally:
            if not streaming:
                run.close()

    def begin_shutdown(self) -> None:
        """On the loop: admit nothing more, answer waiting requests with 503, and end running
        ones after ``shutdown_timeout`` seconds (a second call ends them now)."""
        if self._draining:
            self._stop_running()
            return
        self._draining = True
        self.queue.close(shutting_down())
        asyncio.get_running_loop().call_later(self.options.shutdown_timeout, self._stop_running)

    def _stop_running(self) -> None:
        error = ApiError(
            503, "The server is shutting down; this generation was stopped before it finished.",
            code="server_shutting_down",
        )
        self.queue.stop_running(error)

    def _admit(self, http: Request, call: Call) -> Run:
        try:
            return Run(call, self.queue, http, self.options.request_timeout)
        except QueueFullError:
            self.metrics.record_rejected("queue_full")
            raise

    def _submit(self, run: Run) -> None:
        endpoint = run.call.endpoint

        def on_finish(result: GenerationResult) -> None:
            self.metrics.record_generation(endpoint, result.finish_reason, result.stats)

        run.submit(self.engine, on_finish)

    def _stream(self, run: Run, first: object) -> Response:
        return _ClosingStream(
            self._events(run, first),
            on_close=run.close,
            sep="\n",
            ping=self.options.stream_keepalive,
            shutdown_grace_period=self.options.shutdown_timeout + SSE_CANCEL_MARGIN_SECONDS,
        )

    async def _whole(self, run: Run, event: object) -> Response:
        call = run.call
        while not isinstance(event, Finished):
            if isinstance(event, Failed):
                raise event.error
            event = await run.next(watch_client=True)
        result = run.final(event.result)
        extension = self._extension(call, result)
        if isinstance(call.shape, InfillShape):
            return JSONResponse(call.shape.final(result, call.prepared.params, extension,
                                                 self._stopping_word(call, result), False))
        if call.prepared.provenance:
            extension["provenance"] = provenance_of(
                result.tokens, result.provenance, self._piece
            )
        usage = usage_of(result, len(call.prepared.tokens))
        kept = result.logprobs[: result.completion_tokens] if result.logprobs is not None else None
        logprobs = self._logprobs(call, kept, 0)
        tools = None
        if call.prepared.tools is not None:  # a long reply is read off the event loop
            tools = await anyio.to_thread.run_sync(
                _read_reply, call.prepared.tools.family, result.text)
        return JSONResponse(call.shape.full(result, usage, extension, logprobs, tools))

    def _stopping_word(self, call: Call, result: GenerationResult) -> str:
        """The stop string that ended the result ("" when none did): it is in the text of the
        tokens past those whose text was kept."""
        stops = call.prepared.params.stop
        if result.finish_reason != "stop" or not stops or result.text_tokens is None:
            return ""
        tail = self.engine.detokenize(result.tokens[max(0, result.text_tokens - 1):])
        return next((s for s in stops if s in tail), "")

    def _logprobs(
        self, call: Call, logprobs: list[TokenLogprob] | None, offset: int
    ) -> dict[str, Any] | None:
        if logprobs is None:
            return None
        if call.shape.kind == "chat":
            return chat_logprobs(logprobs, self._piece)
        return completion_logprobs(logprobs, self._piece, offset)

    def _piece(self, token: int) -> str:
        return self.engine.detokenize([token])

    def _extension(self, call: Call, result: GenerationResult) -> dict[str, Any]:
        params, drafter = call.prepared.params, self.engine.info.drafter
        speculative = (params.speculative and params.draft_max != 0
                       and self.engine.info.drafter_spec.drafts)
        return speculation_of(result.stats, PurePath(drafter).name, speculative,
                              self.engine.info.exact)

    async def _events(self, run: Run, first: object) -> AsyncIterator[dict[str, str]]:
        call = run.call
        shape, usage_field = call.shape, call.request.include_usage
        try:
            if first is None:  # queued: the stream is open; comments until the turn comes
                yield {"comment": f"queued behind {self.queue.waiting - 1} other request(s)"}
                await run.wait_turn(watch_client=False)
                self._submit(run)
                first = await run.next()
            if isinstance(shape, Shape) and shape.kind == "chat":
                yield _data(shape.chunk("", role=True, with_usage_field=usage_field))
            event, offset = first, 0
            tools = ToolReply(call.prepared.tools.family) if call.prepared.tools else None
            while True:
                if isinstance(event, Chunk):
                    for body in self._chunk_bodies(call, event, offset, tools):
                        yield _data(body)
                    offset += len(event.text)
                elif isinstance(event, Finished):
                    for body in self._final_bodies(call, run.final(event.result), tools):
                        yield _data(body)
                    if isinstance(shape, Shape):  # llama.cpp's /infill stream has no [DONE]
                        yield {"data": "[DONE]"}
                    return
                elif isinstance(event, Failed):
                    raise event.error
                event = await run.next()
        except Exception as error:  # noqa: BLE001 - the stream is open: an error event ends it
            yield _data(self._stream_error(run, error))
            if isinstance(shape, Shape):
                yield {"data": "[DONE]"}
        finally:
            run.close()  # a disconnect lands here; a finished handle ignores the cancel

    def _stream_error(self, run: Run, error: BaseException) -> dict[str, Any]:
        """An error after the stream started: OpenAI clients raise on an ``error`` event body."""
        if isinstance(error, ApiError):
            if error.reason is not None:
                self.metrics.record_rejected(error.reason)
            response = from_api_error(error)
        elif isinstance(error, LocalspecError):
            response = from_localspec_error(error)
        else:
            response = from_unexpected(error, request_id(run.http.scope))
        body: dict[str, Any] = json.loads(bytes(response.body))
        return body

    def _chunk_bodies(self, call: Call, chunk: Chunk, offset: int,
                      tools: ToolReply | None) -> list[dict[str, Any]]:
        """The stream bodies of one engine chunk: its text, or with tools the deltas it
        makes certain (content, a call's start, argument fragments; maybe none yet)."""
        if isinstance(call.shape, InfillShape):
            body = call.shape.partial(chunk)
            return [] if body is None else [body]
        extension = None
        if call.prepared.provenance:
            sources = provenance_of(chunk.tokens, chunk.provenance, self._piece)
            extension = {"provenance": sources}
        logprobs = self._logprobs(call, chunk.logprobs or None, offset)
        usage_field = call.request.include_usage
        if tools is not None:
            deltas = tools.push(chunk.text)
            if not deltas and (extension is not None or logprobs is not None):
                deltas = [{}]
            return [call.shape.chunk("", delta=delta, with_usage_field=usage_field,
                                     extension=extension if i == 0 else None,
                                     logprobs=logprobs if i == 0 else None)
                    for i, delta in enumerate(deltas)]
        if not chunk.text and extension is None and logprobs is None:
            return []
        return [call.shape.chunk(chunk.text, extension=extension, with_usage_field=usage_field,
                                 logprobs=logprobs)]

    def _final_bodies(self, call: Call, result: GenerationResult,
                      tools: ToolReply | None = None) -> list[dict[str, Any]]:
        extension = self._extension(call, result)
        if isinstance(call.shape, InfillShape):
            word = self._stopping_word(call, result)
            return [call.shape.final(result, call.prepared.params, extension, word, True)]
        usage_field = call.request.include_usage
        reason = finish_reason_of(result.finish_reason)
        bodies = []
        if tools is not None:
            bodies = [call.shape.chunk("", delta=delta, with_usage_field=usage_field)
                      for delta in tools.finish()]
            reason = tools.finish_reason(reason)
        bodies.append(call.shape.chunk("", finish_reason=reason, extension=extension,
                                       with_usage_field=usage_field))
        if not call.request.include_usage:
            return bodies
        usage = usage_of(result, len(call.prepared.tokens))
        return [*bodies, call.shape.usage_chunk(usage, extension)]


def _read_reply(family: ToolFamily, text: str) -> ToolReply:
    reply = ToolReply(family)
    reply.push(text)
    reply.finish()
    return reply


def _data(body: dict[str, Any]) -> dict[str, str]:
    return {"data": json.dumps(body, ensure_ascii=False)}


class _ClosingStream(EventSourceResponse):
    """An SSE response that runs ``on_close`` however it ends, even if its body never starts
    (a client that leaves before the first byte)."""

    def __init__(self, content: AsyncIterator[dict[str, str]], on_close: Callable[[], None],
                 **options: Any) -> None:
        super().__init__(content, **options)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()
