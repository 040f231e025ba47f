"""`localspec plan`: how a pair would share the memory budget, before loading anything."""

from __future__ import annotations

import argparse
import json
from typing import Any

from localspec.commands.common import add_model_arguments, checked_parallel, pair_name
from localspec.commands.limits import has_gpu_backend
from localspec.errors import InvalidParameterError
from localspec.models.registry import load_registry
from localspec.planning.memory import draft_widened_types, widened_types
from localspec.planning.planner import (
    Device,
    Plan,
    choose_device,
    default_device,
    parse_size,
    plan_from_files,
)
from localspec.planning.remote import spread
from localspec.runtime.loading import DEFAULT_N_CTX, LoadOptions, resolved_drafter
from localspec.runtime.rpc import remote_devices


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="show how target and draft share the memory budget",
        description="Read both GGUF headers and show which layers, KV caches and buffers go on "
        "the device and what stays in host memory; with --rpc, which target layers each "
        "worker's device would hold. Nothing is loaded or downloaded. Exits with 1 when the "
        "pair does not fit.",
    )
    add_model_arguments(parser, positional_pair=True, loads=False)
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "gpu"),
                        help="plan for the CPU (RAM), a GPU of --budget bytes, or auto: the "
                        "first GPU ggml reports, else the CPU (default: auto)")
    parser.add_argument("--parallel", type=int, default=LoadOptions.parallel, metavar="N",
                        help="generations sharing the target's passes, as `serve --parallel N`: "
                        "the KV cache holds N contexts (default: %(default)s)")
    parser.add_argument("--json", action="store_true",
                        help="print the plan as JSON (default: a table)")
    parser.set_defaults(func=handler)


def _device(kind: str, budget: int | None) -> Device:
    if kind == "gpu":
        if budget is None:
            raise InvalidParameterError("--device gpu needs --budget (the GPU's free memory), "
                                        "e.g. --budget 8GiB.")
        return Device("GPU", budget, "gpu")
    if kind == "cpu":
        return choose_device([], budget)  # no GPU in the list: the CPU with RAM or --budget
    return default_device(budget)  # auto: the first GPU ggml reports, else the CPU


def make_plan(args: argparse.Namespace) -> tuple[str, Plan]:
    """Resolve the pair/models (no downloads) and run the planner; returns (label, plan)."""
    registry = load_registry()
    name = pair_name(args)
    pair = registry.pair(name) if name or not args.target else None
    target = args.target or (pair.target if pair else "")
    drafter = args.draft or (str(pair.drafter) if pair else "auto")
    n_ctx = args.ctx or (pair.n_ctx if pair else DEFAULT_N_CTX)
    device = _device(args.device, parse_size(args.budget) if args.budget else None)
    target_path = registry.resolve_model(target, download=False)
    draft = resolved_drafter(registry.resolve_drafter(drafter, download=False), str(target_path))
    n_seq = checked_parallel(args.parallel)
    rpc = args.rpc if args.rpc is not None else (pair.rpc if pair else ())
    plan = plan_from_files(target_path, draft.path, n_ctx, None, args.kv_type, device=device,
                           fast_head=not args.llama_head, n_seq=n_seq,
                           mtp=draft.kind == "mtp", snapshots=draft.kind != "none",
                           widened=widened_types(exact=False, fast_body=not args.llama_body,
                                                 rpc=bool(rpc), gpu_backend=has_gpu_backend()),
                           draft_widened=draft_widened_types(draft, fast_body=not args.llama_body,
                                                             gpu_backend=has_gpu_backend()))
    plan = spread(plan, target_path, remote_devices(rpc) if rpc else (),
                  fast_head=not args.llama_head)
    label = pair.name if pair and not (args.target or args.draft) else f"{target} + {drafter}"
    return label, plan


def handler(args: argparse.Namespace) -> int:
    label, plan = make_plan(args)
    if args.json:
        print(json.dumps({"pair": label, **plan.to_dict()}, indent=2))
    else:
        print(f"Pair: {label}")
        print(plan.explain())
    return 0 if plan.fits else 1
