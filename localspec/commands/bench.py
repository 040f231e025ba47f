"""`localspec bench`: plain vs speculative on the same prompts and lengths, in one process.

``--baseline llama-cpp-python`` adds llama-cpp-python's plain and prompt-lookup generation on
the same prompts (in a child process); ``--synthetic`` benchmarks a generated target/draft
pair with a fixed draft length and prints the theoretical speed limit. See docs/bench.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from localspec.bench.baseline import BASELINES, Baseline, run_baseline
from localspec.bench.ceiling import Ceiling, engine_lookup, measure_pass_costs, ngram_ceiling
from localspec.bench.coverage import head_coverage
from localspec.bench.llama_speculative import (
    SpecPrompt,
    SpeculativeBaseline,
    run_llama_speculative,
)
from localspec.bench.output import check_outputs, results_path, write_results
from localspec.bench.progress import LineProgress, work_line
from localspec.bench.prompts import Prompt, load_prompts
from localspec.bench.report import Report, summarize
from localspec.bench.runner import PromptRun, engine_header, run_comparison
from localspec.bench.synthetic_mode import (
    SyntheticSpec,
    TheoryRow,
    check_draft_max,
    theory_rows,
    write_synthetic_pair,
)
from localspec.bench.table import (
    print_baseline,
    print_ceiling,
    print_llama_speculative,
    print_report,
    print_serving,
    print_theory,
)
from localspec.commands.bench_modes import MODE_CHOICES, check_modes, run_both
from localspec.commands.common import (
    ModelChoice,
    add_draft_max_argument,
    add_model_arguments,
    choose_models,
    load_engine,
)
from localspec.commands.serve import DEFAULT_PARALLEL
from localspec.commands.shaping import add_shaping_arguments, shaping_fields
from localspec.drafter_spec import DrafterSpec
from localspec.errors import InvalidParameterError
from localspec.runtime.convert import longest_draft
from localspec.runtime.engine import Engine
from localspec.runtime.learned import restore_saved
from localspec.runtime.loading import DEFAULT_N_CTX
from localspec.text.chat_template import chat_format, render_chat, rendered_tokens
from localspec.types import DraftMax, GenerationParams

SYNTHETIC_DRAFT_MAX = 4
SYNTHETIC_LIMIT = 2  # prompts per category in --synthetic mode unless --limit is given


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "bench",
        help="compare plain and speculative decoding on the same prompts",
        description="Runs plain decoding and speculation on the same prompts with the same output "
        "length (end-of-generation ignored) in one process, and reports the ratios.",
    )
    add_model_arguments(parser)
    parser.add_argument("--prompts", help="JSONL prompt file, or the name of a built-in set: "
                        "'builtin' (default), 'adversarial' (little to copy from) or "
                        "'structured' (fields extracted into a JSON Schema, constrained in both "
                        "arms)")
    parser.add_argument("--categories", help="comma-separated categories to run (default: all)")
    parser.add_argument("--chat", action="store_true",
                        help="send each prompt as one user turn through the model's chat "
                        "template, as an instruct model is used (default: the raw text)")
    parser.add_argument("--limit", type=int, default=None,
                        help="prompts per category (default: all; 2 with --synthetic)")
    parser.add_argument("--max-tokens", type=int, default=128,
                        help="tokens generated per run, end-of-generation ignored (default: "
                        "%(default)s)")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="sampling temperature, 0: greedy (default: %(default)s)")
    add_draft_max_argument(parser, f"auto; {SYNTHETIC_DRAFT_MAX} with --synthetic")
    parser.add_argument("--repeat", type=int, default=3,
                        help="interleaved repeats of every arm per prompt (default %(default)s)")
    parser.add_argument("--saved-stats", action="store_true",
                        help="start the controller from the statistics `localspec run` saved for "
                        "this pair (default: from nothing, so runs do not depend on history)")
    parser.add_argument("--per-prompt", action="store_true",
                        help="also print one row per prompt (default: per "
                        "category)")
    parser.add_argument("--json", action="store_true",
                        help="print the report as JSON (default: tables)")
    parser.add_argument("--out", help="also write the JSON results to this file (before "
                        "--plot; default: none)")
    parser.add_argument("--plot", help="write a PNG (speedup per category, accepted lengths); "
                        "needs localspec[plot]; the JSON results go next to it unless --out; "
                        "default: "
                        "none)")
    parser.add_argument("--modes", choices=MODE_CHOICES, default=None, metavar="MODES",
                        help="'default,exact' runs both modes interleaved, each in its own "
                        "process, and reports exact / default (docs/exact.md); 'local,rpc' "
                        "the same for this machine alone and with the --rpc workers "
                        "(docs/rpc.md); 'llama-body,default' llama.cpp's kernels for the "
                        "body's matrices against localspec's (docs/bench.md); one "
                        "of: " + " | ".join(MODE_CHOICES) + " (default: the mode --exact picks)")
    parser.add_argument("--baseline", type=_baselines, metavar="NAMES",
                        help="also run llama-cpp-python's plain and prompt-lookup generation "
                        "('llama-cpp-python'), llama.cpp's llama-speculative-simple with the "
                        "draft model and ngram-mod ('llama-speculative', built by "
                        "scripts/llama_speculative_build.py), or both, comma-separated "
                        "(default: none)")
    parser.add_argument("--baseline-num-pred-tokens", type=int, default=None,
                        help="tokens per prompt-lookup draft in the baseline (default: 2 on a "
                        "CPU-only build, 10 with GPU offload, as llama-cpp-python advises)")
    add_shaping_arguments(parser, structured=False)
    serving = parser.add_argument_group("batched serving (--clients)")
    serving.add_argument("--clients", default=None, metavar="LIST",
                         help="measure `localspec serve` with this many concurrent streaming "
                         "clients (e.g. 1,2,4,8), --parallel 1 against --parallel N; each "
                         "round --repeat times (default: off, the prompt-by-prompt bench)")
    serving.add_argument("--parallel", type=int, default=DEFAULT_PARALLEL, metavar="N",
                         help="the batched server's --parallel (default: %(default)s)")
    synthetic = parser.add_argument_group("synthetic pair (--synthetic)")
    synthetic.add_argument("--synthetic", action="store_true",
                           help="benchmark a generated target/draft pair against the theory "
                           "(default: the named models)")
    synthetic.add_argument("--agreement-divergence", type=float, default=SyntheticSpec.divergence,
                           help="weight of the target's extra blocks (0: draft always agrees; "
                           "default %(default)s)")
    synthetic.add_argument("--extra-layers", type=int, default=SyntheticSpec.extra_layers,
                           help="blocks the target has beyond the draft's (default %(default)s)")
    synthetic.add_argument("--synthetic-layers", type=int, default=SyntheticSpec.n_layer,
                           help="the draft's blocks (default %(default)s)")
    synthetic.add_argument("--synthetic-embd", type=int, default=SyntheticSpec.n_embd,
                           help="model width, a multiple of 32 (default %(default)s)")
    parser.set_defaults(func=run)


@dataclass
class Outcome:
    """Everything one bench run measured."""

    runs: list[PromptRun]
    report: Report
    baseline: Baseline | None = None
    llama_speculative: SpeculativeBaseline | None = None
    theory: list[TheoryRow] | None = None
    ceiling: Ceiling | None = None  # n-gram drafts at temperature 0 only
    coverage: dict[str, float] | None = None  # an EAGLE-3 head's draft vocabulary, per category


def _draft_max(args: argparse.Namespace) -> DraftMax:
    if args.synthetic:
        if args.target or args.draft or args.pair:
            raise InvalidParameterError(
                "--synthetic generates its own pair: leave out --target, --draft and --pair.")
        return check_draft_max(SYNTHETIC_DRAFT_MAX if args.draft_max is None else args.draft_max)
    return GenerationParams.draft_max if args.draft_max is None else args.draft_max


def _synthetic_spec(args: argparse.Namespace) -> SyntheticSpec:
    spec = SyntheticSpec(divergence=args.agreement_divergence, extra_layers=args.extra_layers,
                         n_embd=args.synthetic_embd, n_layer=args.synthetic_layers)
    spec.validate()
    return spec


@dataclass
class Measured:
    """What the engine measured before it closes."""

    runs: list[PromptRun]
    prompt_tokens: dict[str, list[int]]  # for the baseline
    pass_costs: list[float] | None  # for the n-gram ceiling (n-gram drafts, greedy)


def _chat_prompts(engine: Engine, choice: ModelChoice, prompts: list[Prompt]) -> list[Prompt]:
    """Each prompt as one user turn through the chat template (the pair's, else the GGUF's)."""
    form = chat_format(engine.info.chat_template, choice.chat_template, choice.stop)
    def rendered(p: Prompt) -> Prompt:
        turn = [{"role": "user", "content": p.text}]
        text = render_chat(form.template, turn, bos_token=engine.info.bos_text,
                           eos_token=engine.info.eos_text)
        return replace(p, tokens=tuple(rendered_tokens(text, engine.info, engine.tokenize)),
                       rendered=text)

    return [rendered(p) for p in prompts]


def _ceiling_k_max(drafter: DrafterSpec, params: GenerationParams) -> int | None:
    """The longest draft the n-gram ceiling replays, or None when it does not apply."""
    if drafter.kind != "ngram" or params.temperature != 0:
        return None
    return longest_draft(params.draft_max)


@contextlib.contextmanager
def _progress(label: str, description: str, unit: str = "prompt runs"
              ) -> Iterator[Callable[[int, int], None]]:
    """A ``progress(done, total)`` callback: a live bar on a terminal, else lines with an ETA
    (a log file or CI), prefixed with ``label``."""
    err = Console(stderr=True)
    if not err.is_terminal:
        yield LineProgress(sys.stderr, label=label, unit=unit).update
        return
    with Progress(
        TextColumn("[progress.description]{task.description}"), BarColumn(),
        TextColumn("{task.completed}/{task.total}"), TimeRemainingColumn(), console=err,
        transient=True,
    ) as bar:
        task = bar.add_task(description, total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


def _measure(engine: Engine, prompts: list[Prompt], params: GenerationParams,
             args: argparse.Namespace, drafter: DrafterSpec) -> Measured:
    err = Console(stderr=True)
    print(work_line("bench", len(prompts), args.repeat, params.max_tokens), file=sys.stderr,
          flush=True)
    with _progress("bench", "benchmarking") as progress:
        runs = run_comparison(engine, prompts, params, repeat=args.repeat, progress=progress)
    k_max = _ceiling_k_max(drafter, params)
    costs = None
    if k_max is not None and runs:
        with err.status("timing verification passes for the n-gram ceiling"):
            costs = measure_pass_costs(engine, runs, k_max)
    return Measured(runs, {r.prompt.id: r.prompt_tokens for r in runs}, costs)


def _outcome(args: argparse.Namespace, target: str, measured: Measured,
             params: GenerationParams, draft_model: str | None = None) -> Outcome:
    """Summaries; the baseline runs here, after localspec's engine has been closed.
    ``draft_model``: the drafter's model file, for llama.cpp's draft-model arm."""
    runs = measured.runs
    report = summarize(runs)
    outcome = Outcome(runs, report, theory=theory_rows(runs) if args.synthetic else None)
    if measured.pass_costs is not None:
        k_max = len(measured.pass_costs) - 2
        outcome.ceiling = ngram_ceiling(runs, report, engine_lookup(), k_max, measured.pass_costs)
    baselines = args.baseline or []
    n_threads = args.threads or os.cpu_count() or 1
    if "llama-cpp-python" in baselines:
        with _progress("baseline llama-cpp-python", "llama-cpp-python baseline",
                       "runs") as progress:
            outcome.baseline = run_baseline(
                target, runs, measured.prompt_tokens, report, max_tokens=args.max_tokens,
                repeat=args.repeat, n_threads=n_threads,
                num_pred_tokens=args.baseline_num_pred_tokens, progress=progress,
            )
    if "llama-speculative" in baselines:
        also = outcome.baseline.best_tps() if outcome.baseline is not None else {}
        prompts = [SpecPrompt(r.prompt.id, r.prompt.category, r.prompt.rendered or r.prompt.text,
                              len(r.prompt_tokens)) for r in runs]
        with _progress("baseline llama-speculative-simple",
                       "llama.cpp's llama-speculative-simple", "runs") as progress:
            outcome.llama_speculative = run_llama_speculative(
                target, draft_model, prompts, report, max_tokens=args.max_tokens,
                repeat=args.repeat, n_threads=n_threads, also=also, progress=progress)
    return outcome


def _baselines(text: str) -> list[str]:
    """``--baseline``: one or more of BASELINES, comma-separated."""
    names = [name.strip() for name in text.split(",")]
    for name in names:
        if name not in BASELINES:
            raise argparse.ArgumentTypeError(f"{name!r} is not a baseline: use "
                                             f"{' or '.join(BASELINES)}, or both with a comma")
    return names


def run(args: argparse.Namespace) -> int:
    if args.repeat < 1:
        raise InvalidParameterError(f"--repeat {args.repeat} is invalid: use 1 or more.")
    if args.baseline_num_pred_tokens is not None and args.baseline_num_pred_tokens < 1:
        raise InvalidParameterError(f"--baseline-num-pred-tokens {args.baseline_num_pred_tokens} "
                                    "is invalid: use 1 or more.")
    if args.baseline and args.temperature > 0:
        raise InvalidParameterError("--baseline compares greedy decoding: use --temperature 0.")
    check_outputs(args.out, args.plot)  # before anything runs: a run is never lost to them
    draft_max = _draft_max(args)
    categories = args.categories.split(",") if args.categories else None
    limit = args.limit if args.limit is not None or not args.synthetic else SYNTHETIC_LIMIT
    prompts = load_prompts(args.prompts, categories=categories, limit_per_category=limit)
    params = GenerationParams(max_tokens=args.max_tokens, temperature=args.temperature,
                              draft_max=draft_max, seed=0, **shaping_fields(args))
    params.validate()
    if args.chat and (args.synthetic or args.clients or check_modes(args)):
        raise InvalidParameterError("--chat applies to one engine's run: leave out --synthetic, "
                                    "--clients and --modes.")
    if check_modes(args):
        return run_both(args, prompts, params)
    if args.clients:
        return _run_serving(args, prompts, params)
    if args.synthetic:
        spec = _synthetic_spec(args)
        with tempfile.TemporaryDirectory(prefix="localspec-synthetic-") as tmp:
            target, draft = write_synthetic_pair(tmp, spec)
            with Engine.load(target, draft=draft, n_ctx=args.ctx or DEFAULT_N_CTX,
                             n_threads=args.threads, draft_p_min=0.0,
                             fast_head=not args.llama_head, fast_body=not args.llama_body,
                             kv_type=args.kv_type, repack=not args.no_repack,
                             exact=args.exact, verbose=args.verbose) as engine:
                measured = _measure(engine, prompts, params, args, engine.info.drafter_spec)
                heads = engine_header(engine, measured.runs)
            outcome = _outcome(args, str(target), measured, params)
        header: dict[str, Any] = {"target": "synthetic", "drafter": "synthetic",
                                  "synthetic": asdict(spec), "saved_stats_used": False}
    else:
        choice = choose_models(args)
        with load_engine(args, choice) as engine:
            args.threads = engine.options.n_threads  # the baseline runs with the same count
            saved = restore_saved(engine) if args.saved_stats else None
            if args.chat:
                prompts = _chat_prompts(engine, choice, prompts)
            measured = _measure(engine, prompts, params, args, choice.drafter)
            heads = engine_header(engine, measured.runs)
        outcome = _outcome(args, choice.target, measured, params, draft_model=(
            choice.drafter.path if choice.drafter.kind in ("model", "hybrid") else None))
        outcome.coverage = head_coverage(choice.drafter, measured.runs)
        header = {"target": choice.target, "drafter": str(choice.drafter), "chat": args.chat,
                  "prompt_tokens": {r.prompt.id: len(r.prompt_tokens) for r in measured.runs},
                  "saved_stats_used": saved is not None,
                  "saved_stats_note": saved.note() if saved else None}
    header.update(heads)
    header.update(max_tokens=args.max_tokens,
                  temperature=args.temperature, draft_max=draft_max, repeat=args.repeat,
                  repeat_penalty=params.repeat_penalty, frequency_penalty=params.frequency_penalty,
                  presence_penalty=params.presence_penalty, penalty_last_n=params.penalty_last_n)
    _show(args, header, outcome)
    if header.get("rows_differing") or outcome.report.overall.valid == "NO":
        return 1  # exact mode broke its promise, or an output broke its JSON Schema
    return 0 if outcome.report.overall.identical != "NO" or args.temperature > 0 else 1


def _run_serving(args: argparse.Namespace, prompts: list[Prompt], params: GenerationParams) -> int:
    from localspec.bench.serving import parse_clients, rounds_table, run_serving

    clients = parse_clients(args.clients)
    model_args = [flag for name, flag in (("pair", "--pair"), ("target", "--target"),
                                          ("draft", "--draft"), ("ctx", "--ctx"),
                                          ("threads", "--threads"), ("kv_type", "--kv-type"))
                  for flag in ([flag, str(getattr(args, name))] if getattr(args, name) else [])]
    with Console(stderr=True).status("serving the prompts to --parallel 1, then "
                                     f"--parallel {args.parallel}"):
        rounds = run_serving(model_args, prompts, params, clients, args.parallel, args.repeat)
    rows = rounds_table(rounds, args.parallel)
    if args.json:
        print(json.dumps({"max_tokens": args.max_tokens, "temperature": args.temperature,
                          "parallel": args.parallel, "repeat": args.repeat, "rows": rows}))
        return 0
    print_serving(rows, args.parallel, Console(width=120))
    return 0


def _invariance_note(header: dict[str, Any]) -> str:
    if "rows_differing" not in header:
        return ""
    rows = header["rows_differing"]
    return (" (passes of 1-16 rows: bit-identical)" if not rows
            else f" (BUG: passes of {rows} rows differ from single-token passes)")


def _results(header: dict[str, Any], outcome: Outcome) -> dict[str, Any]:
    out = {**header, **outcome.report.to_dict()}
    if outcome.baseline is not None:
        out["baseline"] = outcome.baseline.to_dict()
    if outcome.llama_speculative is not None:
        out["llama_speculative"] = outcome.llama_speculative.to_dict()
    if outcome.theory is not None:
        out["theory"] = [row.to_dict() for row in outcome.theory]
    if outcome.ceiling is not None:
        out["ngram_ceiling"] = outcome.ceiling.to_dict()
    if outcome.coverage is not None:
        out["draft_vocab_coverage"] = outcome.coverage
    return out


def _show(args: argparse.Namespace, header: dict[str, Any], outcome: Outcome) -> None:
    results = _results(header, outcome)
    path = results_path(args.out, args.plot)
    if path is not None:  # first: nothing after this can lose the run
        write_results(path, results)
        print(f"localspec: results written to {path}", file=sys.stderr)
    if args.plot:
        from localspec.bench.plot import write_plot

        write_plot(outcome.report, args.plot, header, results_file=path)
    if args.json:
        print(json.dumps(results))
        return
    console = Console(width=100)  # the main table fits in 100 columns
    wide = Console(width=max(Console().width, 140))
    console.print(f"target {header['target']} | drafter {header['drafter']} | "
                  f"mode {header['mode']}{_invariance_note(header)} | "
                  f"target head {header['verify_head']}"
                  + (f" | draft head {header['draft_head']}" if header["draft_head"] else "")
                  + f" | {header['max_tokens']} tokens | "
                  f"temperature {header['temperature']} | draft {header['draft_max']} | "
                  f"{header['repeat']} repeat(s) | penalties: repeat {header['repeat_penalty']}, "
                  f"frequency {header['frequency_penalty']}, presence {header['presence_penalty']}"
                  " | " + (header.get("saved_stats_note") or "saved stats not used"))
    print_report(outcome.report, console, per_prompt=args.per_prompt)
    if outcome.coverage is not None:
        console.print("draft-vocabulary coverage of the plain outputs (share of the target's "
                      "tokens the head can draft): " + " | ".join(
                          f"{name} {share:.0%}" for name, share in outcome.coverage.items()))
    if outcome.theory is not None:
        print_theory(outcome.theory, wide)
    if outcome.ceiling is not None:
        print_ceiling(outcome.ceiling, wide)
    if outcome.baseline is not None:
        print_baseline(outcome.baseline, wide, drafter=header["drafter"])
    if outcome.llama_speculative is not None:
        print_llama_speculative(outcome.llama_speculative, wide)
