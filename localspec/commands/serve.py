"""`localspec serve`: an OpenAI-compatible server on localhost (docs/server.md)."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from localspec.commands.common import (
    ModelChoice,
    add_model_arguments,
    choose_models,
    load_engine,
    pair_name,
)
from localspec.commands.limits import limit_notes
from localspec.errors import InvalidParameterError
from localspec.files import read_input_text
from localspec.runtime.loading import LoadOptions
from localspec.runtime.rpc import is_loopback
from localspec.server.options import ServerOptions
from localspec.types import GenerationParams

if TYPE_CHECKING:  # the server's modules (FastAPI) load only when serve runs
    from localspec.server.service import Service

API_KEY_ENV = "LOCALSPEC_API_KEY"
LIMITS = ServerOptions()  # the defaults shown in --help
DEFAULT_PARALLEL = 4


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="serve an OpenAI-compatible API on localhost",
        description="Serve /v1/chat/completions, /v1/completions, /v1/models, /health and "
        "/metrics with speculative decoding built in (docs/server.md).",
    )
    add_model_arguments(parser, positional_pair=True)
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8080, help="port (default: 8080)")
    parser.add_argument("--model-name", help="the model id clients send (default: the pair name)")
    parser.add_argument("--chat-template", help="a Jinja2 chat template file overriding the "
                        "GGUF's (default: the pair's, else the GGUF's)")
    parser.add_argument(
        "--parallel", type=int, default=DEFAULT_PARALLEL, metavar="N",
        help="generations that run together, sharing each target pass; more wait in the queue "
        "(default: %(default)s, with any drafter; in exact mode they take turns)",
    )
    parser.add_argument(
        "--recent-ngrams", type=int, default=LoadOptions.recent_ngram_tokens, metavar="TOKENS",
        help="the n-gram drafter also looks up this many tokens of recent answers, across "
        "requests (0: off; default: %(default)s)",
    )
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning"],
                        help="the server's log level (default: %(default)s)")
    _add_access_arguments(parser)
    _add_limit_arguments(parser)
    parser.set_defaults(func=run_serve)


def _add_access_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--api-key", default=os.environ.get(API_KEY_ENV),
        help=f"require 'Authorization: Bearer KEY' (default: ${API_KEY_ENV}, else none)",
    )
    parser.add_argument(
        "--allowed-host", action="append", default=[], metavar="NAME",
        help="also accept requests whose Host header is NAME (repeatable; default: loopback "
        "names only when bound to loopback)",
    )
    parser.add_argument(
        "--cors-origin", action="append", default=[], metavar="ORIGIN",
        help="allow browser requests from ORIGIN (repeatable; none by default)",
    )


def _add_limit_arguments(parser: argparse.ArgumentParser) -> None:
    limits = parser.add_argument_group("limits")
    limits.add_argument(
        "--max-queue", type=int, default=LIMITS.max_queue,
        help=f"requests running or waiting before new ones get 429 (default: {LIMITS.max_queue})",
    )
    limits.add_argument(
        "--max-tokens", type=int, default=LIMITS.max_tokens,
        help=f"default and cap of a request's generated tokens (default: {LIMITS.max_tokens})",
    )
    limits.add_argument(
        "--request-timeout", type=float, default=None, metavar="SECONDS",
        help="end a request this long after it was queued: 503 while waiting, "
        "finish_reason 'length' while generating (default: none)",
    )
    limits.add_argument(
        "--max-request-bytes", type=int, default=LIMITS.max_request_bytes,
        help="largest accepted request body (default: 4 MiB)",
    )
    limits.add_argument(
        "--max-connections", type=int, default=LIMITS.max_connections,
        help=f"open connections at once (default: {LIMITS.max_connections})",
    )
    grammar = LIMITS.grammar_limits
    limits.add_argument(
        "--max-grammar-bytes", type=int, default=grammar.max_bytes,
        help=f"largest grammar a request may send (default: {grammar.max_bytes})")
    limits.add_argument(
        "--max-grammar-depth", type=int, default=grammar.max_depth,
        help=f"nested groups in a grammar (default: {grammar.max_depth})")
    limits.add_argument(
        "--max-grammar-rules", type=int, default=grammar.max_rules,
        help=f"rules of a grammar after llama.cpp expands its repetitions (default: "
        f"{grammar.max_rules})")
    limits.add_argument(
        "--max-grammar-alternatives", type=int, default=grammar.max_alternatives,
        help=f"alternatives in a grammar, or a JSON Schema's enum/anyOf choices (default: "
        f"{grammar.max_alternatives})")
    limits.add_argument(
        "--max-grammar-mask-seconds", type=float, default=grammar.max_mask_seconds,
        help=f"time one check of the whole vocabulary against a grammar may take (default: "
        f"{grammar.max_mask_seconds:g})")
    limits.add_argument(
        "--shutdown-timeout", type=float, default=LIMITS.shutdown_timeout, metavar="SECONDS",
        help="on SIGTERM/SIGINT, how long running generations may finish (default: "
        f"{LIMITS.shutdown_timeout:g})",
    )


def run_serve(args: argparse.Namespace) -> int:
    from localspec.server import create_app
    from localspec.server.runner import GracefulServer, bind, drain_hook, server_config

    options = _options(args)
    template = _read_template(args.chat_template)
    # A bad host or a busy port fails at once, before models are fetched or loaded.
    with bind(args.host, args.port) as sock:
        choice = choose_models(args)
        _warn_if_exposed(args.host, args.api_key)
        with load_engine(args, choice, parallel=args.parallel, warm_up=True,
                         recent_ngram_tokens=args.recent_ngrams) as engine:
            for note in limit_notes(args, choice.n_ctx, engine.info):
                print(f"localspec: note: {note}", file=sys.stderr)
            app = create_app(
                engine,
                options,
                model_name=args.model_name or (None if args.target else choice.label),
                chat_template=template or choice.chat_template,
                defaults=_defaults(choice),
                aliases=_aliases(choice),
            )
            url = f"http://{_url_host(args.host)}:{sock.getsockname()[1]}/v1"
            print(start_line(app.state.localspec, url), file=sys.stderr)
            server = GracefulServer(server_config(app, options, args.log_level), drain_hook(app))
            server.run(sockets=[sock])
    return 0


def start_line(service: Service, url: str) -> str:
    """What serve prints once it listens: the id clients send as "model" (it may have spaces,
    from the GGUF's general.name) and the other spellings the server accepts."""
    info = service.engine.info
    others = sorted(service.model_names - {service.model_name})
    also = f" (also accepted: {', '.join(repr(n) for n in others)})" if others else ""
    return (f"localspec: serving '{service.model_name}' (drafter: {info.drafter}"
            f"{', exact mode' if info.exact else ''}, {info.parallel} at once) on {url}\n"
            f"localspec: clients send \"model\": \"{service.model_name}\"{also}")


def _aliases(choice: ModelChoice) -> tuple[str, ...]:
    """The models.toml name the user gave (--target NAME or the pair), not a file path."""
    label = choice.label
    return () if label.endswith(".gguf") or os.sep in label or ":" in label else (label,)


def _options(args: argparse.Namespace) -> ServerOptions:
    pair_name(args)  # a pair and --target together are refused before the port is bound
    if not 0 <= args.port < 65536:
        raise InvalidParameterError(f"--port {args.port} is invalid: it must be in 0..65535.")
    options = ServerOptions(
        api_key=args.api_key,
        allowed_hosts=tuple(args.allowed_host),
        cors_origins=tuple(args.cors_origin),
        max_request_bytes=args.max_request_bytes,
        max_queue=args.max_queue,
        max_tokens=args.max_tokens,
        request_timeout=args.request_timeout,
        max_connections=args.max_connections,
        shutdown_timeout=args.shutdown_timeout,
        grammar_limits=replace(LIMITS.grammar_limits, max_bytes=args.max_grammar_bytes,
                               max_depth=args.max_grammar_depth,
                               max_rules=args.max_grammar_rules,
                               max_alternatives=args.max_grammar_alternatives,
                               max_mask_seconds=args.max_grammar_mask_seconds),
    )
    options.validate()
    return options


def _defaults(choice: ModelChoice) -> GenerationParams:
    """Sampling defaults for requests that do not set them: the pair's, else the engine's."""
    return replace(choice.defaults(), stop=choice.stop)


def _read_template(path: str | None) -> str | None:
    if path is None:
        return None
    return read_input_text(path, "--chat-template")


def _warn_if_exposed(host: str, api_key: str | None) -> None:
    if is_loopback(host):
        return
    advice = "" if api_key else " and has no --api-key: anyone who can reach it can use it"
    print(
        f"localspec: WARNING: binding {host} exposes this server beyond this machine{advice}.",
        file=sys.stderr,
    )


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
