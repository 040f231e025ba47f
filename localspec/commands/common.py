"""Arguments and model loading shared by the commands that run a model (run, serve, chat).

``load_engine`` plans the memory first (docs/design.md, "Memory plan"): a pair that does not
fit is refused with the planner's reason before anything is loaded, and the plan's
``n_gpu_layers`` are used unless ``--n-gpu-layers`` is given.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass

from localspec.engine import Engine
from localspec.errors import ModelLoadError
from localspec.loading import DRAFTER_KEYWORDS, draft_model_path
from localspec.model_kind import ModelKind
from localspec.plan_table import parse_size
from localspec.plan_table import plan_summary as plan_summary  # re-exported for the chat UI
from localspec.planner import Plan, plan_from_files
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
    stop: tuple[str, ...] = ()  # the pair's chat stop strings (models.toml)
    kind: ModelKind = ModelKind()  # base or instruct, as models.toml says (else unknown)


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
    pair_help = "a pair from models.toml (default: the embedded default)"
    if pair_option:
        parser.add_argument("--pair", help=pair_help)
    else:
        parser.add_argument("pair", nargs="?", help=pair_help)
    parser.add_argument("--target",
                        help="target model: a GGUF path, a models.toml name or hf:REPO/FILE")
    parser.add_argument("--draft", help="drafter: a GGUF path or model name, 'ngram' or 'none'")
    parser.add_argument("--ctx", type=int, default=None, help="context size in tokens")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads (default: all cores)")
    parser.add_argument("--n-gpu-layers", type=int, default=None,
                        help="target layers to offload, -1 for all (default: from the "
                        "memory plan)")
    parser.add_argument("--budget", default=None,
                        help="memory budget such as 8GiB (default: the GPU's free memory, else "
                        "the available RAM); see `localspec plan`")
    parser.add_argument("--llama-head", action="store_true",
                        help="compute logits with llama.cpp's own output head (default: "
                        "localspec's faster CPU head where it applies)")
    parser.add_argument("--verbose", action="store_true", help="show llama.cpp's log")


def choose_models(args: argparse.Namespace) -> ModelChoice:
    """Combine models.toml with --target/--draft (files named on the command line win)."""
    from localspec.registry import load_registry

    known = load_registry()
    if args.target:
        target = str(known.resolve_model(args.target))
        drafter = known.resolve_drafter(args.draft or "ngram")
        return ModelChoice(target, drafter, args.ctx or 4096, "auto", None, None, args.target,
                           kind=known.kind_of(args.target))
    pair = known.resolve_pair(args.pair)
    drafter = known.resolve_drafter(args.draft) if args.draft else pair.drafter
    return ModelChoice(
        str(pair.target), drafter, args.ctx or pair.n_ctx, pair.draft_max, pair.temperature,
        pair.chat_template, pair.name,
        stop=pair.stop, kind=known.kind_of(known.pair(pair.name).target),
    )


def plan_for(
    target: str | os.PathLike[str],
    drafter: str,
    n_ctx: int,
    budget: str | int | None = None,
    *,
    fast_head: bool = True,
) -> Plan:
    """The memory plan for a target and a drafter ("ngram", "none" or a GGUF path); ``budget``
    is bytes or a size such as "8GiB" (default: the GPU's free memory, else available RAM).
    Reads the GGUF headers only; raises a LocalspecError for a missing or broken file."""
    draft = None if drafter in DRAFTER_KEYWORDS else draft_model_path(drafter)
    budget_bytes = parse_size(budget) if isinstance(budget, str) else budget
    return plan_from_files(target, draft, n_ctx, budget_bytes, fast_head=fast_head)


def plan_choice(args: argparse.Namespace, choice: ModelChoice) -> Plan:
    """``plan_for`` with the choice's models and context and the command's ``--budget`` and
    ``--llama-head``."""
    return plan_for(choice.target, choice.drafter, choice.n_ctx, getattr(args, "budget", None),
                    fast_head=not getattr(args, "llama_head", False))


def load_engine(
    args: argparse.Namespace, choice: ModelChoice, *, plan: Plan | None = None, **kwargs: object
) -> Engine:
    """Plan, then load. Raises ModelLoadError with the plan's reason when the pair does not fit
    (nothing is loaded); an explicit ``--n-gpu-layers`` overrides the plan's placement, and then
    only a plan for RAM (a CPU) is enforced. ``plan``: one already made by ``plan_choice``."""
    if plan is None:
        plan = plan_choice(args, choice)
    explicit = getattr(args, "n_gpu_layers", None)
    if not plan.fits and (explicit is None or plan.device.kind == "cpu"):
        raise ModelLoadError(plan.reason or "The pair does not fit in the memory budget.")
    if explicit is not None:
        layers: dict[str, int | None] = {"n_gpu_layers": explicit, "n_gpu_layers_draft": None}
    else:
        draft = plan.draft.n_gpu_layers if plan.draft is not None else None
        layers = {"n_gpu_layers": plan.target.n_gpu_layers, "n_gpu_layers_draft": draft}
    engine = Engine.load(
        choice.target,
        draft=choice.drafter,
        n_ctx=choice.n_ctx,
        n_threads=args.threads,
        fast_head=not getattr(args, "llama_head", False),
        verbose=args.verbose,
        **layers,  # type: ignore[arg-type]
        **kwargs,  # type: ignore[arg-type]
    )
    if engine.info.notice:
        print(f"localspec: {engine.info.notice}", file=sys.stderr)
    return engine
