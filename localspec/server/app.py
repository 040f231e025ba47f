"""The OpenAI-compatible app: ``create_app(engine)`` builds one FastAPI app per engine.

Endpoints: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health,
GET /metrics. All state lives on ``app.state.localspec`` (a Service); nothing is global.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import PurePath
from typing import Any, TypeVar

import anyio
from fastapi import FastAPI
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from localspec.engine import Engine
from localspec.errors import LocalspecError
from localspec.server import errors
from localspec.server.metrics import PROMETHEUS_CONTENT_TYPE, ServerMetrics
from localspec.server.middleware import CountRequests, LimitBodySize, RequireApiKey
from localspec.server.prepare import Preparer
from localspec.server.responses import Shape
from localspec.server.schemas import ChatCompletionRequest, CompletionRequest, ModelCard, ModelList
from localspec.server.service import Call, Service
from localspec.types import GenerationParams

DEFAULT_MAX_REQUEST_BYTES = 4 * 1024 * 1024

RequestModel = TypeVar("RequestModel", bound=BaseModel)


def create_app(
    engine: Engine,
    *,
    api_key: str | None = None,
    model_name: str | None = None,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    cors_origins: Sequence[str] = (),
    chat_template: str | None = None,
    defaults: GenerationParams | None = None,
) -> FastAPI:
    """Build the app. ``chat_template`` overrides the GGUF's; ``defaults`` are the sampling
    parameters a request does not set (a models.toml pair's defaults, else the engine's)."""
    name = model_name or engine.info.target_name
    metrics = ServerMetrics(lambda: engine.queue_depth)
    preparer = Preparer(engine, chat_template, defaults or GenerationParams())
    app = FastAPI(title="localspec", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.localspec = Service(engine, name, preparer, metrics)
    app.state.started = int(time.time())
    _add_routes(app)
    _add_error_handlers(app)
    # Starlette wraps in reverse order: the last added runs first.
    app.add_middleware(LimitBodySize, max_bytes=max_request_bytes)
    if api_key:
        app.add_middleware(RequireApiKey, api_key=api_key)
    if cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(cors_origins),
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["Authorization", "Content-Type"],
        )
    app.add_middleware(CountRequests, metrics=metrics)
    return app


def _service(request: Request) -> Service:
    service: Service = request.app.state.localspec
    return service


def _add_routes(app: FastAPI) -> None:
    app.add_api_route("/v1/chat/completions", chat_completions, methods=["POST"])
    app.add_api_route("/v1/completions", completions, methods=["POST"])
    app.add_api_route("/v1/models", list_models, methods=["GET"])
    app.add_api_route("/health", health, methods=["GET"])
    app.add_api_route("/metrics", metrics_text, methods=["GET"])


async def chat_completions(request: Request) -> Response:
    service = _service(request)
    body = _parse(ChatCompletionRequest, await _read_json(request))
    service.check_model(body.model)
    prepared = await anyio.to_thread.run_sync(service.preparer.chat, body)
    shape = Shape("chat", service.model_name)
    return await service.respond(request, Call(body, prepared, shape, "/v1/chat/completions"))


async def completions(request: Request) -> Response:
    service = _service(request)
    body = _parse(CompletionRequest, await _read_json(request))
    service.check_model(body.model)
    prepared = await anyio.to_thread.run_sync(service.preparer.completion, body)
    shape = Shape("completion", service.model_name)
    return await service.respond(request, Call(body, prepared, shape, "/v1/completions"))


async def list_models(request: Request) -> JSONResponse:
    service = _service(request)
    card = ModelCard(id=service.model_name, created=request.app.state.started)
    return JSONResponse(ModelList(data=[card]).model_dump())


async def health(request: Request) -> JSONResponse:
    service = _service(request)
    info = service.engine.info
    return JSONResponse(
        {
            "status": "ok",
            "model": service.model_name,
            "drafter": PurePath(info.drafter).name,  # a file name: no local paths to clients
            "n_ctx": info.n_ctx,
            "queue_depth": service.engine.queue_depth,
        }
    )


async def metrics_text(request: Request) -> Response:
    return Response(_service(request).metrics.render(), media_type=PROMETHEUS_CONTENT_TYPE)


async def _read_json(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw.strip():
        raise errors.ApiError(400, "The request body is empty; send a JSON object.")
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise errors.ApiError(
            400, f"The request body is not valid JSON: {error}.", code="invalid_json"
        ) from None
    if not isinstance(data, dict):
        raise errors.ApiError(400, "The request body must be a JSON object.", code="invalid_json")
    return data


def _parse(model: type[RequestModel], data: dict[str, Any]) -> RequestModel:
    return model.model_validate(data)


def _add_error_handlers(app: FastAPI) -> None:
    async def api_error(_: Request, error: Exception) -> Response:
        assert isinstance(error, errors.ApiError)
        return errors.from_api_error(error)

    async def localspec_error(_: Request, error: Exception) -> Response:
        assert isinstance(error, LocalspecError)
        return errors.from_localspec_error(error)

    async def validation_error(_: Request, error: Exception) -> Response:
        assert isinstance(error, ValidationError)
        return errors.from_validation_error(error)

    async def http_error(_: Request, error: Exception) -> Response:
        assert isinstance(error, HTTPException)
        return errors.error_response(error.status_code, str(error.detail), headers=error.headers)

    async def unexpected(_: Request, error: Exception) -> Response:
        return errors.from_unexpected(error)

    app.add_exception_handler(errors.ApiError, api_error)
    app.add_exception_handler(LocalspecError, localspec_error)
    app.add_exception_handler(ValidationError, validation_error)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, unexpected)
