"""``localspec chat``: registered through the ``localspec.commands`` entry-point group."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from localspec.commands.common import (
    ModelChoice,
    add_draft_max_argument,
    add_model_arguments,
    add_speculation_switch,
    choose_models,
    pair_name,
)
from localspec.commands.shaping import add_shaping_arguments, shaping_fields

from .settings import ChatSettings

if TYPE_CHECKING:
    from localspec.runtime.engine import Engine


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "chat",
        help="chat in the terminal and watch speculation work",
        description="A terminal chat with live tokens/s, acceptance rate, mean accepted length "
        "and draft/target provenance colours. Keys: F1 help, F2 speculation on/off, Esc stop.",
    )
    add_model_arguments(parser, positional_pair=True)
    parser.add_argument("--system", help="a system prompt for the conversation (default: none)")
    parser.add_argument(
        "--temperature", type=float, help="sampling temperature (default: the pair's, 0.8)"
    )
    add_draft_max_argument(parser)
    parser.add_argument(
        "--max-tokens", type=int, default=512, help="longest reply in tokens (default: 512)"
    )
    parser.add_argument("--seed", type=int, default=None, help="sampling seed (default: random)")
    add_speculation_switch(parser, old="--no-spec")  # F2 toggles it in the chat
    add_shaping_arguments(parser)
    parser.set_defaults(func=run_chat)


def settings_from_args(args: argparse.Namespace, choice: ModelChoice) -> ChatSettings:
    defaults = choice.defaults()
    draft_max = defaults.draft_max if args.draft_max is None else args.draft_max
    settings = ChatSettings(
        speculative=not args.no_speculation,
        draft_max=draft_max,
        temperature=defaults.temperature if args.temperature is None else args.temperature,
        max_tokens=args.max_tokens,
        seed=args.seed,
        system_prompt=args.system or None,
    )
    settings.base = replace(settings.base, **shaping_fields(args))
    settings.params()  # validates, raising InvalidParameterError with the bad value
    return settings


def resolve_models(args: argparse.Namespace) -> ModelChoice:
    """A pair (default: the embedded default) or --target/--draft, as the other commands."""
    pair_name(args)
    return choose_models(args)


def mode_loader(args: argparse.Namespace, choice: ModelChoice) -> Callable[[bool], Engine]:
    """``/exact``'s reload: the same models and flags with exact mode on or off, under a memory
    plan of its own (the mode decides the drafter "auto" picks and the caches it counts)."""
    from localspec.commands.common import load_engine, plan_choice

    def reload(exact: bool) -> Engine:
        again = argparse.Namespace(**{**vars(args), "exact": exact})
        return load_engine(again, choice, plan=plan_choice(again, choice), warm_up=True)

    return reload


def run_chat(args: argparse.Namespace) -> int:
    from localspec.commands.common import load_engine, plan_choice, plan_summary
    from localspec.commands.limits import limit_notes

    from .app import ChatApp

    # Resolve (and download) before the UI starts, so progress bars show on the terminal and
    # a pair that does not fit is refused before anything loads; loading happens in the UI.
    choice = resolve_models(args)
    settings = settings_from_args(args, choice)
    plan = plan_choice(args, choice)

    def load() -> Engine:
        return load_engine(args, choice, plan=plan, warm_up=True)

    app = ChatApp(
        loader=load,
        settings=settings,
        pair=choice.label,
        memory=plan_summary(plan),
        chat_template=choice.chat_template,
        chat_stop=choice.stop,
        loading_label=choice.target,
        kind=choice.kind,
        notes=lambda info: limit_notes(args, choice.n_ctx, info),
        reload=mode_loader(args, choice),
    )
    app.run()
    return 1 if app.load_error else 0
