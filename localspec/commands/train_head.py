"""`localspec train-head`: train an EAGLE-3 head for a GGUF target on the user's own text
(localspec/train, docs/train-head.md). Needs the `train` extra (torch); nothing here imports
torch before the arguments have been checked."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from localspec.errors import InvalidParameterError
from localspec.train.params import OUTTYPES, TrainHeadParams

_DEFAULTS = TrainHeadParams(target="", data=(), out="")


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "train-head",
        help="train an EAGLE-3 head for a GGUF target on your text (needs localspec[train])",
        description="Collect the target's hidden states over your text (and, with "
        "--self-distill, its own continuations), choose a draft vocabulary, train an EAGLE-3 "
        "head with the training-time unroll, write it as GGUF and evaluate it on held-back "
        "text through localspec's drafter. Each step resumes from OUT.cache/ (--resume).",
    )
    parser.add_argument("--target", required=True, help="the target GGUF (a path or models.toml "
                        "name) the head will draft for (required)")
    parser.add_argument("--data", required=True, nargs="+", metavar="FILE",
                        help="text files, or JSONL with {\"text\"}, {\"prompt\"}, {\"messages\"} "
                        "or {\"turns\"} lines (required)")
    parser.add_argument("--out", required=True, help="the head GGUF to write (required)")
    parser.add_argument("--draft-vocab", type=int, default=_DEFAULTS.draft_vocab,
                        help="draft vocabulary size: the most frequent target tokens "
                        "(default: %(default)s)")
    parser.add_argument("--tokens", type=int, default=_DEFAULTS.tokens,
                        help="training tokens to collect at most (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=None,
                        help="optimizer steps (default: about two passes over the data)")
    parser.add_argument("--self-distill", action="store_true",
                        help="train also on the target's own continuations of the data's prompts "
                        "(default: off)")
    parser.add_argument("--resume", action="store_true",
                        help="continue an interrupted run from OUT.cache/ (default: off)")
    parser.add_argument("--outtype", choices=OUTTYPES, default=_DEFAULTS.outtype,
                        help="weight type of the written head; q8_0 is about half of f16 "
                        "(default: %(default)s)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="CPU threads (default: all cores, %(default)s)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from localspec.models import registry
    from localspec.runtime.loading import check_model_path
    from localspec.train.pipeline import run as run_pipeline

    out = Path(args.out)
    if not out.parent.is_dir():
        raise InvalidParameterError(f"The output directory {out.parent} does not exist.")
    target = str(registry.resolve_model(args.target))
    check_model_path(target, "target")
    params = TrainHeadParams(
        target=target, data=tuple(args.data), out=str(out), draft_vocab=args.draft_vocab,
        tokens=args.tokens, steps=args.steps, self_distill=args.self_distill,
        resume=args.resume, outtype=args.outtype, n_threads=args.threads)
    report = run_pipeline(params, say, progress_bar)
    print(f"wrote {out}: {report.tokens} tokens, {report.steps} steps (unroll depth "
          f"{report.depth}), loss {report.first_loss:.3f} -> {report.last_loss:.3f}; "
          "wall time by step: " + ", ".join(f"{k} {v:.0f} s" for k, v in report.seconds.items()))
    return 0


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@contextmanager
def progress_bar(name: str) -> Iterator[Callable[[int, int], None]]:
    """A rich progress bar on stderr for one step: yields update(done, total)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    with Progress(f"{name:<12}", BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=Console(stderr=True), transient=False) as progress:
        task = progress.add_task(name, total=None)

        def update(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        yield update
