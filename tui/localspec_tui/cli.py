"""``localspec chat``: registered through the ``localspec.commands`` entry-point group."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from localspec.errors import InvalidParameterError
from localspec.types import DraftMax

from .settings import ChatSettings, parse_draft_max


@dataclass(frozen=True)
class ModelChoice:
    """What to load, and the pair's defaults for what the command line leaves open."""

    target: str
    draft: str
    label: str | None = None  # the pair's name, shown in the status bar
    n_ctx: int = 4096
    temperature: float = 0.8
    draft_max: DraftMax = "auto"
    chat_template: str | None = None


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "chat",
        help="chat in the terminal and watch speculation work",
        description="A terminal chat with live tokens/s, acceptance rate, mean accepted length "
        "and draft/target provenance colours. Keys: F1 help, F2 speculation on/off, Esc stop.",
    )
    parser.add_argument("pair", nargs="?", help="a model pair from models.toml (default: built-in)")
    parser.add_argument("--target", help="target GGUF path (instead of PAIR)")
    parser.add_argument("--draft", help="draft GGUF path, 'ngram' or 'none' (default: ngram)")
    parser.add_argument("--ctx", type=int, help="context length (default: the pair's, 4096)")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: auto)")
    parser.add_argument(
        "--gpu-layers", type=int, default=-1, help="target layers to offload (default: all)"
    )
    parser.add_argument("--system", help="a system prompt for the conversation")
    parser.add_argument(
        "--temperature", type=float, help="sampling temperature (default: the pair's, 0.8)"
    )
    parser.add_argument(
        "--draft-max", help="draft length: 'auto' or 0-64 (default: the pair's, auto)"
    )
    parser.add_argument(
        "--max-tokens", type=int, default=512, help="longest reply in tokens (default: 512)"
    )
    parser.add_argument("--seed", type=int, default=None, help="sampling seed (default: random)")
    parser.add_argument(
        "--no-spec", action="store_true", help="start with speculation off (F2 toggles it)"
    )
    parser.set_defaults(func=run_chat)


def settings_from_args(args: argparse.Namespace, choice: ModelChoice) -> ChatSettings:
    try:
        draft_max = choice.draft_max if args.draft_max is None else parse_draft_max(args.draft_max)
    except ValueError as error:
        raise InvalidParameterError(f"--draft-max: {error}.") from None
    settings = ChatSettings(
        speculative=not args.no_spec,
        draft_max=draft_max,
        temperature=choice.temperature if args.temperature is None else args.temperature,
        max_tokens=args.max_tokens,
        seed=args.seed,
        system_prompt=args.system or None,
    )
    settings.params()  # validates, raising InvalidParameterError with the bad value
    return settings


def resolve_models(args: argparse.Namespace) -> ModelChoice:
    """--target/--draft (paths, models.toml names or hf: sources), a pair, or the default pair.

    Resolution happens before the UI starts, so a download shows its progress bar on the
    terminal; loading the resolved files happens inside the UI (errors on the error screen).
    """
    if args.pair and args.target:
        raise InvalidParameterError("Give either a PAIR name or --target, not both.")
    from localspec import registry

    if args.target:
        target = registry.resolve_model(args.target)
        return ModelChoice(str(target), registry.resolve_drafter(args.draft))
    pair = registry.resolve_pair(args.pair)
    drafter = pair.drafter if args.draft is None else registry.resolve_drafter(args.draft)
    return ModelChoice(
        str(pair.target),
        drafter,
        label=pair.name,
        n_ctx=pair.n_ctx,
        temperature=pair.temperature,
        draft_max=pair.draft_max,
        chat_template=pair.chat_template,
    )


def run_chat(args: argparse.Namespace) -> int:
    from localspec.engine import Engine

    from .app import ChatApp

    choice = resolve_models(args)
    settings = settings_from_args(args, choice)

    def load() -> Engine:
        return Engine.load(
            choice.target,
            choice.draft,
            n_ctx=args.ctx or choice.n_ctx,
            n_threads=args.threads,
            n_gpu_layers=args.gpu_layers,
        )

    app = ChatApp(
        loader=load,
        settings=settings,
        pair=choice.label,
        chat_template=choice.chat_template,
        loading_label=choice.target,
    )
    app.run()
    return 1 if app.load_error else 0
