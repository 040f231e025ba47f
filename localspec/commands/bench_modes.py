"""`localspec bench --modes default,exact`: both modes in one run, interleaved, each in its own
process (localspec/bench/modes.py), reported one after the other and then against each other:
exact / default tokens/s of the speculative and of the plain arm, per category and overall.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from localspec.bench.modes import ModeComparison, compare_modes, run_modes
from localspec.bench.progress import LineProgress
from localspec.bench.report import summarize
from localspec.bench.table import print_report
from localspec.commands.common import choose_models, load_options, plan_choice
from localspec.errors import InvalidParameterError
from localspec.prompts import Prompt
from localspec.types import GenerationParams

MODE_CHOICES = ("default", "exact", "default,exact")


def check_modes(args: argparse.Namespace) -> bool:
    """Whether both modes run; checks the flags that do not combine with that."""
    if args.modes != "default,exact":
        if args.modes == "exact":
            args.exact = True
        return False
    for flag, given in (("--synthetic", args.synthetic), ("--clients", args.clients),
                        ("--baseline", args.baseline), ("--exact", args.exact),
                        ("--plot", args.plot)):
        if given:
            raise InvalidParameterError(
                f"--modes default,exact runs its own engines: leave out {flag}.")
    return True


def run_both(args: argparse.Namespace, prompts: list[Prompt], params: GenerationParams) -> int:
    choice = choose_models(args)
    options = load_options(args, choice, plan_choice(args, choice))
    lines = LineProgress(sys.stderr)
    modes = run_modes(options, prompts, params, args.repeat, progress=lines.update,
                      notice=lambda text: print(f"localspec: {text}", file=sys.stderr))
    comparison = compare_modes(modes[0].runs, modes[1].runs)
    reports = {m.mode: summarize(m.runs) for m in modes}
    header: dict[str, Any] = {"target": choice.target, "drafter": str(choice.drafter),
                              "max_tokens": args.max_tokens, "temperature": args.temperature,
                              "draft_max": params.draft_max, "repeat": args.repeat}
    results = {**header, "modes": {m.mode: {**m.heads, **reports[m.mode].to_dict()}
                                   for m in modes},
               "exact_vs_default": comparison.to_dict()}
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(results, f)
    if args.json:
        print(json.dumps(results))
    else:
        console = Console(width=100)
        for m in modes:
            console.print(f"\n[bold]{m.mode} mode[/bold] | target {choice.target} | drafter "
                          f"{choice.drafter} | target head {m.heads['verify_head']} | "
                          f"{args.max_tokens} tokens | {args.repeat} repeat(s)")
            print_report(reports[m.mode], console, per_prompt=args.per_prompt)
        print_comparison(comparison, console)
    broken = any(m.heads.get("rows_differing") for m in modes)
    failed = params.temperature == 0 and any(r.overall.identical == "NO" for r in reports.values())
    return 1 if broken or failed else 0


def print_comparison(comparison: ModeComparison, console: Console) -> None:
    table = Table(title="exact mode / default mode, tokens/s (repeats paired across the modes)",
                  title_justify="left")
    for column in ("", "speculative", "spread", "plain", "spread"):
        table.add_column(column, justify="right" if column else "left")
    spec, plain = comparison.speculative, comparison.plain
    for s, p in zip(spec.categories + [spec.overall], plain.categories + [plain.overall],
                    strict=True):
        table.add_row(s.label, f"{s.speedup:.3f}x", f"±{s.speedup_spread:.1%}",
                      f"{p.speedup:.3f}x", f"±{p.speedup_spread:.1%}")
    console.print(table)
    if spec.worst is not None:
        console.print(f"worst category (speculative): {spec.worst.category} "
                      f"{spec.worst.category_speedup:.3f}x")
