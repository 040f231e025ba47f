"""Arguments and model loading shared by the commands that run a model (run, serve, chat).

``load_engine`` plans the memory first (docs/design.md, "Memory plan"): a pair that does not
fit is refused with the planner's reason before anything is loaded, and the plan's
``n_gpu_layers`` are used unless ``--n-gpu-layers`` is given.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, replace
from typing import Any

from localspec.commands.limits import has_gpu_backend
from localspec.drafter_spec import DrafterSpec
from localspec.errors import InvalidParameterError, ModelLoadError
from localspec.models.kind import ModelKind
from localspec.planning.memory import draft_widened_types, widened_types
from localspec.planning.planner import KV_TYPES, Plan, plan_from_files
from localspec.planning.remote import spread
from localspec.planning.table import plan_summary as plan_summary  # re-exported for the chat UI
from localspec.planning.units import parse_size
from localspec.runtime.engine import Engine
from localspec.runtime.loading import (
    DEFAULT_N_CTX,
    LoadOptions,
    load_rule_violation,
    resolved_drafter,
)
from localspec.runtime.rpc import parse_endpoints, remote_devices
from localspec.types import DRAFT_MAX_LIMIT, DraftMax, GenerationParams, parse_draft_max


@dataclass(frozen=True)
class ModelChoice:
    """What to load, after models.toml and the command line have been combined."""

    target: str
    drafter: DrafterSpec  # a draft model's path is a local GGUF file
    n_ctx: int
    draft_max: DraftMax
    temperature: float | None  # the pair's default, None when the user named files
    chat_template: str | None
    label: str  # for display: the pair name or the target file name
    stop: tuple[str, ...] = ()  # the pair's chat stop strings (models.toml)
    kind: ModelKind = ModelKind()  # base or instruct, as models.toml says (else unknown)
    rpc: tuple[str, ...] = ()  # RPC workers for the target (--rpc, else the pair's)

    def defaults(self) -> GenerationParams:
        """Generation parameters with the pair's draft length and temperature (when it has
        one); GenerationParams' own defaults for everything else."""
        params = GenerationParams(draft_max=self.draft_max)
        return params if self.temperature is None else replace(params, temperature=self.temperature)


def draft_max_arg(text: str) -> DraftMax:
    """argparse's converter for a draft length (GenerationParams owns the rule)."""
    try:
        return parse_draft_max(text)
    except InvalidParameterError as error:
        raise argparse.ArgumentTypeError(str(error).rstrip(".")) from None


def add_draft_max_argument(parser: argparse.ArgumentParser,
                           default: str = "the pair's, else auto") -> None:
    """``--draft-max``, the same for every command (run, bench, check, chat): None when not
    given, which each command reads as ``default`` says (the pair's draft length, else
    GenerationParams' own default)."""
    parser.add_argument(
        "--draft-max", type=draft_max_arg, default=None,
        help=f"longest draft per step: 'auto' (the controller picks) or 0-{DRAFT_MAX_LIMIT} "
             f"(default: {default})")


def rpc_arg(text: str) -> tuple[str, ...]:
    """argparse's converter for ``--rpc`` (localspec.runtime.rpc owns the rule)."""
    try:
        return parse_endpoints(text)
    except InvalidParameterError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix(f"--rpc {text!r} is invalid: ")
                                         .rstrip(".")) from None


class _DeprecatedAlias(argparse.Action):
    """An old spelling that still works: it warns, then stores into the new option's dest."""

    def __init__(self, *args: Any, new: str, value: Any = None, **kwargs: Any) -> None:
        self.new, self.value = new, value
        super().__init__(*args, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        if values is None and option_string is None:  # an absent positional
            return
        old = option_string or f"the positional {self.metavar}"
        print(f"localspec: warning: {old} is deprecated; use {self.new} instead.",
              file=sys.stderr)
        setattr(namespace, self.dest, self.value if self.nargs == 0 else values)


def add_model_arguments(parser: argparse.ArgumentParser, *, positional_pair: bool = False,
                        loads: bool = True) -> None:
    """The model flags every command that loads (or plans) models takes. ``positional_pair``:
    also accept the pair as a positional argument (the old spelling of chat, serve and plan,
    deprecated); ``loads``: add the flags that only matter when models are loaded."""
    group = parser.add_argument_group("model")
    group.add_argument("--pair", help="a pair from models.toml (default: the default pair, the "
                       "embedded Gemma 3 270M)")
    if positional_pair:
        group.add_argument("old_pair", nargs="?", metavar="PAIR", action=_DeprecatedAlias,
                           new="--pair PAIR", help="deprecated spelling of --pair PAIR")
    group.add_argument("--target", help="target model: a GGUF path, a models.toml name or "
                       "hf:ORG/REPO/FILE.gguf (default: the pair's)")
    group.add_argument("--draft", help="drafter: a draft model (path, name or hf: source), "
                       "'ngram', 'none', hybrid:MODEL (n-gram when the text has a match, else "
                       "the model), eagle3:HEAD (the same with an EAGLE-3 head), 'mtp' (the "
                       "same with the target's own MTP layers) or 'auto' (mtp when the target "
                       "has MTP layers, else ngram) (default: the pair's, else auto)")
    group.add_argument("--ctx", type=int, default=None,
                       help=f"context size in tokens (default: the pair's, else {DEFAULT_N_CTX})")
    group.add_argument("--kv-type", default=LoadOptions.kv_type, choices=sorted(KV_TYPES),
                       help="KV cache type (default: %(default)s)")
    group.add_argument("--budget", default=None,
                       help="memory budget such as 8GiB (default: the GPU's free memory, else "
                       "the available RAM); see `localspec plan`")
    group.add_argument("--llama-head", action="store_true",
                       help="compute logits with llama.cpp's own output head (default: "
                       "localspec's faster CPU head where it applies)")
    group.add_argument("--llama-body", action="store_true",
                       help="multiply the target's body matrices with llama.cpp's kernels "
                       "(default: localspec's faster CPU kernels where they apply: Q8_0, "
                       "Q5_0, Q4_K and Q6_K)")
    group.add_argument("--rpc", type=rpc_arg, default=None, metavar="HOST:PORT[,HOST:PORT...]",
                       help="spread the target's layers over these `localspec rpc-worker`s "
                       "(docs/rpc.md); the drafter and the output layer stay local (default: "
                       "the pair's, else none)")
    if not loads:
        return
    group.add_argument("--no-repack", action="store_true",
                       help="keep the target's weights in their file layout on the CPU, as "
                       "llama.cpp's --no-repack (default: llama.cpp's faster repacked layouts)")
    group.add_argument("--exact", action="store_true",
                       help="exact mode: batch-invariant target passes, so speculative output "
                       "equals plain output bit for bit (docs/exact.md) (default: off)")
    group.add_argument("--threads", type=int, default=None,
                       help="CPU threads (default: the usable cores minus those other work "
                       "keeps busy at start-up, by the load average; at least 1)")
    group.add_argument("--n-gpu-layers", type=int, default=None,
                       help="target layers to offload, -1 for all (default: from the memory plan)")
    group.add_argument("--verbose", action="store_true",
                       help="show llama.cpp's log (default: off)")


def add_speculation_switch(parser: argparse.ArgumentParser, *, old: str | None = None) -> None:
    """``--no-speculation`` (plain target-only decoding); ``old``: a deprecated spelling."""
    parser.add_argument("--no-speculation", action="store_true",
                        help="plain target-only decoding (default: speculate)")
    if old is not None:
        parser.add_argument(old, dest="no_speculation", nargs=0, action=_DeprecatedAlias,
                            new="--no-speculation", value=True,
                            help="deprecated spelling of --no-speculation")


def pair_name(args: argparse.Namespace) -> str | None:
    """The pair asked for (``--pair``, or the deprecated positional); refuses a pair together
    with ``--target``."""
    pair: str | None = args.pair or getattr(args, "old_pair", None)
    if pair and args.target:
        raise InvalidParameterError("Give either a PAIR (--pair) or --target, not both.")
    return pair


def choose_models(args: argparse.Namespace) -> ModelChoice:
    """Combine models.toml with --target/--draft (files named on the command line win)."""
    from localspec.models.registry import load_registry

    known = load_registry()
    pair_wanted = pair_name(args)
    if args.target:
        target = str(known.resolve_model(args.target))
        drafter = known.resolve_drafter(args.draft)
        return ModelChoice(target, drafter, args.ctx or DEFAULT_N_CTX, GenerationParams.draft_max,
                           None, None, args.target,
                           kind=known.kind_of(args.target), rpc=args.rpc or ())
    pair = known.resolve_pair(pair_wanted)
    drafter = known.resolve_drafter(args.draft) if args.draft else pair.drafter
    return ModelChoice(
        str(pair.target), drafter, args.ctx or pair.n_ctx, pair.draft_max, pair.temperature,
        pair.chat_template, pair.name,
        stop=pair.stop, kind=known.kind_of(known.pair(pair.name).target),
        rpc=args.rpc if args.rpc is not None else pair.rpc,
    )


def plan_for(
    target: str | os.PathLike[str],
    drafter: DrafterSpec | str,
    n_ctx: int,
    budget: str | int | None = None,
    *,
    fast_head: bool = True,
    fast_body: bool = LoadOptions.fast_body,
    repack: bool = LoadOptions.repack,
    kv_type: str = LoadOptions.kv_type,
    parallel: int = LoadOptions.parallel,
    exact: bool = LoadOptions.exact,
    rpc: tuple[str, ...] = (),
) -> Plan:
    """The memory plan for a target and a drafter (a DrafterSpec or its spelling); ``budget``
    is bytes or a size such as "8GiB" (default: the GPU's free memory, else available RAM).
    The target's and the drafter's caches hold the ``parallel`` generations that will share
    the target's passes; "auto" is the drafter it resolves to. Reads the GGUF headers (and asks the
    ``rpc`` workers for their free memory); raises a LocalspecError for a missing or broken file
    or an unreachable worker."""
    spec = resolved_drafter(DrafterSpec.parse(drafter), str(target), exact=exact)
    budget_bytes = parse_size(budget) if isinstance(budget, str) else budget
    plan = plan_from_files(target, spec.path, n_ctx, budget_bytes, kv_type, fast_head=fast_head,
                           n_seq=parallel, mtp=spec.kind == "mtp",
                           snapshots=spec.kind != "none" and not exact,
                           widened=widened_types(exact=exact, fast_body=fast_body, repack=repack,
                                                 rpc=bool(rpc), gpu_backend=has_gpu_backend()),
                           draft_widened=draft_widened_types(spec, fast_body=fast_body,
                                                             repack=repack,
                                                             gpu_backend=has_gpu_backend()))
    return spread(plan, target, remote_devices(rpc) if rpc else (), fast_head=fast_head)


def checked_parallel(parallel: int) -> int:
    """``--parallel``, checked by LoadOptions' rule before a memory plan counts its caches."""
    rule = load_rule_violation("parallel", parallel)
    if rule:
        raise InvalidParameterError(f"--parallel {parallel} is invalid: {rule}.")
    return parallel


def plan_choice(args: argparse.Namespace, choice: ModelChoice,
                parallel: int = LoadOptions.parallel) -> Plan:
    """``plan_for`` with the choice's models and context, the command's ``--budget``,
    ``--llama-head``, ``--llama-body``, ``--no-repack``, ``--kv-type`` and ``--exact``, and
    ``parallel`` generations (serve)."""
    checked_parallel(parallel)
    return plan_for(choice.target, choice.drafter, choice.n_ctx, args.budget,
                    fast_head=not args.llama_head, fast_body=not args.llama_body,
                    repack=not getattr(args, "no_repack", False), kv_type=args.kv_type,
                    parallel=parallel,
                    exact=getattr(args, "exact", LoadOptions.exact), rpc=choice.rpc)


def load_options(args: argparse.Namespace, choice: ModelChoice, plan: Plan,
                 **overrides: Any) -> LoadOptions:
    """The model flags as LoadOptions. Raises ModelLoadError with the plan's reason when the
    pair does not fit; an explicit ``--n-gpu-layers`` overrides the plan's placement, and then
    only a plan for RAM (a CPU) is enforced."""
    explicit = args.n_gpu_layers
    if not plan.fits and (explicit is None or plan.device.kind == "cpu"):
        raise ModelLoadError(plan.reason or "The pair does not fit in the memory budget.")
    if explicit is not None:
        layers, draft_layers = explicit, None
    else:
        layers = plan.target.n_gpu_layers
        draft_layers = plan.draft.n_gpu_layers if plan.draft is not None else None
    options = LoadOptions(
        target=choice.target, draft=choice.drafter, n_ctx=choice.n_ctx, n_threads=args.threads,
        n_gpu_layers=layers, n_gpu_layers_draft=draft_layers, fast_head=not args.llama_head,
        fast_body=not args.llama_body,
        kv_type=args.kv_type, repack=not args.no_repack, exact=getattr(args, "exact", False),
        rpc=choice.rpc, verbose=args.verbose,
    )
    return replace(options, **overrides)


def load_engine(
    args: argparse.Namespace, choice: ModelChoice, *, plan: Plan | None = None,
    warm_up: bool = False, **overrides: Any
) -> Engine:
    """Plan, then load (``load_options``; nothing is loaded when the pair does not fit).
    ``plan``: one already made by ``plan_choice``; ``warm_up``: calibrate now, not in the first
    request (``Engine.warm_up``: servers and chats); ``overrides``: other LoadOptions fields."""
    plan = plan or plan_choice(args, choice, overrides.get("parallel", LoadOptions.parallel))
    options = load_options(args, choice, plan, **overrides)
    engine = Engine(options)
    if engine.info.notice:
        print(f"localspec: {engine.info.notice}", file=sys.stderr)
    if warm_up:
        try:
            engine.warm_up()
        except BaseException:
            engine.close()
            raise
    return engine
