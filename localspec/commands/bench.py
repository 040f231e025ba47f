"""`localspec bench`: plain vs speculative on the same prompts and lengths, in one process."""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from localspec.bench.report import summarize
from localspec.bench.runner import run_comparison
from localspec.bench.table import print_report
from localspec.commands.common import add_model_arguments, choose_models, draft_max_arg, load_engine
from localspec.errors import InvalidParameterError
from localspec.prompts import load_prompts
from localspec.types import GenerationParams


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "bench",
        help="compare plain and speculative decoding on the same prompts",
        description="Runs plain decoding and speculation on the same prompts with the same output "
        "length (end-of-generation ignored) in one process, and reports the ratios.",
    )
    add_model_arguments(parser, pair_option=True)
    parser.add_argument("--prompts", help="JSONL prompt file (default: the built-in set)")
    parser.add_argument("--categories", help="comma-separated categories to run")
    parser.add_argument("--limit", type=int, default=None, help="prompts per category")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--draft-max", type=draft_max_arg, default="auto")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--per-prompt", action="store_true", help="also print one row per prompt")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--plot", help="write a PNG (speedup per category, accepted lengths)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.repeat < 1:
        raise InvalidParameterError(f"--repeat {args.repeat} is invalid: use 1 or more.")
    categories = args.categories.split(",") if args.categories else None
    prompts = load_prompts(args.prompts, categories=categories, limit_per_category=args.limit)
    params = GenerationParams(max_tokens=args.max_tokens, temperature=args.temperature,
                              draft_max=args.draft_max, seed=0)
    params.validate()
    choice = choose_models(args)
    err = Console(stderr=True)
    with load_engine(args, choice) as engine, Progress(
        TextColumn("[progress.description]{task.description}"), BarColumn(),
        TextColumn("{task.completed}/{task.total}"), TimeRemainingColumn(), console=err,
        transient=True,
    ) as bar:
        task = bar.add_task("benchmarking", total=len(prompts) * args.repeat)
        runs = run_comparison(engine, prompts, params, repeat=args.repeat,
                              progress=lambda done, _total: bar.update(task, completed=done))
    report = summarize(runs)
    if args.plot:
        from localspec.bench.plot import write_plot

        write_plot(report, args.plot)
    if args.json:
        out = {"target": choice.target, "drafter": choice.drafter, "max_tokens": args.max_tokens,
               "temperature": args.temperature, "draft_max": args.draft_max, "repeat": args.repeat,
               **report.to_dict()}
        print(json.dumps(out))
    else:
        console = Console(width=max(Console().width, 132))
        console.print(f"target {choice.target} | drafter {choice.drafter} | "
                        f"{args.max_tokens} tokens | temperature {args.temperature} | "
                        f"draft {args.draft_max} | {args.repeat} repeat(s)")
        print_report(report, console, per_prompt=args.per_prompt)
    return 0 if report.overall.identical != "NO" or args.temperature > 0 else 1
