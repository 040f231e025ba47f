"""`localspec bench --modes default,exact` (or `local,rpc`): both modes in one run, interleaved,
each in its own process (localspec/bench/modes.py), reported one after the other and then
against each other: exact / default (rpc / local) tokens/s of the speculative and of the plain
arm, per category and overall.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from typing import Any

from rich.console import Console
from rich.table import Table

from localspec.bench.modes import MODE_PAIRS, ModeComparison, compare_modes, mode_options, run_modes
from localspec.bench.progress import LineProgress
from localspec.bench.prompts import Prompt
from localspec.bench.report import summarize
from localspec.bench.table import print_report
from localspec.commands.common import ModelChoice, choose_models, load_options, plan_choice
from localspec.errors import InvalidParameterError
from localspec.runtime.loading import LoadOptions
from localspec.types import GenerationParams

MODE_CHOICES = ("default", "exact", *(",".join(pair) for pair in MODE_PAIRS))


def check_modes(args: argparse.Namespace) -> bool:
    """Whether two modes run; checks the flags that do not combine with that."""
    if "," not in (args.modes or ""):
        if args.modes == "exact":
            args.exact = True
        return False
    for flag, given in (("--synthetic", args.synthetic), ("--clients", args.clients),
                        ("--baseline", args.baseline), ("--exact", args.exact),
                        ("--plot", args.plot)):
        if given:
            raise InvalidParameterError(
                f"--modes {args.modes} runs its own engines: leave out {flag}.")
    return True


def _mode_options(args: argparse.Namespace, choice: ModelChoice, mode: str) -> LoadOptions:
    if mode == "local":  # planned for this machine alone
        choice = replace(choice, rpc=())
    return mode_options(load_options(args, choice, plan_choice(args, choice)), mode)


def run_both(args: argparse.Namespace, prompts: list[Prompt], params: GenerationParams) -> int:
    choice = choose_models(args)
    names = args.modes.split(",")
    if "rpc" in names and not choice.rpc:
        raise InvalidParameterError(
            "--modes local,rpc compares RPC workers with this machine alone: name the workers "
            "with --rpc HOST:PORT[,HOST:PORT...] (or use a models.toml pair with rpc = [...]).")
    lines = LineProgress(sys.stderr)
    modes = run_modes({mode: _mode_options(args, choice, mode) for mode in names}, prompts,
                      params, args.repeat, progress=lines.update,
                      notice=lambda text: print(f"localspec: {text}", file=sys.stderr))
    comparison = compare_modes(modes[0].runs, modes[1].runs)
    reports = {m.mode: summarize(m.runs) for m in modes}
    header: dict[str, Any] = {"target": choice.target, "drafter": str(choice.drafter),
                              "max_tokens": args.max_tokens, "temperature": args.temperature,
                              "draft_max": params.draft_max, "repeat": args.repeat}
    results = {**header, "modes": {m.mode: {**m.heads, **reports[m.mode].to_dict()}
                                   for m in modes},
               f"{names[1]}_vs_{names[0]}": comparison.to_dict()}
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
        print_comparison(names, comparison, console)
        speedups = ", ".join(f"{m.mode} {reports[m.mode].overall.speedup:.2f}x" for m in modes)
        console.print(f"speculative speedup over plain decoding: {speedups}")
    broken = any(m.heads.get("rows_differing") for m in modes)
    failed = params.temperature == 0 and any(r.overall.identical == "NO" for r in reports.values())
    return 1 if broken or failed else 0


def print_comparison(names: list[str], comparison: ModeComparison, console: Console) -> None:
    table = Table(title=f"{names[1]} mode / {names[0]} mode, tokens/s (repeats paired across "
                  "the modes)", title_justify="left")
    same = comparison.same_passes
    columns = ("", "speculative", "spread", "plain", "spread", *(("same passes",) if same else ()))
    for column in columns:
        table.add_column(column, justify="right" if column else "left")
    spec, plain = comparison.speculative, comparison.plain
    for s, p in zip(spec.categories + [spec.overall], plain.categories + [plain.overall],
                    strict=True):
        cells = [s.label, f"{s.speedup:.3f}x", f"±{s.speedup_spread:.1%}",
                 f"{p.speedup:.3f}x", f"±{p.speedup_spread:.1%}"]
        if same:
            cells.append(f"{same[s.label]:.3f}x" if s.label in same else "-")
        table.add_row(*cells)
    console.print(table)
    if spec.worst is not None:
        console.print(f"worst category (speculative): {spec.worst.category} "
                      f"{spec.worst.category_speedup:.3f}x")
    if same:
        skipped = comparison.same_passes_skipped
        console.print("same passes: each mode replayed both modes' first speculative run (same "
                      "tokens, same rows per pass, prefill left out; the median of one replay "
                      "per repeat), speed "
                      + f"{names[1]} / {names[0]}"
                      + (f"; {skipped} prompt(s) without a replay" if skipped else ""))
