"""`localspec serve`: an OpenAI-compatible server on localhost (docs/server.md)."""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from typing import Any

from localspec.commands.common import ModelChoice, add_model_arguments, choose_models, load_engine
from localspec.commands.limits import limit_notes
from localspec.errors import InvalidParameterError, LocalspecError
from localspec.types import GenerationParams

API_KEY_ENV = "LOCALSPEC_API_KEY"
GRACEFUL_SHUTDOWN_SECONDS = 5  # then open requests are cancelled (their generations stop)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="serve an OpenAI-compatible API on localhost",
        description="Serve /v1/chat/completions, /v1/completions, /v1/models, /health and "
        "/metrics with speculative decoding built in (docs/server.md).",
    )
    add_model_arguments(parser, pair_option=False)
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8080, help="port (default: 8080)")
    parser.add_argument(
        "--api-key", default=os.environ.get(API_KEY_ENV),
        help=f"require 'Authorization: Bearer KEY' (default: ${API_KEY_ENV}, else none)",
    )
    parser.add_argument(
        "--max-queue", type=int, default=16,
        help="requests waiting or running before new ones get 429 (default: 16)",
    )
    parser.add_argument("--model-name", help="the model id clients send (default: the pair name)")
    parser.add_argument("--chat-template", help="a Jinja2 chat template file overriding the GGUF's")
    parser.add_argument(
        "--cors-origin", action="append", default=[], metavar="ORIGIN",
        help="allow browser requests from ORIGIN (repeatable; none by default)",
    )
    parser.add_argument(
        "--max-request-bytes", type=int, default=4 * 1024 * 1024,
        help="largest accepted request body (default: 4 MiB)",
    )
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])
    parser.set_defaults(func=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from localspec.server import create_app

    _check_args(args)
    template = _read_template(args.chat_template)
    choice = choose_models(args)
    _warn_if_exposed(args.host, args.api_key)
    with load_engine(args, choice, max_queue=args.max_queue) as engine:
        for note in limit_notes(args, choice.n_ctx, engine.info):
            print(f"localspec: note: {note}", file=sys.stderr)
        app = create_app(
            engine,
            api_key=args.api_key,
            model_name=args.model_name or (None if args.target else choice.label),
            max_request_bytes=args.max_request_bytes,
            cors_origins=tuple(args.cors_origin),
            chat_template=template or choice.chat_template,
            defaults=_defaults(choice),
        )
        name = app.state.localspec.model_name
        print(
            f"localspec: serving '{name}' (drafter: {engine.info.drafter}) on "
            f"http://{_url_host(args.host)}:{args.port}/v1",
            file=sys.stderr,
        )
        uvicorn.run(
            app, host=args.host, port=args.port, log_level=args.log_level,
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
        )
    return 0


def _defaults(choice: ModelChoice) -> GenerationParams:
    """Sampling defaults for requests that do not set them: the pair's, else the engine's."""
    if choice.temperature is None:
        return GenerationParams(draft_max=choice.draft_max, stop=choice.stop)
    return GenerationParams(draft_max=choice.draft_max, temperature=choice.temperature,
                            stop=choice.stop)


def _check_args(args: argparse.Namespace) -> None:
    if args.pair and args.target:
        raise InvalidParameterError("Give either a PAIR name or --target, not both.")
    if "*" in args.cors_origin:
        raise InvalidParameterError(
            "--cors-origin '*' would let any web page call this server; name the origins."
        )
    if not 0 < args.port < 65536:
        raise InvalidParameterError(f"--port {args.port} is invalid: it must be in 1..65535.")
    if args.max_queue < 1 or args.max_request_bytes < 1024:
        raise InvalidParameterError("--max-queue must be >= 1 and --max-request-bytes >= 1024.")


def _read_template(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError as error:
        raise LocalspecError(f"Cannot read the chat template {path!r}: {error.strerror}.") from None


def _warn_if_exposed(host: str, api_key: str | None) -> None:
    if _is_loopback(host):
        return
    advice = "" if api_key else " and has no --api-key: anyone who can reach it can use it"
    print(
        f"localspec: WARNING: binding {host} exposes this server beyond this machine{advice}.",
        file=sys.stderr,
    )


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
