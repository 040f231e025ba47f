"""The OpenAI-compatible app: ``create_app(engine)`` builds one FastAPI app per engine.

Endpoints: POST /v1/chat/completions, POST /v1/completions, POST /infill (llama.cpp's
fill-in-the-middle), GET /v1/models, GET /health, GET /metrics. All state lives on
``app.state.localspec`` (a Service); nothing is global. Middleware, outermost first: request
counting, request ids and the last-resort 500, the Host/Origin/Content-Type guard, CORS, the API
key, the body size limit.
"""

from __future__ import annotations

import time
from pathlib import PurePath

from fastapi import FastAPI
from fastapi.routing import APIRoute
from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from localspec.errors import LocalspecError
from localspec.runtime.engine import Engine
from localspec.server import errors
from localspec.server.body import read_body
from localspec.server.guard import RequestGuard
from localspec.server.metrics import PROMETHEUS_CONTENT_TYPE, ServerMetrics
from localspec.server.middleware import CountRequests, LimitBodySize, RequireApiKey, TagRequests
from localspec.server.options import ServerOptions
from localspec.server.prepare import Preparer
from localspec.server.schemas import ModelCard, ModelList
from localspec.server.service import Service
from localspec.types import GenerationParams


def create_app(
    engine: Engine,
    options: ServerOptions | None = None,
    *,
    model_name: str | None = None,
    chat_template: str | None = None,
    defaults: GenerationParams | None = None,
    aliases: tuple[str, ...] = (),
) -> FastAPI:
    """Build the app. ``options``: access rules and limits (validated here); ``chat_template``
    overrides the GGUF's; ``defaults`` are the sampling parameters a request does not set (a
    models.toml pair's defaults, else the engine's); ``aliases``: other names a request's
    ``model`` may give (with the id and general.name, and each one's slug)."""
    options = options or ServerOptions()
    options.validate()
    name = model_name or engine.info.target_name
    preparer = Preparer(engine, chat_template, defaults or GenerationParams(), options.max_tokens,
                        options.grammar_limits)
    service = Service(engine, name, preparer, options, aliases)
    app = FastAPI(title="localspec", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.localspec = service
    app.state.started = int(time.time())
    _add_routes(app)
    _add_error_handlers(app)
    _add_middleware(app, options, service.metrics)
    return app


def _add_middleware(app: FastAPI, options: ServerOptions, metrics: ServerMetrics) -> None:
    # Starlette wraps in reverse order: the last added runs first.
    app.add_middleware(LimitBodySize, max_bytes=options.max_request_bytes, metrics=metrics)
    if options.api_key:
        app.add_middleware(RequireApiKey, api_key=options.api_key, metrics=metrics)
    if options.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(options.cors_origins),
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["Authorization", "Content-Type"],
        )
    app.add_middleware(RequestGuard, options=options, metrics=metrics)
    app.add_middleware(TagRequests)
    app.add_middleware(CountRequests, metrics=metrics)


def _service(request: Request) -> Service:
    service: Service = request.app.state.localspec
    return service


def _add_routes(app: FastAPI) -> None:
    app.add_api_route("/v1/chat/completions", chat_completions, methods=["POST"])
    app.add_api_route("/v1/completions", completions, methods=["POST"])
    app.add_api_route("/infill", infill, methods=["POST"])
    app.add_api_route("/v1/models", list_models, methods=["GET"])
    app.add_api_route("/health", health, methods=["GET"])
    app.add_api_route("/metrics", metrics_text, methods=["GET"])


def _route_error(request: Request, status: int) -> str | None:
    """A sentence for a path this server lacks (404) or a method a path does not take (405)."""
    asked = f"{request.method} {request.url.path[:100]}"
    routes = [(method, route.path) for route in request.app.routes
              if isinstance(route, APIRoute) for method in sorted(route.methods or ())]
    if status == 404:
        offered = ", ".join(f"{method} {path}" for method, path in routes)
        return f"This server has no {asked}; it serves {offered}."
    if status == 405:
        allowed = " or ".join(m for m, path in routes if path == request.url.path)
        return f"{asked} is not supported: use {allowed}."
    return None


async def chat_completions(request: Request) -> Response:
    service = _service(request)
    raw = await read_body(request, service.options.body_timeout)
    call = await service.prepare(service.chat_call, raw)  # JSON, template, tokens
    return await service.respond(request, call)


async def completions(request: Request) -> Response:
    service = _service(request)
    raw = await read_body(request, service.options.body_timeout)
    call = await service.prepare(service.completion_call, raw)
    return await service.respond(request, call)


async def infill(request: Request) -> Response:
    service = _service(request)
    raw = await read_body(request, service.options.body_timeout)
    call = await service.prepare(service.infill_call, raw)  # FIM tokens, trimming
    return await service.respond(request, call)


async def list_models(request: Request) -> JSONResponse:
    service = _service(request)
    card = ModelCard(id=service.model_name, created=request.app.state.started)
    return JSONResponse(ModelList(data=[card]).model_dump())


async def health(request: Request) -> JSONResponse:
    service = _service(request)
    engine = service.engine
    info = engine.info
    failure = engine.failure
    return JSONResponse(
        {
            # "ok"; with --rpc also "worker_lost" (the next request probes the workers and
            # loads the model again: 200, so that a request still comes) or "reloading"
            "status": engine.status,
            **({"error": failure} if failure else {}),
            "model": service.model_name,
            "drafter": PurePath(info.drafter).name,  # a file name: no local paths to clients
            "n_ctx": info.n_ctx,
            "exact": info.exact,  # exact mode is chosen at load (docs/exact.md), not per request
            "queue_depth": service.queue.depth,
        }
    )


async def metrics_text(request: Request) -> Response:
    return Response(_service(request).metrics.render(), media_type=PROMETHEUS_CONTENT_TYPE)


def _add_error_handlers(app: FastAPI) -> None:
    async def api_error(request: Request, error: Exception) -> Response:
        assert isinstance(error, errors.ApiError)
        if error.reason is not None:
            _service(request).metrics.record_rejected(error.reason)
        return errors.from_api_error(error)

    async def localspec_error(_: Request, error: Exception) -> Response:
        assert isinstance(error, LocalspecError)
        return errors.from_localspec_error(error)

    async def validation_error(_: Request, error: Exception) -> Response:
        assert isinstance(error, ValidationError)
        return errors.from_validation_error(error)

    async def http_error(request: Request, error: Exception) -> Response:
        assert isinstance(error, HTTPException)
        message = _route_error(request, error.status_code) or str(error.detail)
        return errors.error_response(error.status_code, message, headers=error.headers)

    app.add_exception_handler(errors.ApiError, api_error)
    app.add_exception_handler(LocalspecError, localspec_error)
    app.add_exception_handler(ValidationError, validation_error)
    app.add_exception_handler(HTTPException, http_error)
