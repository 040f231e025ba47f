"""Arguments and model loading shared by the commands that run a model (run, serve, chat)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from localspec.engine import Engine
from localspec.types import DraftMax


@dataclass(frozen=True)
class ModelChoice:
    """What to load, after models.toml and the command line have been combined."""

    target: str
    drafter: str  # "ngram", "none" or a draft GGUF path
    n_ctx: int
    draft_max: DraftMax
    temperature: float | None  # the pair's default, None when the user named files
    chat_template: str | None
    label: str  # for display: the pair name or the target file name


def draft_max_arg(text: str) -> DraftMax:
    if text == "auto":
        return "auto"
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or an integer, got {text!r}") from None
    if not 0 <= value <= 64:
        raise argparse.ArgumentTypeError(f"draft length must be in 0..64, got {value}")
    return value


def add_model_arguments(parser: argparse.ArgumentParser, *, pair_option: bool) -> None:
    """--target/--draft/--ctx/...; the pair is a positional argument unless `pair_option`."""
    if pair_option:
        parser.add_argument("--pair", help="a pair from models.toml (default: the embedded default)")
    else:
        parser.add_argument("pair", nargs="?", help="a pair from models.toml (default: the embedded default)")
    parser.add_argument("--target", help="target model: a GGUF path, a models.toml name or hf:REPO/FILE")
    parser.add_argument("--draft", help="drafter: a GGUF path or model name, 'ngram' or 'none'")
    parser.add_argument("--ctx", type=int, default=None, help="context size in tokens")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    parser.add_argument("--n-gpu-layers", type=int, default=-1, help="layers to offload (-1: all that fit)")
    parser.add_argument("--verbose", action="store_true", help="show llama.cpp's log")


def choose_models(args: argparse.Namespace) -> ModelChoice:
    """Combine models.toml with --target/--draft (files named on the command line win)."""
    from localspec import registry

    if args.target:
        target = str(registry.resolve_model(args.target))
        drafter = registry.resolve_drafter(args.draft or "ngram")
        return ModelChoice(target, drafter, args.ctx or 4096, "auto", None, None, args.target)
    pair = registry.resolve_pair(args.pair)
    drafter = registry.resolve_drafter(args.draft) if args.draft else pair.drafter
    return ModelChoice(
        str(pair.target), drafter, args.ctx or pair.n_ctx, pair.draft_max, pair.temperature,
        pair.chat_template, pair.name,
    )


def load_engine(args: argparse.Namespace, choice: ModelChoice, **kwargs: object) -> Engine:
    return Engine.load(
        choice.target,
        draft=choice.drafter,
        n_ctx=choice.n_ctx,
        n_threads=args.threads,
        n_gpu_layers=args.n_gpu_layers,
        verbose=args.verbose,
        **kwargs,  # type: ignore[arg-type]
    )
